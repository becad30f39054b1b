"""Carrying out a `Plan`: each action in turn, its outcome recorded in the draft of the operator's
status keys, which is written once a pass (and before an action that must find its intent recorded).

Every side effect is idempotent: the Job and Secrets have deterministic names and are server-side
applied, once their owner is checked; a WMS workflow id is written to status the moment the WMS
returns it; a lost answer is recovered by looking the workflow up by its marker. A failure is
recorded by one of `kube_refused`/`wms_refused`, which end the pass through `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import aiohttp

from skyscan import conditions as cond
from skyscan import kube, model, names, payloads
from skyscan.kube import ApiError, Kube, core_path, scan_path
from skyscan.patch import merge_patch
from skyscan.status import ScanRecord
from skyscan_operator import metrics, scanner_job
from skyscan_operator.backlog import retry_delay
from skyscan_operator.events import EventPoster
from skyscan_operator.planner import (
    Action,
    AddWorkers,
    CheckEvent,
    CreateJob,
    Deactivate,
    DeleteJob,
    Event,
    IssueScannerCredential,
    Plan,
    ProvisionQueues,
    RecoverWorkflow,
    Replace,
    RequestWorkflow,
    RevokeScannerCredential,
    ScanView,
    SetFinalizer,
)
from skyscan_operator.refusals import refused_workers, workflow_refusal
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.store import Store
from skyscan_operator.wms import WMSClient, WMSError, WMSUnavailable

log = logging.getLogger(__name__)
MERGE = kube.MERGE_PATCH
JSON_PATCH = "application/json-patch+json"


# Actions that must find the plan's status written before they act: the intent markers that make
# a workflow request or a replacement happen once (and the finalizer guarding the workflow).
MARKED = (SetFinalizer, RequestWorkflow, RecoverWorkflow, Replace)
# Actions after whose success the scan is planned again at once, from the unwritten draft (their
# outcome is an object that exists or not, found again by the next pass if this one is lost).
CARRIED = (ProvisionQueues,)
CARRY_LIMIT = 3  # plans in one pass

# What a Kubernetes API call raises: an answer (ApiError), or none (connection, timeout).
KUBE_ERRORS = (ApiError, aiohttp.ClientError, asyncio.TimeoutError)


def is_api_outage(e: BaseException) -> bool:
    """The API server did not answer, or answered that it cannot now (408, 429, 5xx)."""
    if isinstance(e, ApiError):
        return not e.status or e.status in (408, 429) or e.status >= 500
    return isinstance(e, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError)


def api_refusal(e: BaseException) -> str:
    """Why the API server did not take an object a start needs, as a condition reason. Only
    `StartFailed` (the object itself was refused: invalid, or its name is taken) counts as a failed
    attempt; an outage (`APIUnavailable`), a quota refusal (`QuotaExceeded`, which the reference
    retries forever too) and missing permissions of the operator (`APIForbidden`) do not."""
    if is_api_outage(e) or not isinstance(e, ApiError):
        return "APIUnavailable"
    if e.quota_exceeded:
        return "QuotaExceeded"
    if e.status in (401, 403):
        return "APIForbidden"
    return "StartFailed"


def describe(e: BaseException) -> str:
    """An API error in one line: the status and the API server's message, or the exception."""
    if not isinstance(e, ApiError):
        return f"{type(e).__name__}: {e}"
    return f"HTTP {e.status} {e.reason}: {e.message[:300]}"


class Stop(Exception):
    """An action failed in a way already recorded; the rest of the plan waits for the next pass."""

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__()
        self.retry_after = retry_after


def sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


Replan = Callable[[ScanView], Plan]


