"""A Scan from creation to completion: backlog -> WMS workflow -> Job -> Complete -> WMS finished."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest

from skyscan.io.kube import Kube, core_path, path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from skyscan_local import control_plane as localcluster
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    fresh_id,
    get_scan,
    scan_events,
    st,
    wait_scan,
)


def milestones(snapshots: list[dict[str, Any]]) -> list[str]:
    """The order in which the scan reached each step, from watched snapshots of its status."""
    seen: list[str] = []

    def mark(name: str, reached: bool) -> None:
        if reached and name not in seen:
            seen.append(name)

    for scan in snapshots:
        status = st(scan)
        mark("queued", condition(scan, "Admitted").get("reason") == "Queued" and bool(status.get("backlog")))
        mark("admitted", condition(scan, "Admitted").get("reason") == "Admitted")
        mark("workflow-intent", bool((status.get("workflow") or {}).get("requestedAt")))
        mark("workflow-id", bool((status.get("workflow") or {}).get("id")))
        mark("queues", condition(scan, "WorkflowReady").get("status") == "True")
        mark("job", bool(status.get("job")) and not status.get("backlog"))
        mark("running", condition(scan, "ScannerRunning").get("status") == "True")
        mark("succeeded", (status.get("job") or {}).get("state") == "Succeeded")
        mark("finished", (status.get("workflow") or {}).get("deactivated") == "FINISHED")
    return seen


async def record(api: Kube, namespace: str, name: str, into: list[dict[str, Any]], version: str) -> None:
    """Every version of the scan after `version`, from a watch (re-opened when the server ends it)."""
    while True:
        try:
            params = {
                "resourceVersion": version,
                "fieldSelector": f"metadata.name={name}",
                "timeoutSeconds": 120,
            }
            async for event in api.watch(scan_path(namespace), params):
                into.append(event["object"])
                version = event["object"]["metadata"]["resourceVersion"]
        except KubeError:
            await asyncio.sleep(0.2)


async def recording(api: Kube, namespace: str, name: str, into: list[dict[str, Any]]) -> asyncio.Task[None]:
    """`record` in the background from now: watching from a list's resourceVersion sees every change
    after it, however late the watch connects."""
    listed = await api.request("GET", scan_path(namespace))
    return asyncio.create_task(record(api, namespace, name, into, listed["metadata"]["resourceVersion"]))


async def test_scan_runs_from_backlog_to_finished_workflow(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    name = fresh_id()
    snapshots: list[dict[str, Any]] = []
    recorder = await recording(api, namespace, name, snapshots)
    operator(**HOLD)
    await create_scan(api, namespace, name, priority=5, scannerServerEnvFromUser={"SKYSCAN_LOG": "DEBUG"})

    # Admitted, workflow requested with the reference body, queues activated, Job created.
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "ScannerRunning").get("status") == "True"
    )
    status = scan["status"]
    assert status["state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"
    assert status["observedGeneration"] == scan["metadata"]["generation"]
    assert status["workflow"]["id"].startswith("WF-") and status["workflow"]["address"] == wms.url
    assert FINALIZER in scan["metadata"]["finalizers"]
    assert status.get("backlog") is None
    (workflow,) = await wms.workflows(marker=scan["metadata"]["uid"])
    task = workflow["request"]["tasks"][0]
    assert task["cluster_locations"] == ["osg"] and task["n_workers"] == 10
    assert task["worker_config"]["priority"] == 5 and task["worker_config"]["worker_memory"] == 8_000_000_000

    job = await api.request("GET", path("batch/v1", "jobs", namespace, f"skyscan-{name}"))
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/name": "skyscan",
        "app.kubernetes.io/component": "scanner",
        "skyscan.io/scan-id": name,
    }
    assert job["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "Prune=false"
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Scan",
        name,
        scan["metadata"]["uid"],
        True,
    )
    spec = job["spec"]
    limits = (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"])
    assert limits == (0, 172800, 600)
    (container,) = spec["template"]["spec"]["containers"]
    assert container["image"] == "icecube/skymap_scanner:4.1.2"
    assert container["args"][:4] == ["python", "-m", "skymap_scanner.server", "--reco-algo"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SKYSCAN_SKYDRIVER_SCAN_ID"] == name and env["SKYSCAN_LOG"] == "DEBUG"
    assert container["env"][0]["name"] == "SKYSCAN_LOG"  # the user's env first: Skyscan's wins

    # The scanner's own credential: a token bound to its Scan's Secret, read from there; no API token.
    pod_spec = spec["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "skyscan-scanner"
    assert pod_spec["automountServiceAccountToken"] is False
    (auth_env,) = [e for e in container["env"] if e["name"] == "SKYSCAN_SKYDRIVER_AUTH"]
    ref = auth_env["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (f"skyscan-{name}-scanner", "token")
    credential = await api.request("GET", core_path("secrets", namespace, ref["name"]))
    assert credential["metadata"]["ownerReferences"][0]["uid"] == scan["metadata"]["uid"]
    token = base64.b64decode(credential["data"]["token"]).decode()
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["aud"] == ["skyscan-scanner"]
    assert claims["kubernetes.io"]["secret"] == {"name": ref["name"], "uid": credential["metadata"]["uid"]}
    assert claims["sub"] == f"system:serviceaccount:{namespace}:skyscan-scanner"
    assert token not in json.dumps(scan)  # never in the Scan
    assert (
        container["resources"]["limits"]["memory"] == "1024M"
    )  # 1_024_000_000 bytes, as the API server writes it

    secret = await api.request("GET", core_path("secrets", namespace, f"skyscan-{name}-ewms"))
    assert secret["metadata"]["ownerReferences"][0]["uid"] == scan["metadata"]["uid"]
    ewms = json.loads(base64.b64decode(secret["data"]["ewms.json"]))
    queues = {mq["alias"]: mq["mqid"] for mq in workflow["mqprofiles"]}
    assert ewms["toclient"]["name"] == queues["to-client-queue"]
    assert ewms["fromclient"]["name"] == queues["from-client-queue"] and ewms["fromclient"]["auth_token"]

    # The batched poller brings the workforce into status once the simulated workers run.
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("workforce") or {}).get("nRunning"))
    assert scan["status"]["workforce"]["nRunning"] == 10
    assert scan["status"]["taskforces"][0]["cluster_location"] == "osg"

    # kwok completes the pod once the hold is lifted.
    pods = await api.request(
        "GET", core_path("pods", namespace), params={"labelSelector": f"skyscan.io/scan-id={name}"}
    )
    (pod,) = pods["items"]
    await api.request(
        "PATCH", core_path("pods", namespace, pod["metadata"]["name"]),
        body=[{"op": "remove", "path": "/metadata/annotations/skyscan.io~1kwok-hold"}],
        content_type="application/json-patch+json",
    )  # fmt: skip
    scan = await wait_scan(
        api, namespace, name, lambda s: (st(s).get("job") or {}).get("state") == "Succeeded"
    )
    assert condition(scan, "ScannerRunning")["reason"] == "Completed"
    # Its Job ended: the scanner's credential is revoked (its Secret, which the token is bound to, goes).
    await wait_scan(api, namespace, name, lambda s: (st(s).get("scannerCredential") or {}).get("revoked"))
    with pytest.raises(KubeError) as gone:
        await api.request("GET", core_path("secrets", namespace, ref["name"]))
    assert gone.value.status == 404

    # The shim records the final result; after the teardown delay the WMS is told `finished`.
    await api.request(
        "PATCH", scan_path(namespace, name, "status"),
        body={"status": {"result": {"isFinal": True, "updatedAt": time.time()}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip
    scan = await wait_scan(
        api, namespace, name, lambda s: (st(s).get("workflow") or {}).get("deactivated") == "FINISHED"
    )
    assert scan["status"]["state"] == "SCAN_HAS_FINAL_RESULT"
    assert condition(scan, "Complete")["status"] == "True"
    (workflow,) = await wms.workflows(marker=scan["metadata"]["uid"])
    assert workflow["deactivated"] == "FINISHED"
    await wait_scan(api, namespace, name, lambda s: FINALIZER not in (s["metadata"].get("finalizers") or []))

    recorder.cancel()
    await asyncio.gather(recorder, return_exceptions=True)
    steps = "queued admitted workflow-intent workflow-id queues job running succeeded finished"
    assert milestones(snapshots) == steps.split()
    expected = ("Queued", "Admitted", "WorkflowCreated", "QueuesActivated", "JobCreated", "WorkflowFinished")
    await scan_events(api, namespace, name, *expected)  # what `kubectl describe scan` shows
    assert localcluster.NODE_NAME == pod["spec"]["nodeName"]


async def test_the_wms_is_polled_in_batches_not_per_scan(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD, SKYSCAN_BACKLOG_TICK_SECONDS="0.2")
    names = [await create_scan(api, namespace, priority=100) for _ in range(3)]
    for name in names:
        await wait_scan(
            api, namespace, name, lambda s: (st(s).get("workforce") or {}).get("nRunning"), timeout=60
        )
    ids = {(await get_scan(api, namespace, n))["status"]["workflow"]["id"] for n in names}
    queries = (await wms.call("GET", "/_sim/queries"))["queries"]
    polls = [q for kind, q in queries if kind in ("workflows", "taskforces") and "workflow_id" in q]
    assert polls and all("$in" in q["workflow_id"] for q in polls)  # always a batch, never one scan
    assert any(set(q["workflow_id"]["$in"]) == ids for kind, q in queries if kind == "taskforces")
    per_scan = [r for r in await wms.requests() if r[0] == "GET" and r[1].startswith("/v1/workflows/")]
    assert per_scan == []
