"""The one planner (pure): from a Scan and what was observed, the next status and the actions to take.

`plan(scan, observed, now, settings)` never does I/O. The handlers gather `Observed` (the Job and
its Pods from watch caches, the WMS workflow from the batched poller, the backlog's decision) and
apply the `Plan`: first the status patch (so intent markers such as `workflow.requestedAt` are
stored before the request they announce), then the actions in order. Outcomes of actions are
recorded by the applier and lead to another pass; nothing here depends on which handler ran last.

A scan's life, as the status tells it:
  backlog entry (Admitted=False, reason why it waits) -> admitted (start attempt n) ->
  workflow requested (intent marker, then id) -> queues activated (Secret) -> Job created
  (backlog entry removed) -> pod running/ended -> final result -> WMS `finished` after a delay.
Soft delete, hard delete (finalizer), failed start attempts and replaced scans end it early, and a
spec that REST would have refused (a Scan made with kubectl) ends it before it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from skyscan import conditions as cond
from skyscan import model, names, policy
from skyscan.state import scan_state, workers_refusal
from skyscan.status import ENDED_JOB_STATES, OPERATOR_KEYS, ScanRecord, holds_workflow
from skyscan_operator import scanner_job, workforce
from skyscan_operator.settings import OperatorSettings

TRANSIENT_REASONS = frozenset({"OOMKilled", "Evicted", "DeadlineExceeded", "StartError", "CrashLoopBackOff"})
TRANSIENT_EXIT_CODES = frozenset({137, 143})
# The kubelet's reasons for a container that cannot start, and the scan's Failed reason for each.
# A registry blip or a Secret not yet there may pass: those fail a scan after
# `image_pull_grace_seconds`; a name the runtime can never pull fails it at once.
STUCK_REASONS = {
    "ErrImagePull": "ImageUnavailable",
    "ImagePullBackOff": "ImageUnavailable",
    "InvalidImageName": "ImageUnavailable",
    "ErrImageNeverPull": "ImageUnavailable",
    "CreateContainerConfigError": "ContainerConfigInvalid",  # e.g. a root image under runAsNonRoot
    "CreateContainerError": "ContainerConfigInvalid",
}
NEVER_STARTS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# A scan whose sensor event was missing at a look looks again after half its age then, within these
# bounds: at once while the shim is still storing it, seldom for one made without it (kubectl).
EVENT_RECHECK_SECONDS = (0.25, 5.0)
# A miss this early is the shim still storing the event beside the Scan: no EventMissing written for it.
EVENT_QUIET_SECONDS = 2.0
# Why a start attempt ended. Only failures of the scan itself count against `max_start_attempts`:
# a definite WMS refusal of its request, its Job or Secret refused by the API server (invalid, or a
# name someone else holds), a start that timed out while the WMS and the API server answered, its
# workflow lost by a WMS that answers (as a start that never got ready: the attempt's own failure).
ATTEMPT_FAILURES = frozenset({"WMSRejected", "StartFailed", "StartTimedOut", "WorkflowLost"})
# Outages and quota refusals interrupt an attempt without counting it; the scan backs off and retries.
INTERRUPTIONS = frozenset({"WMSUnavailable", "APIUnavailable", "APIForbidden", "QuotaExceeded"})
REFUSAL_MAX_CHARS = 1024  # of an InvalidSpec condition's message (an Event's is cut there too)


# --- what the handlers observe ---


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str | None
    reason: str | None = None  # pod-level reason, else a container's terminated/waiting reason
    exit_code: int | None = None
    started_at: float | None = None
    message: str | None = None  # the kubelet's, of a container that cannot start

    @property
    def transient_failure(self) -> bool:
        return self.reason in TRANSIENT_REASONS or self.exit_code in TRANSIENT_EXIT_CODES


@dataclass(frozen=True)
class JobView:
    name: str
    created_at: str | None
    complete: bool = False
    failed: bool = False
    reason: str | None = None
    deleting: bool = False


@dataclass(frozen=True)
class WorkflowView:
    deactivated: str | None
    taskforces: tuple[dict[str, Any], ...] = ()
    # The WMS answers but no longer knows the workflow (absent from its batched answers in a row, as
    # after a WMS restarted without its data): no worker will come for it. Since when it was missed.
    lost: bool = False
    lost_since: float = 0.0


@dataclass(frozen=True)
class Admission:
    """The backlog's decision on this tick: admitted, or held with a reason."""

    granted: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Observed:
    job: JobView | None = None
    pods: tuple[PodView, ...] = ()
    workflow: WorkflowView | None = None
    admission: Admission | None = None
    lineage_recent: int = 0  # scans of this lineage created within the replacement window
    fresh_id: str = ""  # an unused scan id, in case a replacement must be chosen
    replacement_exists: bool = False
    wms_poll_error: str | None = None  # the last batched WMS poll failed (for scans with a workflow)
    # Since when the operator has run and seen no WMS or API-server outage: a start attempt's timeout
    # runs from here at the earliest (time lost to an outage, or to the operator's absence, is not the
    # scan's failure).
    healthy_since: float = 0.0
    # The scan's sensor event: True stored (and owned by the scan), False missing at the last look,
    # None not looked at yet (or long enough ago to look again).
    event: bool | None = None
    # The first rule REST holds a request to that the scan's spec breaks (`skyscan.policy`), looked at
    # while its Job does not exist; None: it breaks none, or it was not looked at (a started scan).
    refusal: policy.Refusal | None = None