async def write_status(
    api: Kube, store: Store, namespace: str, name: str, wanted: dict[str, Any]
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


class Applier:
    def __init__(
        self,
        api: Kube,
        wms: WMSClient | None,
        store: Store,
        events: EventPoster,
        settings: OperatorSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.wms, self.store, self.events, self.settings, self.clock = wms, store, events, settings, clock

    async def refuse_unreadable(self, body: dict[str, Any], plan: tuple[dict[str, Any], list[Event]]) -> None:
        """Write the status `planner.refuse_unreadable` planned for a Scan it cannot read, and post its
        events (a Scan gone meanwhile needs neither)."""
        wanted, events = plan
        meta = body["metadata"]
        if not merge_patch(ScanRecord(body).operator_keys(), wanted):
            return
        try:
            await write_status(self.api, self.store, meta["namespace"], meta["name"], wanted)
        except ApiError as e:
            if e.status == 404:
                return
            raise
        for event in events:
            self.events.post(body, event.type, event.reason, event.message, self.clock())

    async def apply(
        self, scan: ScanView, body: dict[str, Any], plan: Plan, replan: Replan | None = None
    ) -> float | None:
        """Returns seconds until the scan wants another pass (None: only when something changes).
        `replan` plans the scan again (from its unwritten draft) after a CARRIED action succeeded."""
        run = Run(self, scan, body, plan)
        for carry in range(CARRY_LIMIT):
            try:
                wake, carried = await run.pass_(plan)
            except Stop as stop:
                return None if run.gone or stop.retry_after is None else sooner(run.wake, stop.retry_after)
            except Exception:
                with contextlib.suppress(Exception):  # what was recorded before the failure is kept
                    await run.flush()
                raise
            if not carried or replan is None or carry == CARRY_LIMIT - 1:
                break
            plan = replan(run.preview())
            run = Run(self, scan, body, plan, written=run.written, body_now=run.body)
        try:
            await run.flush()
        except Stop:
            return None
        return wake


class Run:
    """One plan's application to one scan: `draft` holds the operator's keys as they should be,
    `written` as last written; outcomes update the draft, `flush` writes it."""

    def __init__(
        self,
        applier: Applier,
        scan: ScanView,
        body: dict[str, Any],
        plan: Plan,
        written: dict[str, Any] | None = None,
        body_now: dict[str, Any] | None = None,
    ) -> None:
        self.a, self.scan, self.body = applier, scan, body_now or body
        self.draft = plan.draft
        self.head = {k: plan.status.get(k) for k in ("observedGeneration", "state")}
        self.written = ScanRecord(body).operator_keys() if written is None else written
        self.wake: float | None = plan.requeue_after
        self.gone = False  # the Scan was deleted meanwhile

    @property
    def settings(self) -> OperatorSettings:
        return self.a.settings

    def now(self) -> float:
        return self.a.clock()

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.a.events.post(self.body, "Warning" if warning else "Normal", reason, message, self.now())

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.draft.now = self.now()
        self.draft.set(type_, status, reason, message)

    def wanted(self) -> dict[str, Any]:
        return {**self.head, "state": self.draft.state(self.scan.record), **self.draft.wire()}

    def preview(self) -> ScanView:
        """The scan as it will be once the draft is written: what a carried pass plans from."""
        status = {**ScanRecord(self.body).status, **self.wanted()}
        body = {**self.body, "status": {k: v for k, v in status.items() if v is not None}}
        return ScanView.from_body(body)

    async def flush(self) -> None:
        """Write the operator's keys if they changed since last written (Stop if the Scan is gone)."""
        wanted = self.wanted()
        if not merge_patch(self.written, wanted):
            return
        try:
            new = await write_status(self.a.api, self.a.store, self.scan.namespace, self.scan.name, wanted)
        except ApiError as e:
            if e.status == 404:
                self.gone = True
                raise Stop() from e
            raise
        self.written = copy.deepcopy(wanted)
        self.body = new

    async def stop(self, retry_after: float | None = None) -> NoReturn:
        """End the pass: what was recorded is written, the rest of the plan waits for the next pass."""
        await self.flush()
        raise Stop(retry_after)

    async def pass_(self, plan: Plan) -> tuple[float | None, bool]:
        """Post the plan's events and carry out its actions; (wake, whether a CARRIED action succeeded)."""
        for e in plan.events:
            self.event(e.reason, e.message, warning=e.type == "Warning")
            if e.reason == "StartTimedOut":  # the planner's failure of a start attempt
                metrics.START_FAILURES.labels(e.reason).inc()
        if any(isinstance(a, MARKED) for a in plan.actions):
            await self.flush()
        carried = False
        for action in plan.actions:
            again = await self.do(action)
            self.wake = sooner(self.wake, again)
            carried = carried or (isinstance(action, CARRIED) and again == 0.0)
        return self.wake, carried

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
                self.a.store.outage_at = self.now()
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
            self.a.store.outage_at = self.now()
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

    # --- actions ---
    async def do(self, action: Action) -> float | None:
        match action:
            case SetFinalizer(present):
                await self.set_finalizer(present)
            case RequestWorkflow(body):
                await self.request_workflow(body)
            case RecoverWorkflow(body, marker, create):
                await self.recover_workflow(body, marker, create)
            case ProvisionQueues(workflow_id):
                return await self.provision_queues(workflow_id)
            case CreateJob(job):
                await self.create_job(job)
            case DeleteJob(name):
                await self.delete_job(name)
            case Deactivate(workflow_id, how):
                await self.deactivate(workflow_id, how)
            case AddWorkers():
                await self.add_workers(action)
            case Replace(new_id, body):
                await self.replace(new_id, body)
            case IssueScannerCredential(lifetime):
                await self.issue_credential(lifetime)
            case RevokeScannerCredential(secret):
                await self.revoke_credential(secret)
            case CheckEvent(sensor_event_id):
                await self.check_event(sensor_event_id)
        return 0.0 if isinstance(action, RequestWorkflow | RecoverWorkflow | CreateJob | CheckEvent) else None

    async def need_wms(self) -> WMSClient:
        if self.a.wms is None:
            self.condition(cond.WMS_AVAILABLE, False, "NotConfigured", "no WMS address is configured")
            await self.stop()
        return self.a.wms

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

    def workflow(self) -> model.WorkflowStatus:
        return self.draft.workflow

    async def set_finalizer(self, present: bool) -> None:
        finalizer = names.WORKFLOW_FINALIZER
        current = list((self.body["metadata"].get("finalizers")) or [])
        wanted = [*current, finalizer] if present and finalizer not in current else current
        if not present:
            wanted = [f for f in current if f != finalizer]
        if wanted == current:
            return
        patch = {
            "metadata": {"finalizers": wanted, "resourceVersion": self.body["metadata"]["resourceVersion"]}
        }
        try:
            new = await self.a.api.request(
                "PATCH", scan_path(self.scan.namespace, self.scan.name), body=patch, content_type=MERGE
            )
        except ApiError as e:
            if e.status in (404, 409):
                raise Stop(0.5 if e.status == 409 else None) from e  # changed meanwhile: plan again
            raise
        self.body = new
        self.a.store.put_scan(new)

    async def request_workflow(self, body: dict[str, Any]) -> None:
        wms = await self.need_wms()
        self.event("WorkflowRequested", f"requesting a WMS workflow from {wms.base_url}")
        async with self.wms_call(attempt=True):
            try:
                resp = await wms.request_workflow(body)
            except WMSError as e:
                if not isinstance(e, WMSUnavailable):
                    self.workflow().requested_at = None  # a definite refusal: nothing was created
                    await self.fail_scan(*workflow_refusal(e, self.requested_clusters()))
                raise
        await self.record_workflow(str(resp["workflow"]["workflow_id"]), "WorkflowCreated")

    def requested_clusters(self) -> dict[str, str]:
        """The scan's cluster locations as the WMS is asked for them -> as the scan asked."""
        asked = (c.location for c in self.scan.spec.request_clusters)
        return {self.settings.wms_cluster(name): name for name in asked}

    async def fail_scan(self, reason: str, message: str) -> NoReturn:
        """The WMS refused what the scan asks for: asking again cannot help, so the scan fails at once
        (no further start attempt), saying why; the next pass releases what it holds."""
        self.draft.backlog = None
        self.condition(cond.FAILED, True, reason, message)
        self.condition(cond.ADMITTED, False, reason, message)
        self.wms_ok()  # it answered
        metrics.START_FAILURES.labels(reason).inc()
        self.event(reason, message, warning=True)
        await self.stop()

    async def record_workflow(self, workflow_id: str, reason: str) -> None:
        """The workflow id goes to status the moment the WMS returns it."""
        wf = self.workflow()
        wf.id, wf.address = workflow_id, self.a.wms.base_url if self.a.wms else wf.address
        message = f"workflow {workflow_id}: message queues not activated"  # as the next plan says
        self.condition(cond.WORKFLOW_READY, False, "WaitingForQueues", message)
        self.wms_ok()
        await self.flush()
        self.event(reason, f"WMS workflow {workflow_id}")

    async def recover_workflow(self, body: dict[str, Any], marker: str, create: bool) -> None:
        wms = await self.need_wms()
        async with self.wms_call(attempt=create):
            found = await wms.find_workflows_by_marker(marker)
        if found:
            keep, *extra = found
            for other in extra:  # should not happen; never leave a duplicate running
                self.event("DuplicateWorkflow", f"aborting duplicate WMS workflow {other}", warning=True)
                await wms.deactivate(other, "abort")
            await self.record_workflow(keep, "WorkflowRecovered")
            return
        wf = self.workflow()
        if not create:
            wf.requested_at = None  # nothing was created: nothing to release
            return
        self.event("WorkflowNotFound", "the earlier workflow request left no workflow; requesting again")
        wf.requested_at = cond.iso(self.now())  # a fresh intent marker before the new request
        await self.flush()
        await self.request_workflow(body)

    async def provision_queues(self, workflow_id: str) -> float | None:
        wms = await self.need_wms()
        unknown_wait = max(self.settings.queue_poll_seconds, self.settings.wms_poll_interval_seconds)
        try:
            profiles = await wms.public_mq_profiles(workflow_id)
        except WMSError as e:  # unreachable: back to the backlog; refused: poll again (until the timeout)
            wait = self.settings.queue_poll_seconds
            if e.status == 404:  # unknown to the WMS: the batched poll tells if it is lost; no tight loop
                wait = unknown_wait
            await self.wms_refused(e, attempt=isinstance(e, WMSUnavailable), wait=wait)
        if not profiles:  # EWMS's MQS answers an unknown workflow so (a known one has its queues): as a 404
            return unknown_wait
        connection = scanner_job.ewms_connection(profiles)
        if connection is None:
            return self.settings.queue_poll_seconds
        s = self.scan
        await self.apply_owned(scanner_job.build_secret(s.name, s.uid, s.namespace, connection))
        self.workflow().queues_activated = True
        self.condition(cond.WORKFLOW_READY, True, "QueuesActivated", f"workflow {workflow_id} is ready")
        self.wms_ok()
        self.event("QueuesActivated", f"message queues of workflow {workflow_id} are activated")
        return 0.0

    async def apply_owned(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply an object of the scan's start (a Secret or the Job; created if absent),
        unless it exists and is someone else's. The operator may not read Secrets: ownership is a JSON
        patch `test` that changes nothing, and fails unless the owner is this scan (404: absent)."""
        kind, name = body["kind"], body["metadata"]["name"]
        where = kube.path(body["apiVersion"], f"{kind.lower()}s", self.scan.namespace, name)
        probe = [{"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": self.scan.uid}]
        try:
            await self.a.api.request("PATCH", where, body=probe, content_type=JSON_PATCH)
        except KUBE_ERRORS as e:
            if isinstance(e, ApiError) and e.status == 422:
                await self.refuse(f"{kind} {name} exists and belongs to someone else")
            if not (isinstance(e, ApiError) and e.status == 404):
                await self.kube_refused(e, f"looking at {kind} {name}")
        async with self.kube_call(f"applying {kind} {name}"):
            applied: dict[str, Any] = await self.a.api.apply(where, body, names.OPERATOR_MANAGER)
        return applied

    async def create_job(self, job: dict[str, Any]) -> None:
        # The credential the Job's Pod will present is on record first: an operator that died right
        # after creating the Job would otherwise leave a scanner the shim refuses as revoked.
        await self.flush()
        created = await self.apply_owned(job)
        name = job["metadata"]["name"]
        created_at = cond.epoch(created["metadata"].get("creationTimestamp"))
        self.draft.job = model.JobStatus(
            name=name,
            created_at=cond.iso(created_at or self.now()),
            state="Pending",
            reason="Pending",
        )
        self.draft.backlog = None
        self.condition(cond.ADMITTED, True, "Started", f"Job {name} created")
        self.event("JobCreated", f"created Job {name}")

    async def issue_credential(self, lifetime_seconds: int) -> None:
        """A token for the scanner ServiceAccount, bound to a new per-scan Secret and stored in it.
        Idempotent: an existing Secret of this scan is reused (its token is replaced)."""
        s = self.scan
        secret = await self.apply_owned(scanner_job.credential_secret(s.name, s.uid, s.namespace))
        name = secret["metadata"]["name"]
        request = scanner_job.token_request(name, secret["metadata"]["uid"], lifetime_seconds)
        account = self.settings.scanner_service_account
        async with self.kube_call(f"issuing a token for ServiceAccount {account}"):
            granted = await self.a.api.request(
                "POST", core_path("serviceaccounts", s.namespace, account, "token"), body=request
            )
            token = granted["status"]["token"]  # raw: TokenRequest
            await self.a.api.apply(
                core_path("secrets", s.namespace, name),
                scanner_job.credential_secret(s.name, s.uid, s.namespace, token),
                names.OPERATOR_MANAGER,
            )
        expires = cond.epoch(granted["status"].get("expirationTimestamp"))  # raw: TokenRequest
        self.draft.credential = model.ScannerCredential(secret=name, expires_at=expires)
        self.event("ScannerCredentialIssued", f"the scanner's own token, bound to Secret {name}")

    async def revoke_credential(self, secret: str) -> None:
        try:
            await self.a.api.request("DELETE", core_path("secrets", self.scan.namespace, secret))
        except ApiError as e:
            if e.status != 404:
                raise
        if self.draft.credential:
            self.draft.credential.revoked = True
        self.event("ScannerCredentialRevoked", f"deleted Secret {secret}: the scanner's token is void")

    async def check_event(self, sensor_event_id: str) -> None:
        """Look (metadata only) whether the scan's sensor event is stored; if the scan is not one of
        its owners, become one, so the event lives as long as the scan: the last step of a launch for
        an event stored for this scan (`skyscan.io/stored-for`), else worth telling (a kubectl-made
        event, or a reuse cut short before its owner patch). The answer goes to the store for the
        next plan."""
        s = self.scan
        meta = await payloads.event_metadata(self.a.api, s.namespace, sensor_event_id)
        if meta is not None and s.uid not in {o.get("uid") for o in meta.get("ownerReferences") or []}:
            try:
                await payloads.add_event_owner(self.a.api, s.namespace, sensor_event_id, self.body)
                if (meta.get("annotations") or {}).get(names.STORED_FOR_ANNOTATION) != s.name:
                    self.event("EventAdopted", f"now an owner of its sensor event {sensor_event_id}")
            except ApiError as e:
                if e.status != 404:
                    raise
                meta = None  # deleted meanwhile
        self.a.store.saw_event(s.namespace, s.name, meta is not None, self.now())

    async def delete_job(self, name: str) -> None:
        try:
            await self.a.api.request(
                "DELETE", kube.path("batch/v1", "jobs", self.scan.namespace, name),
                params={"propagationPolicy": "Background"},
            )  # fmt: skip
        except ApiError as e:
            if e.status != 404:
                raise
            return
        self.event("JobDeleted", f"deleted Job {name}")

    async def deactivate(self, workflow_id: str, how: str) -> None:
        wms = await self.need_wms()
        async with self.wms_call(wait=self.settings.queue_poll_seconds):
            changed = await wms.deactivate(workflow_id, how)
            deactivated = "ABORTED" if how == "abort" else "FINISHED"
            if not changed:  # already deactivated: learn how, for the REST state
                try:
                    deactivated = (await wms.get_workflow(workflow_id)).get("deactivated") or deactivated
                except WMSError as e:
                    if e.status != 404:
                        raise
        wf = self.workflow()
        wf.deactivated = deactivated
        if how == "abort":
            wf.abort_requested_at = cond.iso(self.now())
        else:
            wf.finish_requested_at = cond.iso(self.now())
        self.condition(
            cond.WORKFLOW_READY, False, deactivated.title(), f"workflow {workflow_id}: {deactivated}"
        )
        self.wms_ok()
        verb = "aborted" if how == "abort" else "finished"
        self.event(
            f"Workflow{verb.title()}", f"WMS workflow {workflow_id} {verb}" + ("" if changed else " already")
        )

    async def add_workers(self, r: AddWorkers) -> None:
        wms = await self.need_wms()
        outcome: model.WorkerRequestOutcome
        try:
            tf = await wms.add_workers(r.workflow_id, r.location, r.n_workers)
            outcome = model.WorkerRequestOutcome(
                id=r.request_id,
                state="Succeeded",
                taskforce_uuid=tf["taskforce_uuid"],
                n_workers=tf["n_workers"],
            )
            self.wms_ok()
            self.event(
                "WorkersAdded", f"{tf['n_workers']} workers at {r.location}: taskforce {tf['taskforce_uuid']}"
            )
        except WMSError as e:
            state, reason = refused_workers(e, r.location, r.asked)
            outcome = model.WorkerRequestOutcome(id=r.request_id, state=state, reason=reason)
            self.event("AddWorkersFailed", reason, warning=True)
        self.draft.worker_requests = [*(self.draft.worker_requests or []), outcome]

    async def replace(self, new_id: str, body: dict[str, Any]) -> None:
        s = self.scan
        known = self.a.store.scan((s.namespace, new_id)) is not None
        created = await self.a.api.apply(scan_path(s.namespace, new_id), body, names.OPERATOR_MANAGER)
        if not known:
            self.event("ReplacementCreated", f"created replacement scan {new_id}")
        try:  # the shared sensor event must outlive the original scan
            await payloads.add_event_owner(self.a.api, s.namespace, s.spec.sensor_event_id, created)
        except ApiError as e:
            if e.status == 403:  # the replacement still runs; only its event's lifetime is at risk
                self.event("EventOwnerNotAdded", f"cannot add {new_id} as an owner of the sensor event", True)
            elif e.status != 404:  # 404: no stored event (a Scan made with kubectl), nothing to keep alive
                raise
        if self.scan.spec.replaced_by == new_id and self.scan.spec.deleted:
            return
        # The one spec write the operator makes: exactly these two fields, as a merge patch.
        new = await self.a.api.request(
            "PATCH", scan_path(s.namespace, s.name), body={"spec": {"deleted": True, "replacedBy": new_id}},
            content_type=MERGE,
        )  # fmt: skip
        self.body = new
        self.a.store.put_scan(new)
