"""The planner's steps that end a scan before its final result, or start it anew (pure): deleted (soft,
with REST's DELETE or a replacement; hard, with kubectl), failed (a scanner that cannot start, a spec
REST would have refused, its workflow lost), replaced (a scanner killed for a transient reason, a
started scan's workflow lost); and what is released then (the workflow, the Job).
"""

from __future__ import annotations

from typing import Any

from skyscan import conditions as cond
from skyscan import model, policy
from skyscan.scan_record import ENDED_JOB_STATES, ScanRecord, holds_workflow
from skyscan_operator.actions import Deactivate, DeleteJob, RecoverWorkflow, Replace
from skyscan_operator.draft import Draft, Event, Plan
from skyscan_operator.observed import Observed, PodView, ScanView
from skyscan_operator.settings import OperatorSettings

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
REFUSAL_MAX_CHARS = 1024  # of an InvalidSpec condition's message (an Event's is cut there too)
# Labels by which GitOps tools claim an object: a replacement carrying them would be pruned as drift.
GITOPS_LABEL_PREFIXES = ("app.kubernetes.io/instance", "argocd.argoproj.io/", "kustomize.toolkit.fluxcd.io/")


def lost_message(workflow_id: str | None) -> str:
    return f"the WMS no longer knows workflow {workflow_id}: no worker will come for it"


def _workflow_lost(d: Draft, obs: Observed) -> bool:
    return bool(d.workflow.id and not d.workflow.deactivated and obs.workflow and obs.workflow.lost)


def latest_pod(pods: tuple[PodView, ...]) -> PodView | None:
    return max(pods, key=lambda p: (p.started_at or 0.0, p.name), default=None)


def scanner_ended(obs: Observed) -> bool:
    """The Job's scanner has ended (the Job finished, or each of its Pods did): nothing to stop. Its Job
    is left to its TTL, so that its Pod, whose log the operator keeps (`log_keeper`), stays until then."""
    job = obs.job
    finished = bool(obs.pods) and all(pod.phase in ("Succeeded", "Failed") for pod in obs.pods)
    return job is not None and (job.complete or job.failed or finished)


def hard_delete(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
    """`kubectl delete`: abort the workflow, delete the Job; the finalizer goes once nothing is held."""
    release(d, p, scan)
    if obs.job and not obs.job.deleting:
        p.actions.append(DeleteJob(obs.job.name))


def release(d: Draft, p: Plan, scan: ScanView) -> None:
    wf = d.workflow
    if wf.id and not wf.deactivated:
        p.actions.append(Deactivate(wf.id, "abort"))
    elif wf.requested_at and not wf.id:
        p.actions.append(RecoverWorkflow({}, scan.uid, create_if_missing=False))


def replace_if_transient(
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
        why, throttled = lost_message(d.workflow.id), "WorkflowLost"
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


def fail_if_stuck(
    d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float, settings: OperatorSettings
) -> None:
    """A scanner whose container cannot start (its image cannot be pulled, its configuration is
    refused) would wait forever: past the grace (at once for an invalid name) the scan fails, saying
    why in the kubelet's words; `stop_if_ended` then stops its Job."""
    pod = latest_pod(obs.pods)
    if pod is None or pod.reason not in STUCK_REASONS or scan.spec.deleted or d.true(cond.FAILED):
        return
    waited = now - (pod.started_at or now)
    if pod.reason not in NEVER_STARTS and waited < settings.image_pull_grace_seconds:
        p.wake(settings.image_pull_grace_seconds - waited)
        return
    message = f"pod {pod.name}: {pod.reason} for {waited:.0f}s: {pod.message or 'no message'}"
    d.set(cond.FAILED, True, STUCK_REASONS[pod.reason], message)
    p.event(STUCK_REASONS[pod.reason], message, warning=True)


def refuse_invalid(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
    """A Scan made with kubectl skips the REST shim's checks, so the operator holds its spec to the same
    rules (`skyscan.policy`: the model with its request policies, the tag catalog and minimum, the env
    allow-list, the known clusters and worker bounds) before it does anything for the scan (looks for
    its sensor event, requests a workflow, issues a credential, creates a Job): one that breaks one is
    Failed/InvalidSpec, the message naming the field; `stop_if_ended` then releases what an earlier
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
    `refuse_invalid` fails one. None when there is nothing to write: already failed, or started (no
    plan can stop what it started; it is reported invalid and left alone)."""
    record, meta = ScanRecord(body), body["metadata"]
    d = Draft.of(record, now, meta.get("generation"), record.deleting)
    if d.true(cond.FAILED) or d.job is not None or holds_workflow(d.workflow) or d.credential is not None:
        return None
    p = Plan(status={}, draft=d)
    _fail_invalid(d, p, str(refusal))
    return {"observedGeneration": meta.get("generation"), **d.stated(record), **d.wire()}, p.events


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
        f"{lost_message(d.workflow.id)}; rescanned at {cond.iso(due)} unless its scanner reports",
    )
    p.wake(due - now)
    return False


def restart_if_workflow_lost(d: Draft, p: Plan, scan: ScanView, obs: Observed, now: float) -> None:
    """A workflow lost before the scan's Job exists: forget it, so the next start attempt requests a
    new one; the attempt under way ends, counted (bounded by `max_start_attempts`). A started scan's
    lost workflow is `replace_if_transient`'s."""
    if d.job is not None or not _workflow_lost(d, obs):
        return
    if scan.spec.deleted or scan.deleting or d.true(cond.FAILED) or scan.record.has_final_result:
        return
    message = lost_message(d.workflow.id)
    d.workflow = model.WorkflowStatus()
    d.workforce, d.taskforces = None, None
    p.event("WorkflowLost", f"{message}; the next start attempt requests a new one", warning=True)
    if d.backlog is None:
        return
    if d.true(cond.ADMITTED):
        d.backlog.pending_since, d.backlog.interruptions = now, 0
        d.set(cond.ADMITTED, False, "WorkflowLost", f"start attempt {d.backlog.attempts} failed: {message}")


def stop_if_ended(d: Draft, p: Plan, scan: ScanView, obs: Observed) -> None:
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
        if obs.job and not obs.job.deleting and not scanner_ended(obs):
            p.actions.append(DeleteJob(obs.job.name))
    elif job and job.state == "Failed" and not job.replacement and not d.true(cond.FAILED):
        if not scan.record.has_final_result:
            d.set(cond.FAILED, True, "ScannerFailed", f"the scanner failed: {job.reason}")
            p.event("ScannerFailed", f"the scanner failed: {job.reason}", warning=True)
    if spec.deleted or d.true(cond.FAILED):
        d.backlog = None
        release(d, p, scan)
    live = obs.job if obs.job and not obs.job.deleting else None
    if (
        d.true(cond.FAILED)
        and not spec.deleted
        and live
        and (job is None or job.state not in ENDED_JOB_STATES)
    ):
        p.actions.append(DeleteJob(live.name))  # e.g. its workflow lost: the scanner would wait in vain
