"""Ending a scan early: soft delete, hard delete through the finalizer, and add-workers outcomes."""

from __future__ import annotations

import time

from skyscan.io import kube
from skyscan.io.kube import Kube, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    get_scan,
    running_scan,
    scan_events,
    st,
    wait_scan,
)

MERGE = "application/merge-patch+json"
OSG_SCHEDD = "grid-submitter.icecube.wisc.edu"  # EWMS names a taskforce's cluster by its schedd


async def job_gone(api: Kube, namespace: str, name: str) -> bool:
    try:
        await api.request("GET", kube.path("batch/v1", "jobs", namespace, f"skyscan-{name}"))
    except KubeError as e:
        return e.status == 404
    return False


async def test_soft_delete_aborts_the_workflow_and_removes_the_job(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    scan = await running_scan(api, namespace)
    name, uid = scan["metadata"]["name"], scan["metadata"]["uid"]
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"deleted": True}}, content_type=MERGE
    )
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("workflow") or {}).get("deactivated"))
    assert scan["status"]["workflow"]["deactivated"] == "ABORTED"
    assert scan["status"]["state"] == "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP"
    assert condition(scan, "Deleted")["reason"] == "SoftDeleted"
    (workflow,) = await wms.workflows(marker=uid)
    assert workflow["deactivated"] == "ABORTED"
    await eventually(lambda: job_gone(api, namespace, name))
    scan = await wait_scan(
        api, namespace, name, lambda s: FINALIZER not in (s["metadata"].get("finalizers") or [])
    )
    assert scan["spec"]["deleted"] is True  # the record stays readable
    await scan_events(api, namespace, name, "SoftDeleted", "WorkflowAborted", "JobDeleted")


async def test_hard_delete_goes_through_the_finalizer(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    scan = await running_scan(api, namespace)
    name, uid = scan["metadata"]["name"], scan["metadata"]["uid"]
    assert scan["metadata"]["finalizers"] == [FINALIZER]
    await api.request("DELETE", scan_path(namespace, name))

    async def gone() -> bool:
        try:
            await get_scan(api, namespace, name)
        except KubeError as e:
            return e.status == 404
        return False

    await eventually(gone)
    (workflow,) = await wms.workflows(marker=uid)
    assert workflow["deactivated"] == "ABORTED"  # released before the Scan went
    await eventually(lambda: job_gone(api, namespace, name), timeout=60)


async def test_a_queued_scan_holds_nothing_and_deletes_at_once(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_MAX_RUNNING_SCANNERS="1", **HOLD)
    await running_scan(api, namespace)
    queued = await create_scan(api, namespace)
    scan = await wait_scan(
        api, namespace, queued, lambda s: condition(s, "Admitted").get("reason") == "ConcurrencyLimit"
    )
    assert not scan["metadata"].get("finalizers")
    await api.request(
        "PATCH", scan_path(namespace, queued), body={"spec": {"deleted": True}}, content_type=MERGE
    )
    scan = await wait_scan(api, namespace, queued, lambda s: condition(s, "Deleted").get("status") == "True")
    assert scan["status"].get("backlog") is None and scan["status"]["state"] == "PENDING__PRESTARTUP"
    assert len(await wms.workflows()) == 1  # only the running scan's


async def test_add_workers_records_the_taskforce_or_the_wms_error(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    scan = await running_scan(api, namespace)
    name = scan["metadata"]["name"]
    requests = [
        {"id": "r1", "location": "osg", "nWorkers": 7},
        {"id": "r2", "location": "nowhere", "nWorkers": 3},
    ]
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"workerRequests": requests}}, content_type=MERGE
    )
    scan = await wait_scan(api, namespace, name, lambda s: len(st(s).get("workerRequests") or []) == 2)
    outcomes = {o["id"]: o for o in scan["status"]["workerRequests"]}
    assert outcomes["r1"]["state"] == "Succeeded" and outcomes["r1"]["nWorkers"] == 7
    (workflow,) = await wms.workflows(marker=scan["metadata"]["uid"])
    added = [tf for tf in workflow["taskforces"] if tf["taskforce_uuid"] == outcomes["r1"]["taskforceUuid"]]
    assert added and added[0]["n_workers"] == 7 and added[0]["schedd"] == OSG_SCHEDD
    assert outcomes["r2"]["state"] == "Rejected"  # the shim's 400
    assert outcomes["r2"]["reason"].startswith("the WMS refused workers at cluster 'nowhere': ")
    assert "HTTP 400" in outcomes["r2"]["reason"]


async def test_add_workers_is_passed_on_while_the_queues_are_not_active(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """The WMS takes workers for a workflow whose queues wait, as the reference asks it at once:
    the request is not held until the scanner can start."""
    await wms.call("PATCH", "/_sim/config", {"activation_delay": 3600})
    operator()
    name = await create_scan(api, namespace)
    await wait_scan(
        api, namespace, name, lambda s: condition(s, "WorkflowReady").get("reason") == "WaitingForQueues"
    )
    asked = time.monotonic()
    request = {"id": "r1", "location": "sub-2", "nWorkers": 4}
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"workerRequests": [request]}}, content_type=MERGE
    )
    scan = await wait_scan(api, namespace, name, lambda s: bool(st(s).get("workerRequests")))
    took = time.monotonic() - asked
    (outcome,) = scan["status"]["workerRequests"]
    assert outcome["state"] == "Succeeded" and outcome["nWorkers"] == 4, outcome
    assert condition(scan, "WorkflowReady").get("reason") == "WaitingForQueues"  # still waiting
    (workflow,) = await wms.workflows(marker=scan["metadata"]["uid"])
    added = [tf for tf in workflow["taskforces"] if tf["taskforce_uuid"] == outcome["taskforceUuid"]]
    assert added and added[0]["schedd"] == OSG_SCHEDD  # sub-2 is asked as osg, as launch asks it
    assert "WorkersAdded" in await scan_events(api, namespace, name, "WorkersAdded")
    assert took < 5, f"answered after {took:.1f} s"
