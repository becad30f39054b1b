"""Async EWMS client: the calls the operator makes, with timeouts, retries and optional OIDC auth.

Idempotent calls (reads, queries, deactivations) are retried with exponential backoff on connection
errors, 5xx, 408 and 429 (what `WMSUnavailable` means once the retries are spent; any other 4xx is a
refusal, `WMSError`). `POST /v1/workflows` is not: a lost answer could mean a created workflow, so the
caller recovers by looking the workflow up by its request marker (see `find_workflows_by_marker`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

import httpx
import tenacity

from skyscan import names
from skyscan_operator import metrics

log = logging.getLogger(__name__)

V1 = "/v1"


class WMSError(Exception):
    """The WMS refused a request (4xx other than 408 and 429), or could not serve it (`WMSUnavailable`)."""

    def __init__(self, method: str, path: str, status: int | None, detail: str) -> None:
        self.method, self.path, self.status, self.detail = method, path, status, detail
        where = f"{method} {path}"
        super().__init__(f"{where}: HTTP {status}: {detail}" if status else f"{where}: {detail}")


class WMSUnavailable(WMSError):
    """No answer, 5xx, 408 or 429 (or a refused token a fresh one did not cure), past the retries."""


# How a WMS refuses a bearer token: 401 by the book, 403 as EWMS answers an expired or revoked one.
TOKEN_REFUSED = (401, 403)


def retried(error: BaseException, idempotent: bool) -> bool:
    """Whether a failed try is tried again: a refused token (a fresh one is minted), a connection that
    never opened (nothing was sent), and, for an idempotent call, anything else `WMSUnavailable`."""
    if not isinstance(error, WMSUnavailable):
        return False
    return idempotent or error.status in TOKEN_REFUSED or isinstance(error.__cause__, httpx.ConnectError)


class TokenSource:
    """OIDC client-credentials tokens; the token endpoint is discovered from the issuer."""

    def __init__(self, http: httpx.AsyncClient, issuer: str, client_id: str, client_secret: str) -> None:
        self._http, self._issuer = http, issuer.rstrip("/")
        self._client_id, self._client_secret = client_id, client_secret
        self._endpoint: str | None = None
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:
            if self._token is None or time.time() > self._expires - 5:
                await self._mint()
            assert self._token is not None
            return self._token

    def invalidate(self) -> None:
        self._token = None

    async def _mint(self) -> None:
        if self._endpoint is None:
            r = await self._http.get(f"{self._issuer}/.well-known/openid-configuration")
            r.raise_for_status()
            self._endpoint = str(r.json()["token_endpoint"])
        r = await self._http.post(
            self._endpoint,
            data={
                "grant_type": "client_credentials",
                "client_id": self._client_id,
                "client_secret": self._client_secret,
                "scope": "offline_access",
            },
        )
        r.raise_for_status()
        body = r.json()
        self._token = str(body["access_token"])
        lifetime = body.get("expires_in")
        self._expires = time.time() + float(lifetime) if lifetime else jwt_expiry(self._token)


def jwt_expiry(token: str) -> float:
    """The `exp` claim of a JWT, read without verification (only to know when to re-mint)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, KeyError, ValueError):
        return time.time() + 60


class WMSClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        oidc_issuer: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout)
        self._retries, self._backoff = retries, backoff
        self._tokens = (
            TokenSource(self._http, oidc_issuer, client_id or "", client_secret or "")
            if oidc_issuer
            else None
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
        """One WMS call, retried (`retried`) up to `retries` times, `backoff` seconds doubling between
        tries; past them, the last `WMSUnavailable`."""
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(1 + self._retries),
            wait=tenacity.wait_exponential(multiplier=self._backoff),
            retry=tenacity.retry_if_exception(lambda e: retried(e, idempotent)),
            reraise=True,
        )
        return await retrying(self._send, method, path, body)

    async def _send(self, method: str, path: str, body: Any) -> Any:
        headers = {"Authorization": f"Bearer {await self._tokens.token()}"} if self._tokens else {}
        started = time.monotonic()
        try:
            r = await self._http.request(method, path, json=body, headers=headers)
        except httpx.TransportError as e:
            metrics.wms_request(method, path, None, time.monotonic() - started)
            raise WMSUnavailable(method, path, None, f"{type(e).__name__}: {e}") from e
        metrics.wms_request(method, path, r.status_code, time.monotonic() - started)
        if r.status_code in TOKEN_REFUSED and self._tokens:
            self._tokens.invalidate()  # expired early or revoked: mint a new one and try again
            raise WMSUnavailable(method, path, r.status_code, r.text[:300])
        if r.status_code >= 500 or r.status_code in (408, 429):  # cannot now, not a refusal
            log.warning("WMS %s %s: HTTP %s", method, path, r.status_code)
            raise WMSUnavailable(method, path, r.status_code, r.text[:300])
        if r.status_code >= 400:
            raise WMSError(method, path, r.status_code, r.text[:300])
        return r.json()

    # --- workflows ---
    async def request_workflow(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/workflows; not retried unless the connection never opened."""
        resp: dict[str, Any] = await self._call("POST", f"{V1}/workflows", body, idempotent=False)
        return resp

    async def find_workflows_by_marker(self, marker: str) -> list[str]:
        """Workflows whose taskforces carry our request marker (a restart lost the POST's answer)."""
        marker_path = f"pilot_config.environment.{names.WORKFLOW_MARKER_ENV}"
        query = {"query": {marker_path: marker}, "projection": ["workflow_id"]}
        found = await self._paged("taskforces", query)
        return sorted({str(tf["workflow_id"]) for tf in found})

    async def get_workflow(self, workflow_id: str) -> dict[str, Any]:
        resp: dict[str, Any] = await self._call("GET", f"{V1}/workflows/{workflow_id}")
        return resp

    async def deactivate(self, workflow_id: str, how: str) -> bool:
        """`how` is "abort" or "finished". False when the WMS says it was already deactivated (404)."""
        try:
            await self._call("POST", f"{V1}/workflows/{workflow_id}/actions/{how}")
        except WMSError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def public_mq_profiles(self, workflow_id: str) -> list[dict[str, Any]]:
        resp = await self._call("GET", f"{V1}/mqs/workflows/{workflow_id}/mq-profiles/public")
        return list(resp["mqprofiles"])

    # --- batched polling ---
    async def query_workflows(self, workflow_ids: Iterable[str]) -> list[dict[str, Any]]:
        query = {"query": {"workflow_id": {"$in": sorted(workflow_ids)}}}
        return await self._paged("workflows", query)

    async def query_taskforces(self, workflow_ids: Iterable[str]) -> list[dict[str, Any]]:
        query = {"query": {"workflow_id": {"$in": sorted(workflow_ids)}}}
        return await self._paged("taskforces", query)

    async def _paged(self, kind: str, find: dict[str, Any]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            body = {**find, "after": after} if after else find
            resp = await self._call("POST", f"{V1}/query/{kind}", body)
            found += resp[kind.replace("-", "_")]
            after = resp.get("next_after")
            if not after:
                return found

    # --- add workers ---
    async def add_workers(self, workflow_id: str, location: str, n_workers: int) -> dict[str, Any]:
        """Find the workflow's task directive, then add a taskforce of `n_workers` at `location`."""
        directives = await self._paged(
            "task-directives", {"query": {"workflow_id": workflow_id}, "projection": ["task_id"]}
        )
        if not directives:
            raise WMSError("POST", f"{V1}/query/task-directives", 404, f"no task directive for {workflow_id}")
        task_id = directives[0]["task_id"]
        body = {"cluster_location": location, "n_workers": n_workers}
        resp: dict[str, Any] = await self._call(
            "POST", f"{V1}/task-directives/{task_id}/actions/add-workers", body, idempotent=False
        )
        return resp
