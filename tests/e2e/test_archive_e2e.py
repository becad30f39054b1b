"""History end to end (issue 11): a scan runs to its final result on the whole stack, the operator
moves it to the archive while a client keeps reading it, and afterwards every route answers for it
as before, `/scans/find` finds it, `kubectl get scans` no longer lists it, and a rescan of it runs."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Rest, kubectl
from tests.e2e.own_cluster import OwnCluster, own_cluster
from tests.helpers import eventually

ARCHIVING = {"SKYSCAN_ARCHIVE_RETENTION_SECONDS": "3", "SKYSCAN_ARCHIVE_INTERVAL_SECONDS": "0.3"}


@pytest.fixture
def own(tmp_path: Path, archive_dsn: str) -> Iterator[OwnCluster]:
    with own_cluster(tmp_path, {"operator": ARCHIVING}, archive_dsn=archive_dsn) as cluster:
        yield cluster


async def listed(own: OwnCluster, scan_id: str) -> bool:
    return scan_id in await kubectl(own.stack, "get", "scans", "-o", "name")


async def read_everything(rest: Rest, scan_id: str) -> dict[str, Any]:
    """Every read route's answer for one scan (volatile keys aside)."""
    manifest = await rest.ok("GET", f"/scan/{scan_id}/manifest")
    return {
        "manifest": manifest,
        "system manifest": await rest.ok("GET", f"/scan/{scan_id}/manifest", as_="system"),
        "result": await rest.ok("GET", f"/scan/{scan_id}/result"),
        "scan": await rest.ok("GET", f"/scan/{scan_id}"),
        "status": await rest.ok("GET", f"/scan/{scan_id}/status"),
        "request": await rest.ok("GET", f"/scan-request/{scan_id}"),
        "event": await rest.ok("GET", f"/scan/{scan_id}/sensor-event"),
        "logs": await rest.ok("GET", f"/scan/{scan_id}/logs"),
        "workflow": await rest.ok("GET", f"/scan/{scan_id}/wms/workflow-id"),
    }


@pytest.mark.timeout(240)
async def test_a_finished_scan_moves_to_the_archive_and_every_route_still_answers(
    own: OwnCluster, own_rest: Rest
) -> None:
    rest, mark = own_rest, secrets.token_hex(4)
    scan_id = await rest.launch(classifiers={"history": mark})
    await rest.wait_status(scan_id, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=120)
    # The scanner's last PATCH follows its final PUT (half a megabyte): the live reads wait for it.
    await eventually(lambda: _finished(rest, scan_id), timeout=30)

    # A client reads on while the scan moves: every answer is a 200, before, during and after.
    answers: list[int] = []

    async def keep_reading() -> None:
        while True:
            answers.append((await rest.call("GET", f"/scan/{scan_id}/manifest")).status_code)
            await asyncio.sleep(0.02)

    reader = asyncio.create_task(keep_reading())
    try:
        live = await read_everything(rest, scan_id)  # the Scan is still in the cluster here
        await eventually(lambda: _not(listed(own, scan_id)), timeout=90, interval=0.5)
        await asyncio.sleep(0.2)  # a few reads after the move too
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    assert answers and set(answers) == {200}, answers
    events = await kubectl(own.stack, "get", "events", "--field-selector", f"involvedObject.name={scan_id}")
    assert "Archived" in events

    archived = await read_everything(rest, scan_id)
    for route in ("result", "request", "event", "logs", "workflow"):
        assert archived[route] == live[route], route
    for key in ("manifest", "system manifest"):  # the workflow ended meanwhile: only it may differ
        assert _stable(archived[key]) == _stable(live[key]), key
    assert archived["status"]["scan_complete"] is True and archived["result"]["is_final"] is True

    run_id, event_id = 123456, 42  # the e2e request's event
    for query in (
        {"event_metadata.run_id": run_id, "event_metadata.event_id": event_id, "classifiers.history": mark},
        {"classifiers.history": mark},
    ):
        found = await rest.ok(
            "POST", "/scans/find", json={"filter": query, "manifest_projection": ["scan_id"]}
        )
        assert found["manifests"] == [{"scan_id": scan_id}], query

    # A soft delete of an archived scan, then include_deleted.
    await rest.ok("DELETE", f"/scan/{scan_id}", json={"delete_completed_scan": True})
    assert (await rest.call("GET", f"/scan/{scan_id}/manifest")).status_code == 404  # as a live one
    deleted = await rest.ok("GET", f"/scan/{scan_id}/manifest", params={"include_deleted": "true"})
    assert deleted["is_deleted"] is True
    found = await rest.ok("POST", "/scans/find", json={"filter": {"classifiers.history": mark}})
    assert found["manifests"] == []
    found = await rest.ok(
        "POST", "/scans/find", json={"filter": {"classifiers.history": mark}, "include_deleted": True}
    )
    assert [m["scan_id"] for m in found["manifests"]] == [scan_id]

    # A rescan of the archived scan is a live scan of the same event, and it runs.
    rescan = await rest.ok("POST", f"/scan/{scan_id}/actions/rescan", json={})
    assert await listed(own, rescan["scan_id"])
    event = await rest.ok("GET", f"/scan/{rescan['scan_id']}/sensor-event")
    assert event == live["event"]
    await rest.wait_status(
        rescan["scan_id"], lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=120
    )


def _stable(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in ("last_updated",)}


async def _finished(rest: Rest, scan_id: str) -> bool:
    manifest = await rest.ok("GET", f"/scan/{scan_id}/manifest")
    return bool(manifest["progress"]["processing_stats"].get("finished"))


async def _not(probe: Any) -> bool:
    return not await probe
