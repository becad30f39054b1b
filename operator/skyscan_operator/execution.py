"""One plan's execution on one scan (`Execution`): the draft of the operator's status keys that the
actions' outcomes update, its writing (once a pass, and before an action that must find its intent
recorded), and the one mechanism for failures: record, then stop the pass (`Stop`).

The actions themselves are `kube_actions`' and `wms_actions`'; `executor` runs a plan's actions in turn.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn, Protocol

from skyscan import conditions as cond
from skyscan import model, names
from skyscan.io import kube
from skyscan.io.kube import Kube, scan_path
from skyscan.io.kube_errors import TRANSPORT_ERRORS, KubeError, NotFound, is_outage
from skyscan.patch import merge_patch
from skyscan.scan_record import ScanRecord
from skyscan_operator import metrics
from skyscan_operator.backlog import retry_delay
from skyscan_operator.draft import Plan
from skyscan_operator.kube_events import EventPoster
from skyscan_operator.live_scans import LiveScans
from skyscan_operator.observed import ScanView
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.wms_client import WMSClient, WMSError, WMSUnavailable

MERGE = kube.MERGE_PATCH

# How an action is carried out: its outcome goes to the draft; seconds until the scan wants another
# pass (0.0: at once, from the unwritten draft if the action is CARRIED; None: only when something changes).
Handler = Callable[["Execution", Any], Awaitable[float | None]]

# What a Kubernetes API call raises: an answer (KubeError), or none (connection, timeout).
KUBE_ERRORS = (KubeError, *TRANSPORT_ERRORS)


def api_refusal(e: BaseException) -> str:
    """Why the API server did not take an object a start needs, as a condition reason. Only
    `StartFailed` (the object itself was refused: invalid, or its name is taken) counts as a failed
    attempt; an outage (`APIUnavailable`), a quota refusal (`QuotaExceeded`, which the reference
    retries forever too) and missing permissions of the operator (`APIForbidden`) do not."""
    if is_outage(e) or not isinstance(e, KubeError):
        return "APIUnavailable"
    if e.quota_exceeded:
        return "QuotaExceeded"
    if e.status in (401, 403):
        return "APIForbidden"
    return "StartFailed"


def describe(e: BaseException) -> str:
    """An API error in one line: the status and the API server's message, or the exception."""
    if not isinstance(e, KubeError):
        return f"{type(e).__name__}: {e}"
    return f"HTTP {e.status} {e.reason}: {e.message[:300]}"


class Stop(Exception):
    """An action failed in a way already recorded; the rest of the plan waits for the next pass."""

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__()
        self.retry_after = retry_after


def sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


async def write_status(
    api: Kube, store: LiveScans, namespace: str, name: str, wanted: dict[str, Any]
) -> dict[str, Any]:
    """Write the operator's status keys `wanted`: a server-side apply of all of them as the operator, so
    a key it leaves out is removed. A key another writer left (an older operator's merge patches, a
    kubectl edit) is not the operator's to drop by apply: what still differs afterwards is put right by
    one merge patch. Returns the Scan as written (and stores it)."""
    path = scan_path(namespace, name, "status")
    applied = {k: v for k, v in wanted.items() if v is not None}
    body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}}
    new: dict[str, Any] = await api.apply(path, {**body, "status": applied}, names.OPERATOR_MANAGER)
    if left := merge_patch(ScanRecord(new).operator_keys(), wanted):
        new = await api.request("PATCH", path, body={"status": left}, content_type=MERGE)
    store.put_scan(new)
    return new


class Means(Protocol):
    """What an execution acts with (an `executor.Executor`)."""

    api: Kube
    wms: WMSClient | None
    store: LiveScans
    events: EventPoster
    settings: OperatorSettings
    clock: Callable[[], float]


