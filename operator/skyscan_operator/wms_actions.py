"""The actions on the WMS: a scan's workflow requested (after its intent marker is written), recovered
by its marker when an answer was lost, its queues provisioned (their Secret), deactivated (abort or
finished), and workers added. A workflow id goes to status the moment the WMS returns it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from skyscan import conditions as cond
from skyscan import model
from skyscan_operator import metrics, scanner_job
from skyscan_operator.actions import AddWorkers, Deactivate, ProvisionQueues, RecoverWorkflow, RequestWorkflow
from skyscan_operator.execution import Execution, Handler
from skyscan_operator.kube_actions import apply_owned
from skyscan_operator.refusals import refused_workers, workflow_refusal
from skyscan_operator.wms_client import WMSError, WMSUnavailable


async def request_workflow(run: Execution, action: RequestWorkflow) -> float:
    await _request(run, action.body)
    return 0.0


async def _request(run: Execution, body: dict[str, Any]) -> None:
    wms = await run.need_wms()
    run.event("WorkflowRequested", f"requesting a WMS workflow from {wms.base_url}")
    async with run.wms_call(attempt=True):
        try:
            resp = await wms.request_workflow(body)
        except WMSError as e:
            if not isinstance(e, WMSUnavailable):
                run.workflow().requested_at = None  # a definite refusal: nothing was created
                await _fail_scan(run, *workflow_refusal(e, _requested_clusters(run)))
            raise
    await _record_workflow(run, str(resp["workflow"]["workflow_id"]), "WorkflowCreated")


def _requested_clusters(run: Execution) -> dict[str, str]:
    """The scan's cluster locations as the WMS is asked for them -> as the scan asked."""
    asked = (c.location for c in run.scan.spec.request_clusters)
    return {run.settings.wms_cluster(name): name for name in asked}


async def _fail_scan(run: Execution, reason: str, message: str) -> NoReturn:
    """The WMS refused what the scan asks for: asking again cannot help, so the scan fails at once
    (no further start attempt), saying why; the next pass releases what it holds."""
    run.draft.backlog = None
    run.condition(cond.FAILED, True, reason, message)
    run.condition(cond.ADMITTED, False, reason, message)
    run.wms_ok()  # it answered
    metrics.START_FAILURES.labels(reason).inc()
    run.event(reason, message, warning=True)
    await run.stop()


async def _record_workflow(run: Execution, workflow_id: str, reason: str) -> None:
    """The workflow id goes to status the moment the WMS returns it."""
    wf, wms = run.workflow(), run.executor.wms
    wf.id, wf.address = workflow_id, wms.base_url if wms else wf.address
    message = f"workflow {workflow_id}: message queues not activated"  # as the next plan says
    run.condition(cond.WORKFLOW_READY, False, "WaitingForQueues", message)
    run.wms_ok()
    await run.flush()
    run.event(reason, f"WMS workflow {workflow_id}")


async def recover_workflow(run: Execution, action: RecoverWorkflow) -> float:
    wms = await run.need_wms()
    async with run.wms_call(attempt=action.create_if_missing):
        found = await wms.find_workflows_by_marker(action.marker)
    if found:
        keep, *extra = found
        for other in extra:  # should not happen; never leave a duplicate running
            run.event("DuplicateWorkflow", f"aborting duplicate WMS workflow {other}", warning=True)
            await wms.deactivate(other, "abort")
        await _record_workflow(run, keep, "WorkflowRecovered")
        return 0.0
    wf = run.workflow()
    if not action.create_if_missing:
        wf.requested_at = None  # nothing was created: nothing to release
        return 0.0
    run.event("WorkflowNotFound", "the earlier workflow request left no workflow; requesting again")
    wf.requested_at = cond.iso(run.now())  # a fresh intent marker before the new request
    await run.flush()
    await _request(run, action.body)
    return 0.0


async def provision_queues(run: Execution, action: ProvisionQueues) -> float | None:
    wms, workflow_id, settings = await run.need_wms(), action.workflow_id, run.settings
    unknown_wait = max(settings.queue_poll_seconds, settings.wms_poll_interval_seconds)
    try:
        profiles = await wms.public_mq_profiles(workflow_id)
    except WMSError as e:  # unreachable: back to the backlog; refused: poll again (until the timeout)
        wait = settings.queue_poll_seconds
        if e.status == 404:  # unknown to the WMS: the batched poll tells if it is lost; no tight loop
            wait = unknown_wait
        await run.wms_refused(e, attempt=isinstance(e, WMSUnavailable), wait=wait)
    if not profiles:  # EWMS's MQS answers an unknown workflow so (a known one has its queues): as a 404
        return unknown_wait
    connection = scanner_job.ewms_connection(profiles)
    if connection is None:
        return settings.queue_poll_seconds
    s = run.scan
    await apply_owned(run, scanner_job.build_secret(s.name, s.uid, s.namespace, connection))
    run.workflow().queues_activated = True
    run.condition(cond.WORKFLOW_READY, True, "QueuesActivated", f"workflow {workflow_id} is ready")
    run.wms_ok()
    run.event("QueuesActivated", f"message queues of workflow {workflow_id} are activated")
    return 0.0


async def deactivate(run: Execution, action: Deactivate) -> None:
    wms, workflow_id, how = await run.need_wms(), action.workflow_id, action.how
    async with run.wms_call(wait=run.settings.queue_poll_seconds):
        changed = await wms.deactivate(workflow_id, how)
        deactivated = "ABORTED" if how == "abort" else "FINISHED"
        if not changed:  # already deactivated: learn how, for the REST state
            try:
                deactivated = (await wms.get_workflow(workflow_id)).get("deactivated") or deactivated
            except WMSError as e:
                if e.status != 404:
                    raise
    wf = run.workflow()
    wf.deactivated = deactivated
    if how == "abort":
        wf.abort_requested_at = cond.iso(run.now())
    else:
        wf.finish_requested_at = cond.iso(run.now())
    run.condition(cond.WORKFLOW_READY, False, deactivated.title(), f"workflow {workflow_id}: {deactivated}")
    run.wms_ok()
    verb = "aborted" if how == "abort" else "finished"
    run.event(
        f"Workflow{verb.title()}", f"WMS workflow {workflow_id} {verb}" + ("" if changed else " already")
    )


async def add_workers(run: Execution, r: AddWorkers) -> None:
    wms = await run.need_wms()
    outcome: model.WorkerRequestOutcome
    try:
        tf = await wms.add_workers(r.workflow_id, r.location, r.n_workers)
        outcome = model.WorkerRequestOutcome(
            id=r.request_id,
            state="Succeeded",
            taskforce_uuid=tf["taskforce_uuid"],
            n_workers=tf["n_workers"],
        )
        run.wms_ok()
        run.event(
            "WorkersAdded", f"{tf['n_workers']} workers at {r.location}: taskforce {tf['taskforce_uuid']}"
        )
    except WMSError as e:
        state, reason = refused_workers(e, r.location, r.asked)
        outcome = model.WorkerRequestOutcome(id=r.request_id, state=state, reason=reason)
        run.event("AddWorkersFailed", reason, warning=True)
    run.draft.worker_requests = [*(run.draft.worker_requests or []), outcome]


WMS_ACTIONS: dict[type, Handler] = {
    RequestWorkflow: request_workflow,
    RecoverWorkflow: recover_workflow,
    ProvisionQueues: provision_queues,
    Deactivate: deactivate,
    AddWorkers: add_workers,
}
