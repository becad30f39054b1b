"""A small synchronous client of Skyscan's REST interface: one method per route.

    from skyscan_client.client import Client, SkyscanError

    with Client() as skyscan:                      # SKYSCAN_URL/SKYSCAN_TOKEN, else .skyscan/env
        scan_id = skyscan.launch({...})["scan_id"]
        for event in skyscan.events(scan_id):      # Server-Sent Events, else polling
            print(event.state)
        result = skyscan.result(scan_id)

A non-2xx answer raises `SkyscanError` (the HTTP status and the interface's Error body); a service
that does not answer raises `Unreachable`; no URL or token to be found, `config.ConfigError`.
Only requests that are safe to repeat are retried: reads, `PUT` of a result and the soft delete, on a
connection error or a 502/503/504, a bounded number of times with growing, jittered pauses; any
request whose connection could not even be opened is retried too, since nothing reached the server.
Redirects to a replacing scan are followed.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Iterator, Sequence
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import httpx
import tenacity

from skyscan_client import config
from skyscan_client.events import ScanEvent, SseMessage, parse_sse
from skyscan_client.types import (
    AddedWorkers,
    ErrorBody,
    Json,
    Logs,
    ManifestAndResult,
    Result,
    Status,
    WorkflowId,
)

RETRY_STATUSES = frozenset({502, 503, 504})
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout)  # the request never reached the server
NO_STREAM_STATUSES = frozenset({404, 405})  # a shim without the events route (or an unknown scan)
# Read-your-writes across shim replicas: a write answers with the Scan version it wrote, and every
# later request asks for at least the highest such version, so no replica answers from an older cache.
WRITTEN_HEADER, MIN_VERSION_HEADER = "Skyscan-Version", "Skyscan-Min-Version"
Projection = str | Sequence[str] | None


class SkyscanError(Exception):
    """The service answered with an error: its HTTP status and Error body."""

    def __init__(self, status: int, error: str, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {error}: {reason}")
        self.status, self.error, self.reason, self.message = status, error, reason, message

    @property
    def body(self) -> ErrorBody:
        return {"error": self.error, "reason": self.reason, "message": self.message}

    @classmethod
    def from_response(cls, response: httpx.Response) -> SkyscanError:
        status = response.status_code
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:  # a status outside the standard's list
            phrase = str(status)
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and {"error", "reason", "message"} <= body.keys():
            return cls(status, str(body["error"]), str(body["reason"]), str(body["message"]))
        text = response.text.strip()[:300]  # not the service itself answering (a proxy, say)
        return cls(
            status, phrase, text or phrase, text or f"{response.request.method} {response.request.url}"
        )


class Unreachable(Exception):
    """No answer from the service (after the retries a request was allowed)."""


class _NoStream(Exception):
    """The events route is not there: follow by polling."""


class _StreamBroke(Exception):
    """The event stream ended before its `end` message."""


def _projection(value: Projection) -> str | list[str] | None:
    return value if value is None or isinstance(value, str) else list(value)


class Client:
    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        env_file: Path | None = None,
    ) -> None:
        found = config.resolve(base_url, token, env_file)
        self.base_url = found.base_url
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.written_version = 0  # the highest Scan version this client's writes made
        self._http = httpx.Client(
            base_url=found.base_url,
            headers={"Authorization": f"Bearer {found.token}", "Accept": "application/json"},
            timeout=timeout,
            follow_redirects=True,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the service -------------------------------------------------------------------------------

    def root(self) -> Json:
        return cast(Json, self._call("GET", "/"))

    def openapi(self) -> Json:
        return cast(Json, self._call("GET", "/openapi.json"))

    # -- scans -------------------------------------------------------------------------------------

    def find(
        self, filter: Json, *, include_deleted: bool = False, projection: Projection = None
    ) -> list[Json]:
        """`POST /scans/find`: the manifests matching a MongoDB-style filter (a read: retried)."""
        body: Json = {"filter": filter, "include_deleted": include_deleted}
        if projection is not None:
            body["manifest_projection"] = _projection(projection)
        return cast(list[Json], self._call("POST", "/scans/find", json=body, idempotent=True)["manifests"])

    def backlog(self) -> list[Json]:
        return cast(list[Json], self._call("GET", "/scans/backlog")["entries"])

    def launch(self, request: Json) -> Json:
        """`POST /scan`: the new scan's manifest (never retried once sent: it would start two scans)."""
        return cast(Json, self._call("POST", "/scan", json=request, idempotent=False))

    def subscribe(
        self, url: str, states: list[str], *, scan_ids: list[str] | None = None,
        classifiers: Json | None = None, secret: str | None = None,
    ) -> Json:  # fmt: skip
        """`POST /subscriptions`: the new subscription (with the signing secret made for it when none is
        given: shown this once). Never retried once sent: it would make two."""
        body: Json = {
            "url": url,
            "states": states,
            "scan_ids": scan_ids or [],
            "classifiers": classifiers or {},
        }
        if secret is not None:
            body["secret"] = secret
        return cast(Json, self._call("POST", "/subscriptions", json=body, idempotent=False))

    def subscriptions(self) -> list[Json]:
        return cast(list[Json], self._call("GET", "/subscriptions")["subscriptions"])

    def unsubscribe(self, subscription_id: str) -> Json:
        return cast(Json, self._call("DELETE", f"/subscriptions/{subscription_id}"))

    def scan_request(self, scan_id: str) -> Json:
        return cast(Json, self._call("GET", f"/scan-request/{scan_id}"))

    def rescan(
        self,
        scan_id: str,
        *,
        replace: bool = False,
        abort_first: bool = False,
        no_redirect: bool = False,
        projection: Projection = None,
    ) -> Json:
        """`POST /scan/{id}/actions/rescan`: the new scan's manifest."""
        body: Json = {"replace_scan": replace, "abort_first": abort_first, "no_redirect": no_redirect}
        if projection is not None:
            body["manifest_projection"] = _projection(projection)
        return cast(Json, self._call("POST", f"/scan/{scan_id}/actions/rescan", json=body, idempotent=False))

    def add_workers(
        self, scan_id: str, cluster: str, n_workers: int, *, no_redirect: bool = False
    ) -> AddedWorkers:
        body = {"cluster_location": cluster, "n_workers": n_workers, "no_redirect": no_redirect}
        path = f"/scan/{scan_id}/actions/add-workers"
        return cast(AddedWorkers, self._call("POST", path, json=body, idempotent=False))

    def scan(
        self, scan_id: str, *, include_deleted: bool = False, no_redirect: bool = False
    ) -> ManifestAndResult:
        params = _flags(include_deleted=include_deleted, no_redirect=no_redirect)
        return cast(ManifestAndResult, self._call("GET", f"/scan/{scan_id}", params=params))

    def abort(
        self,
        scan_id: str,
        *,
        delete_completed_scan: bool = False,
        no_redirect: bool = False,
        projection: Projection = None,
    ) -> ManifestAndResult:
        """`DELETE /scan/{id}`: abort the scan and mark it deleted (a soft delete, so retried)."""
        body: Json = {"delete_completed_scan": delete_completed_scan, "no_redirect": no_redirect}
        if projection is not None:
            body["manifest_projection"] = _projection(projection)
        return cast(ManifestAndResult, self._call("DELETE", f"/scan/{scan_id}", json=body))

    def manifest(
        self,
        scan_id: str,
        *,
        projection: Projection = None,
        include_deleted: bool = False,
        no_redirect: bool = False,
    ) -> Json:
        params = _flags(include_deleted=include_deleted, no_redirect=no_redirect)
        if projection is not None:
            params["projection"] = projection if isinstance(projection, str) else "|".join(projection)
        return cast(Json, self._call("GET", f"/scan/{scan_id}/manifest", params=params))

    def patch_manifest(
        self,
        scan_id: str,
        *,
        progress: Json | None = None,
        event_metadata: Json | None = None,
        scan_metadata: Json | None = None,
    ) -> Json:
        """`PATCH /scan/{id}/manifest` (role system): the metadata are set once, so not retried."""
        body = {
            k: v
            for k, v in (
                ("progress", progress),
                ("event_metadata", event_metadata),
                ("scan_metadata", scan_metadata),
            )
            if v is not None
        }
        return cast(Json, self._call("PATCH", f"/scan/{scan_id}/manifest", json=body, idempotent=False))

    def sensor_event(self, scan_id: str) -> Json:
        return cast(Json, self._call("GET", f"/scan/{scan_id}/sensor-event")["sensor_event"])

    def result(self, scan_id: str, *, include_deleted: bool = False, no_redirect: bool = False) -> Result:
        """The stored result, `{}` while there is none."""
        params = _flags(include_deleted=include_deleted, no_redirect=no_redirect)
        return cast(Result, self._call("GET", f"/scan/{scan_id}/result", params=params))

    def put_result(self, scan_id: str, scan_result: Json, *, is_final: bool) -> Result:
        """`PUT /scan/{id}/result` (role system): storing the same result twice is harmless: retried."""
        body = {"scan_result": scan_result, "is_final": is_final}
        return cast(Result, self._call("PUT", f"/scan/{scan_id}/result", json=body))

    def status(self, scan_id: str, *, no_redirect: bool = False) -> Status:
        return cast(
            Status, self._call("GET", f"/scan/{scan_id}/status", params=_flags(no_redirect=no_redirect))
        )

    def logs(self, scan_id: str, *, no_redirect: bool = False) -> Logs:
        return cast(Logs, self._call("GET", f"/scan/{scan_id}/logs", params=_flags(no_redirect=no_redirect)))

    def scanner_log(self, scan_id: str, *, follow: bool = False) -> Iterator[bytes]:
        """The scanner server's log (`GET /scan/{id}/logs/scanner-server`) as it comes: the copy kept with
        the scan once its container ended, else the running container's; with `follow`, until it ends.
        A 502/503/504 before the log starts (its node unreachable for a moment) is tried again."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=None if follow else self._http.timeout.read)
        headers = {"Accept": "text/plain", **self._freshness()}
        for attempt in range(self.retries + 1):
            with self._http.stream(
                "GET", f"/scan/{scan_id}/logs/scanner-server", params=_flags(follow=follow), headers=headers,
                timeout=timeout,
            ) as response:  # fmt: skip
                if response.status_code in RETRY_STATUSES and attempt < self.retries:
                    time.sleep(self._delay(attempt, response.headers.get("Retry-After")))
                    continue
                if not response.is_success:
                    response.read()
                    raise SkyscanError.from_response(response)
                yield from response.iter_bytes()
                return

    # -- the WMS side --------------------------------------------------------------------------------

    def workflow_id(self, scan_id: str) -> WorkflowId:
        return cast(WorkflowId, self._call("GET", f"/scan/{scan_id}/wms/workflow-id"))

    def set_workflow_id(self, scan_id: str, workflow_id: str, wms_address: str) -> Json:
        """`POST /scan/{id}/wms/workflow-id` (role system): set once, so not retried."""
        body = {"workflow_id": workflow_id, "wms_address": wms_address}
        return cast(Json, self._call("POST", f"/scan/{scan_id}/wms/workflow-id", json=body, idempotent=False))

    def workforce(self, scan_id: str) -> Json:
        return cast(Json, self._call("GET", f"/scan/{scan_id}/wms/workforce"))

    def taskforces(self, scan_id: str) -> list[Json]:
        return cast(list[Json], self._call("GET", f"/scan/{scan_id}/wms/taskforces")["taskforces"])

    # -- following a scan ----------------------------------------------------------------------------

    def events(
        self, scan_id: str, *, poll_interval: float = 1.0, idle_timeout: float = 60.0
    ) -> Iterator[ScanEvent]:
        """Each change of the scan, from its current state until it is terminal.

        Reads `GET /scan/{id}/events`; a broken stream (or a 502/503/504) is reopened (it starts with
        the current state), up to `retries` times in a row. Without the route (404/405), or once the
        stream keeps breaking or the shim keeps refusing one (its cap on open streams),
        polls `GET /scan/{id}/status` and the manifest's progress every `poll_interval` seconds.
        `idle_timeout` bounds the silence on the stream (the server sends a keepalive every 15 s)."""
        last: ScanEvent | None = None
        breaks = 0
        while breaks <= self.retries:
            try:
                for event in self._stream(scan_id, idle_timeout):
                    breaks = 0
                    if not event.same_as(last):
                        last = event
                        yield event
                return
            except _NoStream:
                break
            except (_StreamBroke, httpx.TransportError):
                self._pause(breaks)
                breaks += 1
        yield from self._poll(scan_id, poll_interval, last)

    def _stream(self, scan_id: str, idle_timeout: float) -> Iterator[ScanEvent]:
        headers = {"Accept": "text/event-stream", **self._freshness()}
        timeout = httpx.Timeout(self._http.timeout.connect, read=idle_timeout)
        with self._http.stream(
            "GET", f"/scan/{scan_id}/events", headers=headers, timeout=timeout
        ) as response:
            if response.status_code in NO_STREAM_STATUSES:
                raise _NoStream
            if response.status_code in RETRY_STATUSES:  # a shim stopping, or at its stream cap
                raise _StreamBroke
            if response.status_code != 200:
                response.read()
                raise SkyscanError.from_response(response)
            message: SseMessage
            for message in parse_sse(response.iter_lines()):
                if message.event == "end":
                    return
                if message.event == "scan":
                    yield ScanEvent.from_stream(message)
        raise _StreamBroke

    def _poll(self, scan_id: str, interval: float, last: ScanEvent | None) -> Iterator[ScanEvent]:
        while True:
            status = self.status(scan_id)
            found = self.manifest(scan_id, projection=["scan_id", "progress"], include_deleted=True)
            event = ScanEvent.polled(str(found.get("scan_id", scan_id)), dict(status), found.get("progress"))
            if not event.same_as(last):
                last = event
                yield event
            if event.terminal:
                return
            time.sleep(interval)

    # -- plumbing ------------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        idempotent: bool | None = None,
    ) -> Any:
        """Send, retrying as the request allows (by default: everything but POST and PATCH): a request
        that never reached the server always, a repeatable one also on a broken connection or a
        502/503/504 answer; `retries` times at most, pausing as `_wait` says."""
        repeatable = method not in ("POST", "PATCH") if idempotent is None else idempotent

        def again(e: BaseException) -> bool:
            return isinstance(e, httpx.TransportError) and (repeatable or isinstance(e, UNSENT))

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(1 + self.retries),
            wait=self._wait,
            retry=tenacity.retry_if_exception(again)
            | tenacity.retry_if_result(lambda r: repeatable and r.status_code in RETRY_STATUSES),
            retry_error_callback=_last,
        )
        try:
            response: httpx.Response = retrying(
                self._http.request, method, path, params=params, json=json, headers=self._freshness()
            )
        except httpx.TransportError as e:
            raise Unreachable(f"{method} {self.base_url}{path}: {e!r}") from e
        if not response.is_success:
            raise SkyscanError.from_response(response)
        written = response.headers.get(WRITTEN_HEADER, "")
        if written.isdigit():
            self.written_version = max(self.written_version, int(written))
        return response.json() if response.content else {}

    def _freshness(self) -> dict[str, str]:
        return {MIN_VERSION_HEADER: str(self.written_version)} if self.written_version else {}

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """The pause after a failed try: the server's Retry-After if it answered with one."""
        outcome, retry_after = state.outcome, None
        if outcome is not None and not outcome.failed:
            retry_after = outcome.result().headers.get("Retry-After")
        return self._delay(state.attempt_number - 1, retry_after)

    def _pause(self, attempt: int) -> None:
        time.sleep(self._delay(attempt))

    def _delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Exponential backoff with jitter, or the server's Retry-After, never above `max_backoff`."""
        delay = self.backoff * 2.0**attempt * random.uniform(0.5, 1.0)
        if retry_after:
            delay = _retry_after_seconds(retry_after, delay)
        return min(delay, self.max_backoff)


def _last(state: tenacity.RetryCallState) -> Any:
    """Past the retries: the last answer, or the last error raised again."""
    assert state.outcome is not None
    return state.outcome.result()


def _retry_after_seconds(value: str, default: float) -> float:
    """Retry-After as seconds or an HTTP date; `default` when it is neither."""
    if value.strip().isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return default


def _flags(**flags: bool) -> dict[str, Any]:
    """Query flags: only those set (the service reads an absent flag as false)."""
    return {name: "true" for name, on in flags.items() if on}
