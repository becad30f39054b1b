"""How often the operator writes a Scan while starting it: every write is sent to every watcher of
Scans (the shim's cache, kubectl, GitOps tools), so a start should take as few as its safety needs."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from skyscan import model, names
from skyscan.io import kube
from skyscan.io.kube import Kube, scan_path
from tests.helpers import eventually
from tests.integration.operator.conftest import HOLD, OperatorFactory, Simulator, create_scan, fresh_id, st
from tests.integration.operator.test_lifecycle import recording


def writes_until_job(snapshots: list[dict[str, Any]]) -> list[str]:
    """What each write of the Scan changed, from its creation (not counted) up to and including the
    write that records its Job: "metadata" (the finalizer) or the status keys that changed."""
    changes: list[str] = []
    for before, after in itertools.pairwise(snapshots):
        if before["metadata"].get("finalizers") != after["metadata"].get("finalizers"):
            changes.append("metadata")
        keys = sorted(k for k in {*st(before), *st(after)} if st(before).get(k) != st(after).get(k))
        if keys:
            changes.append("status:" + ",".join(keys))
        if st(after).get("job"):
            break
    return changes


async def test_a_scan_is_written_at_most_six_times_before_its_job_is_recorded(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    name = fresh_id()
    snapshots: list[dict[str, Any]] = []
    recorder = await recording(api, namespace, name, snapshots)
    operator(**HOLD)
    await create_scan(api, namespace, name, priority=5)

    async def job_recorded() -> bool:
        return any(st(s).get("job") for s in snapshots)

    await eventually(job_recorded, timeout=60)
    recorder.cancel()
    await asyncio.gather(recorder, return_exceptions=True)
    changes = writes_until_job(snapshots)
    print(f"{len(changes)} writes of the Scan until its Job is recorded: {changes}")
    # Queued; the finalizer and the workflow intent before the WMS request; the workflow id the
    # moment the WMS answers; the queues and the scanner's credential, on record before the Job
    # exists (its Pod presents that credential); the Job. The WMS's batched poll may report the new
    # workflow's taskforces meanwhile: that write is the poll's, whatever the start does (it came in
    # between in about half the runs, before as after).
    start = [c for c in changes if c != "status:taskforces,workforce"]
    assert len(start) <= 6, changes
    assert any("scannerCredential" in c for c in start[:-1]), changes  # before the Job's write


async def test_the_operator_applies_its_keys_and_drops_those_an_older_writer_left(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """The operator's keys are server-side applied as skyscan-operator; a key it no longer wants that
    another field manager wrote (here a backlog entry an older operator wrote by merge patch) is gone
    once the scan starts, not kept because the apply did not own it."""
    name = await create_scan(api, namespace, priority=5)
    await api.request(
        "PATCH", scan_path(namespace, name, "status"), params={"fieldManager": "an-older-operator"},
        body={"status": {"backlog": {"enteredAt": 1.0, "attempts": 0}}}, content_type=kube.MERGE_PATCH,
    )  # fmt: skip
    operator(**HOLD)

    async def started() -> dict[str, Any] | None:  # the backlog entry may go a pass after the Job
        scan = await api.request("GET", scan_path(namespace, name))
        return scan if st(scan).get("job") and "backlog" not in st(scan) else None

    scan = await eventually(started, timeout=60)
    appliers = {f["manager"] for f in scan["metadata"]["managedFields"] if f["operation"] == "Apply"}
    assert names.OPERATOR_MANAGER in appliers


async def test_an_apply_empties_the_workforce_it_filled(api: Kube, namespace: str) -> None:
    """The workforce's maps are atomic in the CRD: applying them empty after full replaces them (as a
    granular map the API server would make them null, which the schema refuses with a 422)."""
    name = await create_scan(api, namespace, priority=5)
    path = scan_path(namespace, name, "status")
    head = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}}
    for statuses in ({"RUNNING": {"a": 1}}, {}):
        workforce = model.Workforce(statuses=statuses, n_running=len(statuses)).to_kube()
        applied = await api.apply(path, {**head, "status": {"workforce": workforce}}, names.OPERATOR_MANAGER)
        assert applied["status"]["workforce"]["statuses"] == statuses
