"""The one planner (pure): from a Scan and what was observed, the next status and the actions to take.

`plan(scan, observed, now, settings)` never does I/O. The handlers gather `Observed` (the Job and
its Pods from watch caches, the WMS workflow from the batched poller, the backlog's decision) and
the executor carries out the `Plan`: first the status patch (so intent markers such as
`workflow.requestedAt` are stored before the request they announce), then the actions in order.
Outcomes of actions are recorded by the executor and lead to another pass; nothing here depends on
which handler ran last.

A scan's life, as the status tells it:
  backlog entry (Admitted=False, reason why it waits) -> admitted (start attempt n) ->
  workflow requested (intent marker, then id) -> queues activated (Secret) -> Job created
  (backlog entry removed) -> pod running/ended -> final result -> WMS `finished` after a delay.
Soft delete, hard delete (finalizer), failed start attempts and replaced scans end it early, and a
spec that REST would have refused (a Scan made with kubectl) ends it before it starts.

What it reads is in `observed`, what it decides in `draft` (the Plan, its status Draft) and `actions`;
the steps that end a scan early are `endings`'; the start and the rest are here.
"""

from __future__ import annotations

from skyscan import conditions as cond
from skyscan import model, names
from skyscan.scan_record import ENDED_JOB_STATES, holds_workflow
from skyscan.state import workers_refusal
from skyscan_operator import endings, scanner_job, workforce
from skyscan_operator.actions import (
    AddWorkers,
    CheckEvent,
    CreateJob,
    Deactivate,
    IssueScannerCredential,
    ProvisionQueues,
    RecoverWorkflow,
    RequestWorkflow,
    RevokeScannerCredential,
    SetFinalizer,
)
from skyscan_operator.draft import Draft, Plan
from skyscan_operator.observed import Observed, ScanView
from skyscan_operator.settings import OperatorSettings

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


def plan(scan: ScanView, obs: Observed, now: float, settings: OperatorSettings) -> Plan:
    record = scan.record
    d = Draft.of(record, now, scan.generation, scan.deleting)
    p = Plan(status={}, draft=d)
    _observe_workflow(d, obs, settings)
    _observe_job(d, obs)
    if scan.deleting:
        endings.hard_delete(d, p, scan, obs)
    else:
        endings.restart_if_workflow_lost(d, p, scan, obs, now)
        endings.replace_if_transient(d, p, scan, obs, now, settings)
        endings.fail_if_stuck(d, p, scan, obs, now, settings)
        endings.refuse_invalid(d, p, scan, obs)
        if not (scan.spec.deleted or d.true(cond.FAILED)):
            _final_result(d, p, scan, now, settings)
            _start(d, p, scan, obs, now, settings)
        endings.stop_if_ended(d, p, scan, obs)
    _worker_requests(d, p, scan, settings)
    _revoke_credential(d, p, scan)
    _finalizer(d, p, scan)
    p.status = {
        "observedGeneration": scan.generation,
        **d.stated(record),
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
        d.set(cond.WORKFLOW_READY, False, "WorkflowLost", endings.lost_message(d.workflow.id))
    d.workforce = workforce.summarize(obs.workflow.taskforces)
    d.taskforces = workforce.compact(obs.workflow.taskforces, settings.wms_cluster_schedds)


def _observe_job(d: Draft, obs: Observed) -> None:
    if obs.job is None:
        if d.job and d.job.state not in ENDED_JOB_STATES:
            d.job.state = "Deleted"
            d.set(cond.SCANNER_RUNNING, False, "JobDeleted", f"Job {d.job.name} is gone")
        return
    job = obs.job
    pod = endings.latest_pod(obs.pods)
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
            "pod": pod.name if pod else previous.pod,
            "state": state,
            "reason": reason,
        }
    )
    message = f"pod {pod.name} is {pod.phase}" if pod else f"Job {job.name} has no pod yet"
    if failed_pod and failed_pod.exit_code is not None:
        message = f"pod {failed_pod.name} failed: {reason} (exit code {failed_pod.exit_code})"
    d.set(cond.SCANNER_RUNNING, state == "Running", cond.reason_of(reason), message)


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
            if obs.admission.reason not in ("", "RetryDelay"):  # keep the failure's reason visible
                d.set(cond.ADMITTED, False, obs.admission.reason, obs.admission.message)
            if place := obs.admission.place:
                d.backlog.wait_reason, d.backlog.position = place.wait, place.position
                d.backlog.estimated_start = place.start_at
            return
        attempts += 1
        d.backlog.attempts, d.backlog.pending_since = attempts, now
        d.backlog.wait_reason = d.backlog.position = d.backlog.estimated_start = None
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