class Execution:
    """One plan's execution on one scan: `draft` holds the operator's keys as they should be,
    `written` as last written; outcomes update the draft, `flush` writes it."""

    def __init__(
        self,
        executor: Means,
        scan: ScanView,
        body: dict[str, Any],
        plan: Plan,
        written: dict[str, Any] | None = None,
        body_now: dict[str, Any] | None = None,
    ) -> None:
        self.executor, self.scan, self.body = executor, scan, body_now or body
        self.draft = plan.draft
        self.head = {k: plan.status.get(k) for k in ("observedGeneration", "state")}
        self.written = ScanRecord(body).operator_keys() if written is None else written
        self.wake: float | None = plan.requeue_after
        self.gone = False  # the Scan was deleted meanwhile

    @property
    def api(self) -> Kube:
        return self.executor.api

    @property
    def store(self) -> LiveScans:
        return self.executor.store

    @property
    def settings(self) -> OperatorSettings:
        return self.executor.settings

    @property
    def events(self) -> EventPoster:
        return self.executor.events

    def now(self) -> float:
        return self.executor.clock()

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.post(self.body, "Warning" if warning else "Normal", reason, message, self.now())

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.draft.now = self.now()
        self.draft.set(type_, status, reason, message)

    def workflow(self) -> model.WorkflowStatus:
        return self.draft.workflow

    def wanted(self) -> dict[str, Any]:
        return {**self.head, **self.draft.stated(self.scan.record), **self.draft.wire()}

    def preview(self) -> ScanView:
        """The scan as it will be once the draft is written: what a carried pass plans from."""
        status = {**ScanRecord(self.body).status, **self.wanted()}
        body = {**self.body, "status": {k: v for k, v in status.items() if v is not None}}
        return ScanView.from_body(body)

    def took(self, new: dict[str, Any]) -> None:
        """The Scan as a write of the execution answered it."""
        self.body = new
        self.store.put_scan(new)

    async def flush(self) -> None:
        """Write the operator's keys if they changed since last written (Stop if the Scan is gone)."""
        wanted = self.wanted()
        if not merge_patch(self.written, wanted):
            return
        try:
            new = await write_status(self.api, self.store, self.scan.namespace, self.scan.name, wanted)
        except NotFound as e:
            self.gone = True
            raise Stop() from e
        self.written = copy.deepcopy(wanted)
        self.body = new

    async def stop(self, retry_after: float | None = None) -> NoReturn:
        """End the pass: what was recorded is written, the rest of the plan waits for the next pass."""
        await self.flush()
        raise Stop(retry_after)

    # --- one mechanism for failures: record, then stop ---
    @asynccontextmanager
    async def kube_call(self, what: str) -> AsyncIterator[None]:
        """A Kubernetes call of a start: a refusal (or no answer) is recorded and stops the pass."""
        try:
            yield
        except KUBE_ERRORS as e:
            await self.kube_refused(e, what)

    async def kube_refused(self, e: BaseException, what: str) -> NoReturn:
        """The API server did not take an object of the start (or did not answer): interrupt the
        attempt, or fail it if the object itself was refused (`api_refusal`); then stop the plan."""
        reason, detail = api_refusal(e), f"{what}: {describe(e)}"
        if reason == "StartFailed":
            self.fail_attempt(reason, detail)
        else:
            if reason == "APIUnavailable":
                self.store.outage_at = self.now()
            self.interrupt_attempt(reason, detail)
        self.event(reason, detail, warning=True)
        await self.stop()

    @asynccontextmanager
    async def wms_call(self, *, attempt: bool = False, wait: float | None = None) -> AsyncIterator[None]:
        """A WMS call: its failure is recorded (`attempt`: it ends the start attempt) and stops the pass."""
        try:
            yield
        except WMSError as e:
            await self.wms_refused(e, attempt=attempt, wait=wait)

    async def wms_refused(self, e: WMSError, *, attempt: bool, wait: float | None = None) -> NoReturn:
        """Record a WMS failure and stop; `attempt`: it ends the current start attempt (back to the
        backlog), counted if the WMS refused the request, not counted if it could not be reached."""
        unavailable = isinstance(e, WMSUnavailable)
        if unavailable:
            self.store.outage_at = self.now()
            self.condition(cond.WMS_AVAILABLE, False, "WMSUnavailable", str(e))
        if attempt and unavailable:
            self.interrupt_attempt("WMSUnavailable", f"the WMS is unavailable: {e}")
        elif attempt:
            self.fail_attempt("WMSRejected", str(e))
        self.event("WMSError", str(e), warning=True)
        await self.stop(wait)

    async def refuse(self, message: str) -> NoReturn:
        """The scan's start cannot go on (its object is someone else's): a failed attempt."""
        self.fail_attempt("StartFailed", message)
        await self.stop()

    async def need_wms(self) -> WMSClient:
        if self.executor.wms is None:
            self.condition(cond.WMS_AVAILABLE, False, "NotConfigured", "no WMS address is configured")
            await self.stop()
        return self.executor.wms

    def wms_ok(self) -> None:
        if cond.find(self.draft.conditions, cond.WMS_AVAILABLE):
            self.condition(cond.WMS_AVAILABLE, True, "Reachable", "the last WMS call succeeded")

    def fail_attempt(self, reason: str, message: str) -> None:
        """The scan's own failure ends its start attempt, which counts against `max_start_attempts`."""
        backlog = self.draft.backlog or model.BacklogStatus(entered_at=self.scan.created_at or self.now())
        backlog.pending_since = self.now()
        backlog.interruptions = 0
        self.draft.backlog = backlog
        self.condition(cond.ADMITTED, False, reason, f"start attempt {backlog.attempts} failed: {message}")
        metrics.START_FAILURES.labels(reason).inc()

    def interrupt_attempt(self, reason: str, message: str) -> None:
        """An outage or a quota refusal ends the start attempt without counting it: the attempt is
        given back, and the scan waits in the backlog for a backoff that grows with each interruption
        in a row (`backlog.retry_delay`). The reason stays visible on the Admitted condition."""
        backlog = self.draft.backlog or model.BacklogStatus(entered_at=self.scan.created_at or self.now())
        if self.draft.true(cond.ADMITTED):
            backlog.attempts = max(0, backlog.attempts - 1)
        backlog.interruptions += 1
        backlog.pending_since = self.now()
        self.draft.backlog = backlog
        delay = retry_delay(backlog.interruptions, self.settings)
        metrics.START_FAILURES.labels(reason).inc()
        self.condition(
            cond.ADMITTED,
            False,
            reason,
            f"{message}; not counted as a start attempt ({backlog.attempts} of "
            f"{self.settings.max_start_attempts} used), retrying in {delay:g}s",
        )
