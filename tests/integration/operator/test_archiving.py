"""Finished scans move to the archive (the real PostgreSQL) and leave the cluster; a move interrupted
at any moment, a SIGKILLed operator among them, loses nothing and stores nothing twice."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

from skyscan import conditions as cond
from skyscan import manifest, names
from skyscan.io import kube, payloads
from skyscan.io.archive import Archive
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan_operator.archiver import Archiver
from skyscan_operator.settings import OperatorSettings
from tests.helpers import eventually
from tests.integration.operator.conftest import EVENT, OperatorFactory, create_scan, get_scan, scan_events

RESULT = payloads.encode({"pixels": [1, 2, 3], "is": "final"}, "result")


async def finished_scan(api: Kube, namespace: str, **spec: Any) -> dict[str, Any]:
    """A scan as the operator leaves one that failed: its event and a result stored, nothing held."""
    name = await create_scan(api, namespace, **spec)
    await payloads.write_result(api, namespace, await get_scan(api, namespace, name), RESULT)
    now = time.time()
    failed = {"type": cond.FAILED, "status": "True", "reason": "ScannerFailed", "message": "test",
              "lastTransitionTime": cond.iso(now)}  # fmt: skip
    status = {"conditions": [failed], "result": {"isFinal": False, "updatedAt": now}, "lastUpdated": now}
    scan: dict[str, Any] = await api.request(
        "PATCH", scan_path(namespace, name, "status"), body={"status": status}, content_type=kube.MERGE_PATCH
    )
    return scan


def archiver(api: Kube, namespace: str, dsn: str) -> Archiver:
    settings = OperatorSettings(namespace=namespace, archive_dsn=dsn, archive_retention_seconds=0)
    return Archiver(api, settings, time.time)


async def gone(api: Kube, namespace: str, name: str) -> bool:
    try:
        await get_scan(api, namespace, name)
    except KubeError as e:
        return e.status == 404
    return False


async def test_a_finished_scan_moves_whole_to_the_archive_and_leaves_the_cluster(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive
) -> None:
    scan = await finished_scan(api, namespace)
    name = scan["metadata"]["name"]
    mover = archiver(api, namespace, archive_dsn)
    mover.observe((namespace, name), scan)
    try:
        await mover.tick()
    finally:
        await mover.close()

    stored = await archive.get(namespace, name)
    assert stored is not None and stored["spec"] == scan["spec"]
    assert stored["status"]["archivedAt"] > 0 and "managedFields" not in stored["metadata"]
    assert manifest.of(stored) == manifest.of(scan)
    assert await archive.result(namespace, name) == RESULT
    assert gzip.decompress(await archive.event(name) or b"") == gzip.decompress(EVENT)
    assert await gone(api, namespace, name)
    assert "Archived" in await scan_events(api, namespace, name, "Archived")

    async def payloads_collected() -> bool:  # by the garbage collector, through their ownerReferences
        listed = await api.request(
            "GET", core_path("configmaps", namespace), params={"labelSelector": names.PAYLOAD_LABEL}
        )
        return not listed["items"]

    await eventually(payloads_collected, timeout=60)


async def test_a_scan_still_in_use_or_not_yet_due_stays(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive
) -> None:
    live = await create_scan(api, namespace)  # never finished
    young = await finished_scan(api, namespace)
    mover = archiver(api, namespace, archive_dsn)
    mover._settings.archive_retention_seconds = 3600  # finished, but recently
    mover.observe((namespace, live), await get_scan(api, namespace, live))
    mover.observe((namespace, young["metadata"]["name"]), young)
    assert len(mover.queue) == 1
    try:
        await mover.tick()
    finally:
        await mover.close()
    assert not await archive.has(namespace, live) and not await archive.has(
        namespace, young["metadata"]["name"]
    )
    assert not await gone(api, namespace, live) and not await gone(api, namespace, young["metadata"]["name"])


class DiesAfterCommit(Archiver):
    """A move that stops right after the archive's commit, before the Scan is deleted (as a crash)."""

    async def _post(self, scan: dict[str, Any], type_: str, reason: str, message: str) -> None:
        raise RuntimeError("killed")


async def test_a_move_interrupted_after_its_commit_is_finished_by_the_next_one(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive
) -> None:
    scan = await finished_scan(api, namespace)
    name, key = scan["metadata"]["name"], (namespace, scan["metadata"]["name"])
    first = DiesAfterCommit(api, OperatorSettings(namespace=namespace, archive_dsn=archive_dsn,
                                                  archive_retention_seconds=0), time.time)  # fmt: skip
    first.observe(key, scan)
    try:
        await first.move(key)
    except RuntimeError:
        pass
    finally:
        await first.close()
    assert await archive.has(namespace, name) and not await gone(api, namespace, name)  # both copies

    # Meanwhile the live copy changes (soft-deleted): the next move stores the newer copy, then deletes.
    await api.request(
        "PATCH", scan_path(namespace, name), body={"spec": {"deleted": True}}, content_type=kube.MERGE_PATCH
    )
    second = archiver(api, namespace, archive_dsn)
    second.observe(key, await get_scan(api, namespace, name))
    try:
        await second.tick()
    finally:
        await second.close()
    stored = await archive.get(namespace, name)
    assert stored is not None and stored["spec"]["deleted"] is True
    assert await gone(api, namespace, name)
    async with archive.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM scans WHERE scan_id = $1", name) == 1


async def test_an_unreachable_archive_leaves_the_scan_live_and_due_again(api: Kube, namespace: str) -> None:
    scan = await finished_scan(api, namespace)
    name = scan["metadata"]["name"]
    mover = archiver(api, namespace, "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    mover.observe((namespace, name), scan)
    await mover.tick()
    assert not await gone(api, namespace, name)
    assert len(mover.queue) == 1  # retried later


async def test_an_operator_sigkilled_mid_move_loses_nothing_and_stores_nothing_twice(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive, operator: OperatorFactory
) -> None:
    scans = await asyncio.gather(*(finished_scan(api, namespace, priority=i) for i in range(24)))
    expected = {s["metadata"]["name"]: s["spec"] for s in scans}
    moving = {"SKYSCAN_ARCHIVE_DSN": archive_dsn, "SKYSCAN_ARCHIVE_RETENTION_SECONDS": "0",
              "SKYSCAN_ARCHIVE_INTERVAL_SECONDS": "0.2", "SKYSCAN_ARCHIVE_BATCH": "2"}  # fmt: skip

    async def archived() -> int:
        async with archive.pool.acquire() as conn:
            return int(await conn.fetchval("SELECT count(*) FROM scans WHERE namespace = $1", namespace))

    first = operator(**moving)
    await eventually(lambda: _at_least(archived, 3), timeout=60, interval=0.05)
    first.kill()
    killed_at = await archived()
    assert killed_at < len(expected), "the operator was killed after it had moved everything"

    operator(**moving)

    async def all_moved() -> bool:
        listed = await api.request("GET", scan_path(namespace))
        return not listed["items"] and await archived() == len(expected)

    await eventually(all_moved, timeout=90)
    for name, spec in expected.items():
        stored = await archive.get(namespace, name)
        assert stored is not None and stored["spec"] == spec, name
        assert await archive.result(namespace, name) == RESULT
    async with archive.pool.acquire() as conn:
        rows = await conn.fetch("SELECT scan_id FROM scans WHERE namespace = $1", namespace)
    assert sorted(r["scan_id"] for r in rows) == sorted(expected)  # each once


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count() >= n)
