"""A scan's whole life through the REST API, with the scanner simulator playing the scanner server:
POST -> backlog -> WMS workflow -> Job -> progress -> partial and final results -> WMS finished ->
Job complete."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from skyreader import SkyScanResult

from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan.state import NOT_YET_REQUESTED
from tests.e2e.conftest import Rest, Stack, follow_states, wms_workflow
from tests.helpers import eventually


async def scan_event_reasons(stack: Stack, scan_id: str) -> list[str]:
    async with await kube.connect(stack.kubeconfig) as api:
        events = await api.request(
            "GET",
            core_path("events", stack.namespace),
            params={"fieldSelector": f"involvedObject.name={scan_id}"},
        )
    ordered = sorted(events["items"], key=lambda e: int(e["metadata"]["resourceVersion"]))  # creation order
    return [e["reason"] for e in ordered]


async def job_succeeded(stack: Stack, scan_id: str) -> bool:
    async with await kube.connect(stack.kubeconfig) as api:
        job = await api.request("GET", kube.path("batch/v1", "jobs", stack.namespace, f"skyscan-{scan_id}"))
    return bool((job.get("status") or {}).get("succeeded"))


async def test_a_scan_runs_from_submission_to_finished_workflow(rest: Rest, stack: Stack) -> None:
    scan_id = await rest.launch()
    states: list[str] = []
    await follow_states(rest, scan_id, states, until="SCAN_HAS_FINAL_RESULT")

    # The REST states come in the documented order (fast steps may be skipped between two polls).
    order = [
        "PENDING__PRESTARTUP",
        "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP",
        "IN_PROGRESS__WAITING_ON_FIRST_PIXEL_RECO",
        "IN_PROGRESS__PARTIAL_RESULT_GENERATED",
        "SCAN_HAS_FINAL_RESULT",
    ]
    assert states == sorted(states, key=order.index), states
    assert "IN_PROGRESS__PARTIAL_RESULT_GENERATED" in states  # ~2 s of partial results

    # The operator's steps, as Kubernetes events on the Scan: backlog, workflow, queues, Job.
    reasons = await scan_event_reasons(stack, scan_id)
    steps = ["Queued", "Admitted", "WorkflowCreated", "QueuesActivated", "JobCreated"]
    assert [r for r in reasons if r in steps] == steps, reasons

    # The scanner's reports, through the manifest and the result. Its last PATCH follows the final PUT.
    async def finished() -> dict[str, Any] | None:
        manifest: dict[str, Any] = await rest.ok("GET", f"/scan/{scan_id}/manifest")
        return manifest if manifest["progress"]["processing_stats"].get("finished") else None

    manifest = await eventually(finished, timeout=20)
    assert manifest["wms_workflow_id"] != NOT_YET_REQUESTED
    assert manifest["event_metadata"] == {
        "run_id": 123456, "event_id": 42, "event_type": "neutrino", "mjd": 60000.5, "is_real_event": True,
    }  # fmt: skip
    assert manifest["scan_metadata"]["nside_progression"] == {"8": 0, "64": 12, "512": 24}
    progress = manifest["progress"]
    assert progress["summary"] == "The Skymap Scanner has finished."
    assert progress["processing_stats"]["finished"] is True
    pixels = {n: t["pixels"]["done"] for n, t in progress["tallies"]["nsides"].items()}
    result = await rest.ok("GET", f"/scan/{scan_id}/result")
    assert result["is_final"] is True
    # The stored result is a real-sized one that icecube-skyreader reads, matching the tallies.
    sky = SkyScanResult.deserialize(result["scan_result"])
    assert sky.nsides == [8, 64, 512] and len(sky.get_results_per_nside(8)) == 768
    assert {str(n): len(sky.get_results_per_nside(n)) for n in sky.nsides} == pixels
    assert progress["tallies"]["overall"]["pixels"]["done"] == sum(pixels.values()) > 768
    assert 300_000 <= len(json.dumps(result["scan_result"])) <= 700_000
    metadata = sky.get_results_per_nside(64).dtype.metadata or {}
    assert metadata["complete"] is True and metadata["run_id"] == 123456

    # After the teardown delay the WMS is told `finished`; the final result still decides the state.
    status = await rest.wait_status(scan_id, lambda s: s["wms_deactivated"] == "FINISHED")
    assert status["scan_state"] == "SCAN_HAS_FINAL_RESULT" and status["scan_complete"] is True
    assert status["wms_workforce"]["n_running"] == 2
    assert (await wms_workflow(stack, manifest["wms_workflow_id"]))["deactivated"] == "FINISHED"

    # The simulator lifted the kwok hold after its final report, so the Job completes.
    await eventually(lambda: job_succeeded(stack, scan_id), timeout=30)
    backlog = await rest.ok("GET", "/scans/backlog")
    assert scan_id not in {e["scan_id"] for e in backlog["entries"]}


async def test_several_scans_run_at_once(rest: Rest) -> None:
    """Each held pod gets its own simulated server; scans do not wait for each other."""
    ids = await asyncio.gather(*(rest.launch(classifiers={"n": i}) for i in range(3)))
    for scan_id in ids:
        await rest.wait_status(scan_id, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=60)
