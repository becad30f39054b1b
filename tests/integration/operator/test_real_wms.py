"""Skyscan against what EWMS does (issue 29): clusters refused by the WMS, the aliases add-workers asks
by, the cluster a taskforce runs at (EWMS names only its schedd), and the workforce after the end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from skyscan.io.kube import Kube, scan_path
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
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
STOPPING = {"pending-stopper", "condor-rm", "condor-complete"}
OSG_SCHEDD = "grid-submitter.icecube.wisc.edu"
FAULT = {"count": 1, "method": "POST", "path_prefix": "/v1/workflows"}  # the next workflow request


def workflow_posts(requests: list[tuple[str, str]]) -> int:
    return sum(1 for method, path in requests if (method, path) == ("POST", "/v1/workflows"))


async def test_a_cluster_the_wms_refuses_fails_the_scan_at_once(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """`local` passes the deployment's policy (a default known cluster) but not EWMS, which knows
    osg only: one request, then Failed naming the cluster, not three attempts and StartAttemptsExhausted."""
    operator()
    name = await create_scan(api, namespace, requestClusters=[{"location": "local", "nWorkers": 2}])
    scan = await wait_scan(api, namespace, name, lambda s: condition(s, "Failed").get("status") == "True")
    failed = condition(scan, "Failed")
    assert failed["reason"] == "ClusterRefused"
    assert failed["message"].startswith("the WMS refused cluster 'local': POST /v1/workflows: HTTP 400: ")
    assert "condor cluster location not found: local" in failed["message"]
    assert condition(scan, "Admitted")["reason"] == "ClusterRefused"
    assert scan["status"]["state"] == "ABORTED__PRESTARTUP"
    assert st(scan).get("backlog") is None and not (st(scan).get("workflow") or {}).get("requestedAt")
    await asyncio.sleep(3)  # three start attempts' worth (1 s retry delay): none comes
    scan = await get_scan(api, namespace, name)
    assert condition(scan, "Failed")["reason"] == "ClusterRefused"
    assert FINALIZER not in (scan["metadata"].get("finalizers") or [])  # nothing held
    assert workflow_posts(await wms.requests()) == 1 and await wms.workflows() == []
    reasons = await scan_events(api, namespace, name, "ClusterRefused")
    assert "StartAttemptsExhausted" not in reasons


async def test_another_permanent_refusal_fails_at_once_and_an_outage_still_retries(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator()
    await wms.call("POST", "/_sim/faults", FAULT | {"status": 409})
    name = await create_scan(api, namespace)
    scan = await wait_scan(api, namespace, name, lambda s: condition(s, "Failed").get("status") == "True")
    assert condition(scan, "Failed")["reason"] == "WMSRejected"
    assert condition(scan, "Failed")["message"].startswith(
        "the WMS refused the workflow request: POST /v1/workflows: HTTP 409"
    )
    await wms.call("POST", "/_sim/faults", FAULT | {"status": 503})
    other = await create_scan(api, namespace)
    scan = await wait_scan(api, namespace, other, lambda s: (st(s).get("workflow") or {}).get("id"))
    assert condition(scan, "Failed").get("status") != "True"


async def test_add_workers_asks_by_the_launch_alias_and_a_refused_cluster_is_rejected(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_WMS_CLUSTERS_ALIAS=json.dumps({"local": "osg"}), **HOLD)
    scan = await running_scan(api, namespace)
    name, uid = scan["metadata"]["name"], scan["metadata"]["uid"]
    requests = [
        {"id": "r1", "location": "local", "nWorkers": 3},  # EWMS refuses `local`: asked as osg
        {"id": "r2", "location": "mars", "nWorkers": 2},
    ]
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"workerRequests": requests}}, content_type=MERGE
    )
    scan = await wait_scan(api, namespace, name, lambda s: len(st(s).get("workerRequests") or []) == 2)
    outcomes = {o["id"]: o for o in scan["status"]["workerRequests"]}
    assert outcomes["r1"]["state"] == "Succeeded", outcomes
    (workflow,) = await wms.workflows(marker=uid)
    (added,) = [
        tf for tf in workflow["taskforces"] if tf["taskforce_uuid"] == outcomes["r1"]["taskforceUuid"]
    ]
    assert added["schedd"] == OSG_SCHEDD and added["n_workers"] == 3
    assert outcomes["r2"]["state"] == "Rejected"
    assert outcomes["r2"]["reason"].startswith("the WMS refused workers at cluster 'mars': ")
    assert "HTTP 400" in outcomes["r2"]["reason"]
    # The status names each taskforce's cluster, which EWMS gives only as its schedd.
    scan = await wait_scan(api, namespace, name, lambda s: len(st(s).get("taskforces") or []) == 2)
    assert [(t["cluster_location"], t["schedd"]) for t in scan["status"]["taskforces"]] == [
        ("osg", OSG_SCHEDD),
        ("osg", OSG_SCHEDD),
    ]


async def test_the_last_workforce_shown_is_what_the_wms_says_after_the_end(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """An abort moves every taskforce to pending-stopper at once: the scan's status, which the poller
    stops refreshing then, shows that, not the last poll before (pending-starter, workers running)."""
    operator(**HOLD)
    scan = await running_scan(api, namespace)
    name, uid = scan["metadata"]["name"], scan["metadata"]["uid"]
    (workflow,) = await wms.workflows(marker=uid)
    running = {t["taskforce_uuid"]: {"RUNNING": {"Tasking": 4}} for t in workflow["taskforces"]}
    await wms.call("POST", "/_sim/statuses", {"compound_statuses_by_taskforce": running})
    scan = await wait_scan(
        api, namespace, name, lambda s: (st(s).get("workforce") or {}).get("nRunning") == 4
    )
    assert {t["phase"] for t in scan["status"]["taskforces"]} & STOPPING == set()
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"deleted": True}}, content_type=MERGE
    )

    def shown_stopping(s: dict[str, Any]) -> bool:
        taskforces = st(s).get("taskforces") or []
        return bool(taskforces) and {t["phase"] for t in taskforces} <= STOPPING

    scan = await wait_scan(api, namespace, name, shown_stopping)
    assert scan["status"]["workflow"]["deactivated"] == "ABORTED"
    (workflow,) = await wms.workflows(marker=uid)
    wms_uuids = {t["taskforce_uuid"] for t in workflow["taskforces"]}
    assert {t["taskforce_uuid"] for t in scan["status"]["taskforces"]} == wms_uuids
    # Read once: no later poll names the ended workflow.

    async def naming() -> int:
        queries = (await wms.call("GET", "/_sim/queries"))["queries"]
        return sum(1 for _, q in queries if workflow["workflow_id"] in json.dumps(q))

    seen = await naming()
    await asyncio.sleep(2)  # four poll intervals
    assert await naming() == seen
