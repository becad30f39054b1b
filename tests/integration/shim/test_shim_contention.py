"""Contention alone never yields a 5xx: concurrent soft deletes and progress reports on one scan, over
real HTTP, all succeed and leave the right state; set-once fields stay set once however many race."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from api_shim.errors import ApiError
from api_shim.repository.store import Change
from skyscan import names
from skyscan.io import kube
from skyscan.io.kube import scan_path
from skyscan.io.kube_errors import KubeError
from tests.integration.shim.conftest import ShimUnderTest
from tests.integration.shim.test_shim_writes import EVENT_METADATA, PROGRESS

N = 50


def report(i: int) -> dict[str, Any]:
    """A progress report whose keys are its own, so a report merged into another would show."""
    progress = copy.deepcopy(PROGRESS)
    progress["summary"] = f"report {i}"
    progress["tallies"] = {f"tally-{i}": i}
    progress["processing_stats"]["rate"] = {f"rate-{i}": float(i)}
    if i % 2:
        progress["start"] = i
    return progress


def stored_form(progress: dict[str, Any]) -> dict[str, Any]:
    """A report as the manifest shows it: the reference's defaults filled in."""
    stats = {"rate": {}, "end": "", "finished": False, "predictions": {}, **progress["processing_stats"]}
    return {"start": None, "end": None, **progress, "processing_stats": stats}


def failures(replies: list[Any]) -> list[tuple[int, Any]]:
    return [(r.status, r.body) for r in replies if r.status != 200]