@dataclass(frozen=True)
class ScanView:
    name: str
    namespace: str
    uid: str
    generation: int | None
    created_at: float
    deleting: bool
    finalizers: tuple[str, ...]
    labels: dict[str, str]
    spec: model.ScanSpec
    raw_spec: dict[str, Any]
    record: ScanRecord
    resource_version: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ScanView:
        meta, record = body["metadata"], ScanRecord(body)
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=meta.get("generation"),
            created_at=cond.epoch(meta.get("creationTimestamp")) or 0.0,
            deleting=record.deleting,
            finalizers=tuple(meta.get("finalizers") or ()),
            labels=dict(meta.get("labels") or {}),
            spec=record.scan_spec(),  # leniently (`model.STORED`): the request policy is `_refuse_invalid`'s
            raw_spec=record.spec,
            record=record,
            resource_version=meta.get("resourceVersion", ""),
        )


# --- what the applier does ---


@dataclass(frozen=True)
class CheckEvent:
    """Look whether the scan's sensor event is stored; adopt it if the scan is not among its owners."""

    sensor_event_id: str


@dataclass(frozen=True)
class RequestWorkflow:
    body: dict[str, Any]


@dataclass(frozen=True)
class RecoverWorkflow:
    """Look the workflow up by its marker (a restart lost the request's answer); if there is none,
    request it (`create_if_missing`) or forget the intent."""

    body: dict[str, Any]
    marker: str
    create_if_missing: bool


@dataclass(frozen=True)
class ProvisionQueues:
    workflow_id: str


@dataclass(frozen=True)
class CreateJob:
    job: dict[str, Any]


@dataclass(frozen=True)
class DeleteJob:
    name: str


@dataclass(frozen=True)
class IssueScannerCredential:
    """The scanner's own token, bound to a per-scan Secret: created before the Job that reads it."""

    lifetime_seconds: int


@dataclass(frozen=True)
class RevokeScannerCredential:
    """Delete the per-scan Secret: the token bound to it stops validating."""

    secret: str


@dataclass(frozen=True)
class Deactivate:
    workflow_id: str
    how: Literal["abort", "finished"]


@dataclass(frozen=True)
class AddWorkers:
    """Ask the WMS for workers at `location`, the WMS's name (aliased as at launch) of `asked`."""

    request_id: str
    workflow_id: str
    location: str
    n_workers: int
    asked: str


@dataclass(frozen=True)
class SetFinalizer:
    present: bool


@dataclass(frozen=True)
class Replace:
    """Create the replacement scan (idempotent by name), then mark the original: the one spec write
    the operator makes, a merge patch of exactly `deleted` and `replacedBy`."""

    new_id: str
    body: dict[str, Any]


Action = (
    RequestWorkflow | RecoverWorkflow | ProvisionQueues | CreateJob | DeleteJob | Deactivate | AddWorkers
    | SetFinalizer | Replace | IssueScannerCredential | RevokeScannerCredential | CheckEvent
)  # fmt: skip


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]  # the operator's status keys, wire form
    draft: Draft  # the same keys, typed, for the applier to update as actions succeed
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None

    def wake(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))


