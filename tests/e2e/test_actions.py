"""REST actions on running scans, end to end: rescan with replace (and the redirects it causes), and
DELETE mid-scan (the WMS workflow is aborted, the Job removed, the record kept)."""

from __future__ import annotations

import httpx

from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan.io.kube_errors import KubeError
from tests.e2e.conftest import LONG_NSIDES, Rest, Stack, wms_workflow
from tests.helpers import eventually


async def job_gone(stack: Stack, scan_id: str) -> bool:
    async with await kube.connect(stack.kubeconfig) as api:
        try:
            await api.request("GET", kube.path("batch/v1", "jobs", stack.namespace, f"skyscan-{scan_id}"))
        except KubeError as e:
            if e.status == 404:
                return True
            raise
    return False


def in_progress(status: dict[str, object]) -> bool:
    return str(status["scan_state"]).startswith("IN_PROGRESS__")


async def test_delete_mid_scan_aborts_the_workflow_and_removes_the_job(rest: Rest, stack: Stack) -> None:
    scan_id = await rest.launch(nsides=LONG_NSIDES)
    await rest.wait_status(scan_id, in_progress)

    deleted = await rest.ok("DELETE", f"/scan/{scan_id}", json={})
    assert deleted["manifest"]["is_deleted"] is True

    status = await rest.wait_status(scan_id, lambda s: s["wms_deactivated"] == "ABORTED", timeout=30)
    assert status["is_deleted"] is True and status["scan_complete"] is False
    assert status["scan_state"].startswith("ABORTED__")
    workflow_id = (await rest.ok("GET", f"/scan/{scan_id}/wms/workflow-id"))["workflow_id"]
    assert (await wms_workflow(stack, workflow_id))["deactivated"] == "ABORTED"
    await eventually(lambda: job_gone(stack, scan_id), timeout=30)

    # Soft delete: hidden by default, still readable on request; no final result ever came.
    assert (await rest.call("GET", f"/scan/{scan_id}")).status_code == 404
    kept = await rest.ok("GET", f"/scan/{scan_id}", params={"include_deleted": "true"})
    assert kept["manifest"]["is_deleted"] is True
    assert kept["result"] == {} or kept["result"]["is_final"] is False


async def test_rescan_with_replace_redirects_to_the_new_scan(rest: Rest, stack: Stack) -> None:
    original = await rest.launch(nsides=LONG_NSIDES, classifiers={"run": "first"})
    await rest.wait_status(original, in_progress)

    body = {"replace_scan": True, "abort_first": True}
    rescan = await rest.ok("POST", f"/scan/{original}/actions/rescan", json=body)
    new = rescan["scan_id"]
    assert new != original
    assert rescan["classifiers"] == {"run": "first", "rescan": True, "origin_scan_id": original}

    # Reads of the replaced scan redirect (302 for GET, 307 otherwise) unless no_redirect is set.
    r = await rest.call("GET", f"/scan/{original}/status")
    assert r.status_code == 302 and r.headers["Location"].endswith(f"/scan/{new}/status")
    r = await rest.call("GET", f"/scan/{original}/manifest", params={"projection": "scan_id"})
    assert r.status_code == 302 and r.headers["Location"].endswith(f"/scan/{new}/manifest?projection=scan_id")
    r = await rest.call("DELETE", f"/scan/{original}", json={})
    assert r.status_code == 307 and r.headers["Location"].endswith(f"/scan/{new}")
    kept = await rest.ok(
        "GET", f"/scan/{original}", params={"no_redirect": "true", "include_deleted": "true"}
    )
    assert kept["manifest"]["replaced_by_scan_id"] == new and kept["manifest"]["is_deleted"] is True

    # abort_first: the original's workflow is aborted and its Job removed ...
    original_status = await rest.ok("GET", f"/scan/{original}/status", params={"no_redirect": "true"})
    assert original_status["is_deleted"] is True
    await eventually(lambda: job_gone(stack, original), timeout=30)

    # ... while the rescan runs to its final result on the same event.
    status = await rest.wait_status(new, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=60)
    assert status["is_deleted"] is False
    request = await rest.ok("GET", f"/scan-request/{original}")
    assert new in request["rescan_ids"]
    events = [
        await rest.ok("GET", f"/scan/{i}/sensor-event", params={"no_redirect": "true"})
        for i in (original, new)
    ]
    assert events[0] == events[1]


async def scanner_exit_code(stack: Stack, scan_id: str) -> int | None:
    async with await kube.connect(stack.kubeconfig) as api:
        pods = await api.request(
            "GET",
            core_path("pods", stack.namespace),
            params={"labelSelector": f"skyscan.io/scan-id={scan_id}"},
        )
    for pod in pods["items"]:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            if terminated := (container.get("state") or {}).get("terminated"):
                return int(terminated["exitCode"])
    return None


async def test_a_workflow_aborted_by_the_wms_trips_the_scanners_kill_switch(rest: Rest, stack: Stack) -> None:
    scan_id = await rest.launch(nsides=LONG_NSIDES)
    await rest.wait_status(scan_id, in_progress)
    workflow_id = (await rest.ok("GET", f"/scan/{scan_id}/wms/workflow-id"))["workflow_id"]
    async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as wms:
        (await wms.post(f"/v1/workflows/{workflow_id}/actions/abort")).raise_for_status()

    status = await rest.wait_status(scan_id, lambda s: s["wms_deactivated"] == "ABORTED", timeout=30)
    assert status["is_deleted"] is False and status["scan_state"].startswith("ABORTED__")
    # The scanner's kill switch sees `wms_deactivated` and the server exits as after SIGINT.
    assert await eventually(lambda: scanner_exit_code(stack, scan_id), timeout=30) == 130
    assert not (await rest.status(scan_id))["scan_complete"]