async def test_concurrent_deletes_and_progress_reports_all_succeed(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    reports = [report(i) for i in range(N)]
    # The scanner sends its metadata with every report: set once by the first, equal in the others.
    metadata = {"event_metadata": EVENT_METADATA, "scan_metadata": {"scanner": "4.2.10"}}
    deletes = [shim.call("DELETE", f"/scan/{scan_id}") for _ in range(N)]
    patches = [
        shim.call("PATCH", f"/scan/{scan_id}/manifest", as_="system", json_body={"progress": p, **metadata})
        for p in reports
    ]
    replies = await asyncio.gather(*deletes, *patches)
    assert failures(replies) == []
    assert all(r.body["manifest"]["is_deleted"] is True for r in replies[:N])

    scan = await shim.kube_scan(scan_id)
    assert scan["spec"]["deleted"] is True
    # The stored progress is one report, whole: replaced, never merged with another.
    assert scan["status"]["progress"] in [stored_form(p) for p in reports]
    manifest = (await shim.call("GET", f"/scan/{scan_id}/manifest", params={"include_deleted": "true"})).body
    assert manifest["is_deleted"] is True
    assert manifest["progress"] in [stored_form(p) for p in reports]
    assert manifest["event_metadata"] == EVENT_METADATA
    assert manifest["scan_metadata"] == {"scanner": "4.2.10"}


async def test_set_once_metadata_under_contention(shim: ShimUnderTest) -> None:
    """Racing first reports with different metadata: exactly one value is stored, every other report
    is refused with 400 (never a 5xx), and reports carrying the stored value succeed."""
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/manifest"
    bodies = [
        {"progress": report(i), "event_metadata": {**EVENT_METADATA, "run_id": i % 3}} for i in range(N)
    ]
    replies = await asyncio.gather(*(shim.call("PATCH", path, as_="system", json_body=b) for b in bodies))
    assert {r.status for r in replies} <= {200, 400}
    stored = (await shim.call("GET", path)).body["event_metadata"]
    for body, reply in zip(bodies, replies, strict=True):
        if body["event_metadata"] == stored:
            assert reply.status == 200, reply.body
        else:
            assert (reply.status, reply.body["reason"]) == (400, "Cannot change an existing event_metadata")


async def test_concurrent_workflow_ids_and_worker_requests(shim: ShimUnderTest) -> None:
    """The guarded writes (set-once workflow id, the worker-requests list) under contention: one
    workflow id wins and the others are 404, every worker request is kept."""
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/wms/workflow-id"
    replies = await asyncio.gather(
        *(
            shim.call("POST", path, as_="system", json_body={"workflow_id": f"wf-{i}", "wms_address": "a"})
            for i in range(20)
        )
    )
    assert sorted(r.status for r in replies) == [200] + [404] * 19
    asks = [shim.state.writes.add_workers(scan_id, "osg", i + 1) for i in range(20)]
    results = await asyncio.gather(*asks, return_exceptions=True)  # nobody answers: each times out
    assert all(getattr(r, "status", None) == 504 for r in results), results
    scan = await shim.kube_scan(scan_id)
    assert sorted(r["nWorkers"] for r in scan["spec"]["workerRequests"]) == list(range(1, 21))


async def test_progress_on_a_scan_with_no_status_yet_is_stored_and_the_rest_kept(shim: ShimUnderTest) -> None:
    """The progress is applied (server-side) as the shim's own key: it needs no status to exist first,
    replaces the last progress whole, and leaves every other key of the status as it was."""
    scan_id = (await shim.launch())["scan_id"]
    scan = await shim.api.request("GET", scan_path(shim.namespace, scan_id))
    assert "status" not in scan
    store = shim.state.scans._store
    written = await store.replace_progress(scan_id, {"summary": "s", "extra": {"a": 1}})
    assert written["status"]["progress"] == {"summary": "s", "extra": {"a": 1}}
    await shim.api.request(
        "PATCH", scan_path(shim.namespace, scan_id, "status"), body={"status": {"scanMetadata": {"k": 1}}},
        content_type=kube.MERGE_PATCH,
    )  # fmt: skip
    written = await store.replace_progress(scan_id, {"summary": "t"})
    assert written["status"]["progress"] == {"summary": "t"}
    assert written["status"]["scanMetadata"] == {"k": 1}
    managers = written["metadata"]["managedFields"]
    owners = {(f["manager"], f["operation"], f.get("subresource")) for f in managers}
    assert (names.SHIM_MANAGER, "Apply", "status") in owners
    assert (names.SHIM_MANAGER, "Update", None) in owners  # the launch


# -- the retry rule of guarded writes, against the real API server ----------------------------------


async def stale_and_current(shim: ShimUnderTest) -> tuple[str, str, str]:
    """A scan, a version of it that has been replaced (another writer came in between), and the
    current one."""
    scan_id = (await shim.launch())["scan_id"]
    stale = (await shim.kube_scan(scan_id))["metadata"]["resourceVersion"]
    await shim.operator_writes(scan_id, {"lastUpdated": 1.0})
    return scan_id, stale, (await shim.kube_scan(scan_id))["metadata"]["resourceVersion"]


async def test_a_write_on_a_replaced_version_is_decided_again_on_the_current_one(shim: ShimUnderTest) -> None:
    scan_id, stale, current = await stale_and_current(shim)
    seen: list[str] = []

    def decide(scan: dict[str, Any]) -> Change:
        if not seen:  # the first decision is on the replaced version: the API server says 409
            scan["metadata"]["resourceVersion"] = stale
        seen.append(scan["metadata"]["resourceVersion"])
        return Change(spec={"deleted": True})

    written = await shim.state.scans._store.update(scan_id, decide)
    assert seen[0] == stale and len(seen) == 2 and int(seen[1]) >= int(current)
    assert written["spec"]["deleted"] is True
    assert (await shim.kube_scan(scan_id))["spec"]["deleted"] is True


async def test_conflicts_are_retried_until_the_budget_then_503(shim: ShimUnderTest) -> None:
    scan_id, stale, _ = await stale_and_current(shim)
    tries = 0

    def decide(scan: dict[str, Any]) -> Change:
        nonlocal tries
        tries += 1
        scan["metadata"]["resourceVersion"] = stale  # always decided on a replaced version
        return Change(spec={"deleted": True})

    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        await shim.state.scans._store.update(scan_id, decide, budget=0.5)
    assert 0.5 <= time.monotonic() - started < 5.0
    assert (caught.value.status, caught.value.headers) == (503, {"Retry-After": "1"})
    assert tries > 2  # pauses start at 10 ms: many tries fit in the budget
    assert not (await shim.kube_scan(scan_id))["spec"].get("deleted")  # nothing written


async def test_a_refusal_by_the_api_server_other_than_409_is_not_retried(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    tries = 0

    def decide(scan: dict[str, Any]) -> Change:
        nonlocal tries
        tries += 1
        return Change(spec={"deleted": "not a boolean"})  # the CRD's schema refuses it: 422

    with pytest.raises(KubeError) as caught:
        await shim.state.scans._store.update(scan_id, decide, budget=5.0)
    assert caught.value.status == 422 and tries == 1


async def test_a_progress_of_any_text_is_applied_as_sent(shim: ShimUnderTest) -> None:
    """The progress goes to the API server as YAML (server-side apply): text YAML cannot hold raw (C1
    controls, NEL, line separators), characters beyond the BMP and control characters arrive as sent."""
    scan_id = (await shim.launch())["scan_id"]
    text = 'a\x00b\x0e\x7f\x85\x86\x9f\u2028\u2029\ufffe😀\u00e9 \\ " /'
    stats = {**PROGRESS["processing_stats"], "predictions": {text: text}}
    progress = {**PROGRESS, "summary": text, "processing_stats": stats}
    reply = await shim.call(
        "PATCH", f"/scan/{scan_id}/manifest", as_="system", json_body={"progress": progress}
    )
    assert reply.status == 200, reply.body
    stored = (await shim.kube_scan(scan_id))["status"]["progress"]
    assert (stored["summary"], stored["processing_stats"]["predictions"]) == (text, {text: text})