# The operator's keys a draft writes: all but the two each pass sets beside it (Run.wanted).
DRAFT_KEYS = tuple(k for k in OPERATOR_KEYS if k not in ("observedGeneration", "state"))


@dataclass
class Draft:
    """The operator's status keys being rebuilt, typed; `wire()` gives them as the status stores them."""

    conditions: list[dict[str, Any]]
    backlog: model.BacklogStatus | None
    workflow: model.WorkflowStatus
    job: model.JobStatus | None
    workforce: model.Workforce | None
    taskforces: list[dict[str, Any]] | None
    worker_requests: list[model.WorkerRequestOutcome] | None
    credential: model.ScannerCredential | None
    now: float
    generation: int | None
    deleting: bool = False  # hard-deleted (deletionTimestamp set)

    @classmethod
    def of(cls, record: ScanRecord, now: float, generation: int | None, deleting: bool = False) -> Draft:
        return cls(
            conditions=record.conditions,
            backlog=record.backlog(),
            workflow=record.workflow(),
            job=record.job(),
            workforce=record.workforce(),
            taskforces=record.taskforces or None,
            worker_requests=record.worker_requests() or None,
            credential=record.scanner_credential(),
            now=now,
            generation=generation,
            deleting=deleting,
        )

    def wire(self) -> dict[str, Any]:
        """The operator's keys except observedGeneration and state, in wire form; the summary
        conditions (Ready, Reconciling, Stalled) are first brought in line with the rest, so every
        status write, the planner's or the applier's after an action, keeps them consistent."""
        self.conditions = cond.summarized(
            self.conditions, deleting=self.deleting, released=self.released, now=self.now, at=self.generation
        )
        keys = model.OperatorStatus(
            conditions=self.conditions,  # type: ignore[arg-type]  # validated into Condition
            backlog=self.backlog,
            workflow=self.workflow if self.workflow != model.WorkflowStatus() else None,
            job=self.job,
            workforce=self.workforce,
            taskforces=self.taskforces,
            worker_requests=self.worker_requests or None,
            scanner_credential=self.credential,
        ).to_kube()
        return {k: keys.get(k) for k in DRAFT_KEYS}

    @property
    def released(self) -> bool:
        """No workflow held and no Job running: what a deletion's abort waits for."""
        ended = self.job is None or self.job.state in ENDED_JOB_STATES
        return ended and not holds_workflow(self.workflow)

    def state(self, record: ScanRecord) -> str:
        """The REST state of the scan with these keys (actions change it, e.g. a deactivation)."""
        return scan_state(
            has_final_result=record.has_final_result,
            workflow_id=self.workflow.id,
            progress=record.progress,
            deactivated=self.workflow.deactivated,
            failed=self.true(cond.FAILED),
        )

    def set(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.conditions = cond.put(self.conditions, type_, status, reason, message, self.now, self.generation)

    def true(self, type_: str) -> bool:
        return cond.is_true(self.conditions, type_)

    def reason(self, type_: str) -> str | None:
        return cond.reason(self.conditions, type_)

    def message(self, type_: str) -> str:
        return cond.message(self.conditions, type_)


def plan(scan: ScanView, obs: Observed, now: float, settings: OperatorSettings) -> Plan:
    record = scan.record
    d = Draft.of(record, now, scan.generation, scan.deleting)
    p = Plan(status={}, draft=d)
    _observe_workflow(d, obs, settings)
    _observe_job(d, obs)
    if scan.deleting:
        _hard_delete(d, p, scan, obs)
    else:
        _restart_if_workflow_lost(d, p, scan, obs, now)
        _replace_if_transient(d, p, scan, obs, now, settings)
        _fail_if_stuck(d, p, scan, obs, now, settings)
        _refuse_invalid(d, p, scan, obs)
        if not (scan.spec.deleted or d.true(cond.FAILED)):
            _final_result(d, p, scan, now, settings)
            _start(d, p, scan, obs, now, settings)
        _stop_if_ended(d, p, scan, obs)
    _worker_requests(d, p, scan, settings)
    _revoke_credential(d, p, scan)
    _finalizer(d, p, scan)
    p.status = {
        "observedGeneration": scan.generation,
        "state": d.state(record),
        **d.wire(),
    }
    return p


# --- the steps ---


def _observe_workflow(d: Draft, obs: Observed, settings: OperatorSettings) -> None:
    if not d.workflow.id:
        return
    if obs.wms_poll_error and not d.workflow.deactivated:
        d.set(cond.WMS_AVAILABLE, False, "PollFailed", f"the WMS cannot be polled: {obs.wms_poll_error}")
    elif d.reason(cond.WMS_AVAILABLE) == "PollFailed":
        d.set(cond.WMS_AVAILABLE, True, "Reachable", "the WMS answers polls again")
    if obs.workflow is None:
        return
    if obs.workflow.deactivated and not d.workflow.deactivated:
        d.workflow.deactivated = obs.workflow.deactivated
    if obs.workflow.lost and not d.workflow.deactivated:
        d.set(cond.WORKFLOW_READY, False, "WorkflowLost", _lost_message(d.workflow.id))
    d.workforce = workforce.summarize(obs.workflow.taskforces)
    d.taskforces = workforce.compact(obs.workflow.taskforces, settings.wms_cluster_schedds)


def _lost_message(workflow_id: str | None) -> str:
    return f"the WMS no longer knows workflow {workflow_id}: no worker will come for it"


def _workflow_lost(d: Draft, obs: Observed) -> bool:
    return bool(d.workflow.id and not d.workflow.deactivated and obs.workflow and obs.workflow.lost)


def _latest_pod(pods: tuple[PodView, ...]) -> PodView | None:
    return max(pods, key=lambda p: (p.started_at or 0.0, p.name), default=None)


def _observe_job(d: Draft, obs: Observed) -> None:
    if obs.job is None:
        if d.job and d.job.state not in ENDED_JOB_STATES:
            d.job.state = "Deleted"
            d.set(cond.SCANNER_RUNNING, False, "JobDeleted", f"Job {d.job.name} is gone")
        return
    job = obs.job
    pod = _latest_pod(obs.pods)
    failed_pod = next((p for p in obs.pods if p.phase == "Failed"), None)
    if job.failed or failed_pod:
        state, reason = "Failed", (failed_pod.reason if failed_pod else None) or job.reason or "Failed"
    elif job.complete or (pod and pod.phase == "Succeeded"):
        state, reason = "Succeeded", "Completed"
    elif pod and pod.phase == "Running":
        state, reason = "Running", "Running"
    else:
        state, reason = "Pending", (pod.reason if pod else None) or "Pending"
    previous = d.job or model.JobStatus(name=job.name)
    d.job = previous.model_copy(
        update={
            "name": job.name,
            "created_at": previous.created_at or job.created_at,
            "started_at": (pod.started_at if pod else None) or previous.started_at,
            "state": state,
            "reason": reason,
        }
    )
    message = f"pod {pod.name} is {pod.phase}" if pod else f"Job {job.name} has no pod yet"
    if failed_pod and failed_pod.exit_code is not None:
        message = f"pod {failed_pod.name} failed: {reason} (exit code {failed_pod.exit_code})"
    d.set(cond.SCANNER_RUNNING, state == "Running", cond.reason_of(reason), message)


def _hard_delete(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
    """`kubectl delete`: abort the workflow, delete the Job; the finalizer goes once nothing is held."""
    _release(d, p, scan)
    if obs.job and not obs.job.deleting:
        p.actions.append(DeleteJob(obs.job.name))


def _release(d: Draft, p: Plan, scan: ScanView) -> None:
    wf = d.workflow
    if wf.id and not wf.deactivated:
        p.actions.append(Deactivate(wf.id, "abort"))
    elif wf.requested_at and not wf.id:
        p.actions.append(RecoverWorkflow({}, scan.uid, create_if_missing=False))


def _replace_if_transient(
    d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings
) -> None:
    """A scanner pod killed for a transient reason, or a started scan whose WMS workflow is lost, gets
    exactly one replacement scan (throttled), as the reference's watchdog rescans a killed scanner."""
    spec, job = scan.spec, d.job
    if job and job.replacement:
        if not spec.replaced_by or not obs.replacement_exists:
            p.actions.append(Replace(job.replacement, replacement_body(scan, job.replacement)))
        return
    if spec.deleted or spec.replaced_by or scan.record.has_final_result:
        return
    dead = next((pod for pod in obs.pods if pod.transient_failure), None)
    if dead is not None:
        why, throttled = (
            f"pod {dead.name}: {dead.reason or 'killed'} (exit code {dead.exit_code})",
            "ReplacementThrottled",
        )
    elif job is not None and _workflow_lost(d, obs) and _stalled_since_lost(d, p, scan, obs, now, settings):
        why, throttled = _lost_message(d.workflow.id), "WorkflowLost"
    else:
        return
    if obs.lineage_recent > settings.replacement_max_scans:
        if not d.true(cond.FAILED):
            d.set(cond.FAILED, True, throttled, f"{why}; too many rescans of this request recently")
            p.event(throttled, why, warning=True)
        return
    new_id = obs.fresh_id or model.new_scan_id(now, scan.uid.replace("-", ""))
    if d.job:
        d.job.replacement = new_id
    p.actions.append(Replace(new_id, replacement_body(scan, new_id)))
    p.event("Replacing", f"{why}; replacing with scan {new_id}", warning=True)


def _fail_if_stuck(
    d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings
) -> None:
    """A scanner whose container cannot start (its image cannot be pulled, its configuration is
    refused) would wait forever: past the grace (at once for an invalid name) the scan fails, saying
    why in the kubelet's words; `_stop_if_ended` then stops its Job."""
    pod = _latest_pod(obs.pods)
    if pod is None or pod.reason not in STUCK_REASONS or scan.spec.deleted or d.true(cond.FAILED):
        return
    waited = now - (pod.started_at or now)
    if pod.reason not in NEVER_STARTS and waited < settings.image_pull_grace_seconds:
        p.wake(settings.image_pull_grace_seconds - waited)
        return
    message = f"pod {pod.name}: {pod.reason} for {waited:.0f}s: {pod.message or 'no message'}"
    d.set(cond.FAILED, True, STUCK_REASONS[pod.reason], message)
    p.event(STUCK_REASONS[pod.reason], message, warning=True)


def _refuse_invalid(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
    """A Scan made with kubectl skips the REST shim's checks, so the operator holds its spec to the same
    rules (`skyscan.policy`: the model with its request policies, the tag catalog and minimum, the env
    allow-list, the known clusters and worker bounds) before it does anything for the scan (looks for
    its sensor event, requests a workflow, issues a credential, creates a Job): one that breaks one is
    Failed/InvalidSpec, the message naming the field; `_stop_if_ended` then releases what an earlier
    generation of its spec started.

    The check holds until the scan's Job exists, for each generation of its spec (an edit before the
    start is checked too); a started scan is never failed by it: its Job no longer reads the spec, and
    a catalog or settings change must not kill scans that were valid when they started."""
    refusal = obs.refusal
    if refusal is None or d.job is not None or scan.spec.deleted or d.true(cond.FAILED):
        return
    _fail_invalid(d, p, str(refusal))


def _fail_invalid(d: Draft, p: Plan, message: str) -> None:
    if len(message) > REFUSAL_MAX_CHARS:  # it quotes what the spec holds, which may be long
        message = message[: REFUSAL_MAX_CHARS - 1] + "…"
    d.set(cond.FAILED, True, "InvalidSpec", message)
    d.set(cond.ADMITTED, False, "InvalidSpec", message)
    d.backlog = None
    p.event("InvalidSpec", message, warning=True)


def refuse_unreadable(
    body: dict[str, Any], refusal: policy.Refusal, now: float
) -> tuple[dict[str, Any], list[Event]] | None:
    """The operator's status keys, and the events to post, for a Scan whose spec the model cannot read
    even leniently (a map key the CRD schema cannot see, such as a classifier key over 25 characters),
    so that `plan` cannot plan it: a scan that has not started is Failed/InvalidSpec, as
    `_refuse_invalid` fails one. None when there is nothing to write: already failed, or started (no
    plan can stop what it started; it is reported invalid and left alone)."""
    record, meta = ScanRecord(body), body["metadata"]
    d = Draft.of(record, now, meta.get("generation"), record.deleting)
    if d.true(cond.FAILED) or d.job is not None or holds_workflow(d.workflow) or d.credential is not None:
        return None
    p = Plan(status={}, draft=d)
    _fail_invalid(d, p, str(refusal))
    return {"observedGeneration": meta.get("generation"), "state": d.state(record), **d.wire()}, p.events


# Labels by which GitOps tools claim an object: a replacement carrying them would be pruned as drift.
GITOPS_LABEL_PREFIXES = ("app.kubernetes.io/instance", "argocd.argoproj.io/", "kustomize.toolkit.fluxcd.io/")


def replacement_body(scan: ScanView, new_id: str) -> dict[str, Any]:
    labels = {k: v for k, v in scan.labels.items() if not k.startswith(GITOPS_LABEL_PREFIXES)}
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {"name": new_id, "namespace": scan.namespace, "labels": labels},
        "spec": model.rescan_spec(scan.raw_spec, scan.name),
    }


def _stalled_since_lost(
    d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings
) -> bool:
    """A started scan whose workflow is lost may still progress (workers already running need no WMS
    record): it is retried only once its scanner has not reported for the start timeout since the
    loss (and since its Job's creation), so no scan waits for workers longer than a start may."""
    assert obs.workflow is not None and d.job is not None
    created = cond.epoch(d.job.created_at) or 0.0
    quiet_since = max(obs.workflow.lost_since, scan.record.last_updated, created)
    due = quiet_since + settings.start_timeout_seconds
    if now >= due:
        return True
    d.set(
        cond.WORKFLOW_READY,
        False,
        "WorkflowLost",
        f"{_lost_message(d.workflow.id)}; rescanned at {cond.iso(due)} unless its scanner reports",
    )
    p.wake(due - now)
    return False


def _restart_if_workflow_lost(d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float) -> None:
    """A workflow lost before the scan's Job exists: forget it, so the next start attempt requests a
    new one; the attempt under way ends, counted (bounded by `max_start_attempts`). A started scan's
    lost workflow is `_replace_if_transient`'s."""
    if d.job is not None or not _workflow_lost(d, obs):
        return
    if scan.spec.deleted or scan.deleting or d.true(cond.FAILED) or scan.record.has_final_result:
        return
    message = _lost_message(d.workflow.id)
    d.workflow = model.WorkflowStatus()
    d.workforce, d.taskforces = None, None
    p.event("WorkflowLost", f"{message}; the next start attempt requests a new one", warning=True)
    if d.backlog is None:
        return
    if d.true(cond.ADMITTED):
        d.backlog.pending_since, d.backlog.interruptions = now, 0
        d.set(cond.ADMITTED, False, "WorkflowLost", f"start attempt {d.backlog.attempts} failed: {message}")


def _final_result(d: Draft, p: Plan, scan: ScanView, now: float, settings: OperatorSettings) -> None:
    result = scan.record.result()
    if result is None or not result.is_final:
        return
    d.set(cond.COMPLETE, True, "FinalResult", "the scanner recorded its final result")
    d.backlog = None
    wf = d.workflow
    if not wf.id or wf.deactivated:
        return
    due = (result.updated_at or now) + settings.teardown_delay_seconds
    if now >= due:
        p.actions.append(Deactivate(wf.id, "finished"))
    else:
        p.wake(due - now)


def _start(d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings) -> None:
    if d.true(cond.COMPLETE):
        return
    if d.job is not None:  # started; the backlog entry is gone
        if d.backlog is not None:
            d.backlog = None
            d.set(cond.ADMITTED, True, "Started", f"Job {d.job.name} created")
        return
    if d.backlog is None:
        d.backlog = model.BacklogStatus(entered_at=scan.created_at or now)
        d.set(cond.ADMITTED, False, "Queued", "waiting in the backlog")
        p.event("Queued", f"in the backlog with priority {scan.spec.priority}")
    attempts = d.backlog.attempts

    if not d.true(cond.ADMITTED):
        if d.reason(cond.ADMITTED) in ATTEMPT_FAILURES and attempts >= settings.max_start_attempts:
            message = d.message(cond.ADMITTED)
            d.set(
                cond.FAILED,
                True,
                "StartAttemptsExhausted",
                f"{attempts} start attempts failed; last: {message}",
            )
            d.backlog = None
            p.event(
                "StartAttemptsExhausted", f"gave up after {attempts} start attempts: {message}", warning=True
            )
            return
        if not _event_stored(d, p, scan, obs, now, settings):
            return
        if obs.admission is None:
            return
        if not obs.admission.granted:
            if obs.admission.reason != "RetryDelay":  # keep the failure's reason visible meanwhile
                d.set(cond.ADMITTED, False, obs.admission.reason, obs.admission.message)
            return
        attempts += 1
        d.backlog.attempts, d.backlog.pending_since = attempts, now
        d.set(cond.ADMITTED, True, "Admitted", f"start attempt {attempts} of {settings.max_start_attempts}")
        p.event("Admitted", f"start attempt {attempts} of {settings.max_start_attempts}")

    pending_since = max(d.backlog.pending_since or now, obs.healthy_since)
    if now - pending_since > settings.start_timeout_seconds:
        waiting_on = "message queues" if d.workflow.id else "the WMS workflow"
        d.set(cond.ADMITTED, False, "StartTimedOut", f"attempt {attempts}: still waiting on {waiting_on}")
        d.backlog.pending_since, d.backlog.interruptions = now, 0
        p.event("StartTimedOut", f"attempt {attempts} timed out waiting on {waiting_on}", warning=True)
        return
    p.wake(pending_since + settings.start_timeout_seconds - now + 0.01)
    _start_steps(d, p, scan, now, settings)


def event_recheck(age: float) -> float:
    """Seconds from a look that missed a scan's sensor event, `age` seconds after the scan was made, to
    the next look."""
    low, high = EVENT_RECHECK_SECONDS
    return min(high, max(low, age / 2))


def event_seen(look: tuple[bool, float] | None, created_at: float, now: float) -> bool | None:
    """What the last look at a scan's sensor event, (stored, when), says at `now`: stored, missing, or
    None when it was never looked at or its miss is due another look."""
    if look is None:
        return None
    stored, at = look
    return stored if stored or now < at + event_recheck(at - created_at) else None


def _event_stored(
    d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings
) -> bool:
    """No scan starts without its sensor event. The REST shim stores it beside the Scan, so a
    missing one is waited for and looked at again (`event_recheck`); it is shown missing once the scan
    is `EVENT_QUIET_SECONDS` old, and fails the scan after `event_grace_seconds`."""
    if obs.event:
        if d.reason(cond.ADMITTED) == "EventMissing":
            d.set(cond.ADMITTED, False, "Queued", "waiting in the backlog")
        return True
    if obs.event is None:
        p.actions.append(CheckEvent(scan.spec.sensor_event_id))
        return False
    name = names.event_object_name(scan.spec.sensor_event_id)
    due = scan.created_at + settings.event_grace_seconds
    if now >= due:
        message = (
            f"its sensor event (ConfigMap {name}) was not stored within {settings.event_grace_seconds:g}s"
        )
        d.set(cond.FAILED, True, "EventMissing", message)
        d.set(cond.ADMITTED, False, "EventMissing", message)
        d.backlog = None
        p.event("EventMissing", message, warning=True)
        return False
    age = now - scan.created_at
    if age >= EVENT_QUIET_SECONDS:
        d.set(cond.ADMITTED, False, "EventMissing", f"waiting for its sensor event (ConfigMap {name})")
    p.wake(min(event_recheck(age), due - now))
    return False


def _start_steps(d: Draft, p: Plan, scan: ScanView, now: float, settings: OperatorSettings) -> None:
    wf = d.workflow
    if not wf.id:
        body = scanner_job.workflow_request(scan.name, scan.uid, scan.spec, settings, now)
        requested_at = cond.epoch(wf.requested_at)
        if requested_at is None:
            wf.requested_at, wf.address = cond.iso(now), settings.wms_base_url
            d.set(cond.WORKFLOW_READY, False, "Requesting", "requesting a WMS workflow")
            p.actions.append(RequestWorkflow(body))
        elif now - requested_at >= settings.wms_timeout_seconds:
            # Requested before but no id recorded: the answer was lost. Look before asking again.
            p.actions.append(RecoverWorkflow(body, scan.uid, create_if_missing=True))
        else:
            p.wake(requested_at + settings.wms_timeout_seconds - now)
        return
    if not wf.queues_activated:
        d.set(
            cond.WORKFLOW_READY,
            False,
            "WaitingForQueues",
            f"workflow {wf.id}: message queues not activated",
        )
        p.actions.append(ProvisionQueues(wf.id))
        return
    d.set(cond.WORKFLOW_READY, True, "QueuesActivated", f"workflow {wf.id} is ready")
    if d.credential is None:
        p.actions.append(IssueScannerCredential(scanner_job.credential_lifetime(settings)))
    if refused := scanner_job.user_env(scan.spec, settings)[1]:  # a Scan made with kubectl: say so
        message = f"not on the scanner's env allow-list, left out: {', '.join(refused)}"
        p.event("ScannerEnvRefused", message, warning=True)
    p.actions.append(
        CreateJob(scanner_job.build_job(scan.name, scan.uid, scan.namespace, scan.spec, settings))
    )


def _stop_if_ended(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
    """Soft-deleted, replaced or failed: leave the backlog, abort the workflow, stop the Job."""
    spec, job = scan.spec, d.job
    if spec.deleted:
        reason = "Replaced" if spec.replaced_by else "SoftDeleted"
        message = f"replaced by scan {spec.replaced_by}" if spec.replaced_by else "deleted"
        if not d.true(cond.DELETED):
            p.event(reason, message)
        d.set(cond.DELETED, True, reason, message)
        if d.true(cond.ADMITTED) and d.backlog is not None:
            d.set(cond.ADMITTED, False, "Deleted", "deleted before it started")
        if obs.job and not obs.job.deleting:
            p.actions.append(DeleteJob(obs.job.name))
    elif job and job.state == "Failed" and not job.replacement and not d.true(cond.FAILED):
        if not scan.record.has_final_result:
            d.set(cond.FAILED, True, "ScannerFailed", f"the scanner failed: {job.reason}")
            p.event("ScannerFailed", f"the scanner failed: {job.reason}", warning=True)
    if spec.deleted or d.true(cond.FAILED):
        d.backlog = None
        _release(d, p, scan)
    live = obs.job if obs.job and not obs.job.deleting else None
    if (
        d.true(cond.FAILED)
        and not spec.deleted
        and live
        and (job is None or job.state not in ENDED_JOB_STATES)
    ):
        p.actions.append(DeleteJob(live.name))  # e.g. its workflow lost: the scanner would wait in vain


def _worker_requests(d: Draft, p: Plan, scan: ScanView, settings: OperatorSettings) -> None:
    if not scan.spec.worker_requests and not d.worker_requests:
        return
    wanted = {r.id for r in scan.spec.worker_requests}
    outcomes = [o for o in d.worker_requests or [] if o.id in wanted]
    answered = {o.id for o in outcomes}
    wf = d.workflow
    for r in scan.spec.worker_requests:
        if r.id in answered:
            continue
        refusal = workers_refusal(
            deleted=scan.spec.deleted or scan.deleting,
            has_final_result=scan.record.has_final_result,
            workflow_id=wf.id,
            deactivated=wf.deactivated,
        )
        if r.n_workers > settings.max_n_workers:  # REST's bound (a Scan edited with kubectl skips it)
            refusal = f"'n_workers': must be no more than {settings.max_n_workers}"
        if refusal or not wf.id:
            outcomes.append(model.WorkerRequestOutcome(id=r.id, state="Refused", reason=refusal))
        else:
            p.actions.append(
                AddWorkers(r.id, wf.id, settings.wms_cluster(r.location), r.n_workers, r.location)
            )
    d.worker_requests = outcomes or None


def _revoke_credential(d: Draft, p: Plan, scan: ScanView) -> None:
    """The scanner's token lives as long as its scanner may act: no longer once the scan is deleted
    (soft or hard), failed, or its Job has ended."""
    cred = d.credential
    if cred is None or cred.revoked:
        return
    ended = d.job is not None and d.job.state in ENDED_JOB_STATES
    if scan.deleting or scan.spec.deleted or d.true(cond.FAILED) or ended:
        p.actions.append(RevokeScannerCredential(cred.secret))


def _finalizer(d: Draft, p: Plan, scan: ScanView) -> None:
    want = holds_workflow(d.workflow)
    have = names.WORKFLOW_FINALIZER in scan.finalizers
    if want and not have and not scan.deleting:
        p.actions.insert(0, SetFinalizer(True))  # before the workflow request it guards
    elif have and not want:
        p.actions.append(SetFinalizer(False))
