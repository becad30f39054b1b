"""The PostgreSQL archive against a real server, logged in as its least-privilege role: schema,
idempotent puts, reads, atomicity."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
from typing import Any

import asyncpg
import pytest

from skyscan import manifest
from skyscan.io.archive import MIGRATION_LOCK, MIGRATIONS, Archive, migrate
from skyscan.scan_record import ScanRecord
from tests.archived import record, scan_object
from tests.helpers import eventually


@pytest.fixture
def archive_dsn(archive_role_dsn: str) -> str:
    """This module's archives log in as a deployment does: as a least-privilege role that owns the
    database (the migrations run as it too)."""
    return archive_role_dsn


def unpacked(payload: bytes | None) -> Any:
    assert payload is not None
    return json.loads(gzip.decompress(payload))


async def count(archive: Archive, table: str) -> int:
    return int(await archive.pool.fetchval(f"SELECT count(*) FROM {table}"))


async def test_migrations_apply_once_and_connecting_again_changes_nothing(archive_dsn: str) -> None:
    first = await Archive.connect(archive_dsn)
    try:
        await first.put(record(scan_object()))
        second = await Archive.connect(archive_dsn)
        await second.close()
        versions = await first.pool.fetch("SELECT version FROM skyscan_schema ORDER BY version")
        assert versions == [(v,) for v in range(1, len(MIGRATIONS) + 1)]
        assert await count(first, "scans") == 1
    finally:
        await first.close()


async def test_concurrent_migrations_wait_for_each_other(archive_dsn: str) -> None:
    """Two processes starting together: the advisory lock makes the second see the first's schema."""
    conns = [await asyncpg.connect(archive_dsn) for _ in range(2)]
    try:
        async with conns[0].transaction():
            await conns[0].execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            waiting = asyncio.ensure_future(migrate(conns[1]))

            async def blocked() -> bool:
                query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                return bool(await conns[0].fetchval(query))

            await eventually(blocked, timeout=10)
            assert not waiting.done()
            assert not await conns[0].fetchval("SELECT to_regclass('scans') IS NOT NULL")
        assert await asyncio.wait_for(waiting, 10) == len(MIGRATIONS)
        assert await migrate(conns[0]) == len(MIGRATIONS)
    finally:
        for conn in conns:
            await conn.close()


async def test_every_pooled_connection_has_the_statement_timeout(archive_dsn: str) -> None:
    archive = await Archive.connect(archive_dsn, pool_size=2, statement_timeout=0.25)
    try:
        async with archive.pool.acquire() as a, archive.pool.acquire() as b:
            assert [await c.fetchval("SHOW statement_timeout") for c in (a, b)] == ["250ms", "250ms"]
            with pytest.raises(asyncpg.QueryCanceledError):
                await a.execute("SELECT pg_sleep(5)")
    finally:
        await archive.close()


async def test_a_put_twice_stores_one_row_and_reads_return_what_was_put(archive: Archive) -> None:
    scan = scan_object("ns-a", classifiers={"origin": "alert"})
    rec = record(scan, event_payload={"big": "event"}, result={"skymap": [1, 2]}, archived_at=1700000000.5)
    await archive.put(rec)
    await archive.put(rec)
    name = scan["metadata"]["name"]
    assert await count(archive, "scans") == 1 and await count(archive, "sensor_events") == 1

    got = await archive.get("ns-a", name)
    assert got is not None
    assert "managedFields" not in got["metadata"] and got["spec"] == scan["spec"]
    assert ScanRecord(got).archived_at == 1700000000.5
    assert manifest.of(got) == rec.manifest  # the stored copy still yields the same manifest
    assert await archive.has("ns-a", name)
    assert unpacked(await archive.result("ns-a", name)) == {"skymap": [1, 2]}
    assert unpacked(await archive.event(scan["spec"]["sensorEventId"])) == {"big": "event"}
    row = await archive.pool.fetchrow("SELECT run_id, event_id, classifiers, is_deleted FROM scans")
    assert dict(row) == {
        "run_id": 123, "event_id": 456, "classifiers": {"origin": "alert"}, "is_deleted": False
    }  # fmt: skip


async def test_reads_are_scoped_to_the_namespace_and_miss_cleanly(archive: Archive) -> None:
    scan = scan_object("ns-a")
    await archive.put(record(scan))
    name = scan["metadata"]["name"]
    assert await archive.get("ns-b", name) is None
    assert not await archive.has("ns-b", name)
    assert await archive.result("ns-a", name) is None  # archived without a result
    assert await archive.result("ns-a", "no-such-scan") is None
    assert await archive.event("no-such-event") is None


async def test_a_newer_copy_wins_and_an_older_one_changes_nothing(archive: Archive) -> None:
    old = scan_object("ns", resource_version=100)
    name = old["metadata"]["name"]
    new = scan_object("ns", name, resource_version=205, deleted=True)
    await archive.put(record(old, archived_at=1.0))
    await archive.put(record(new, archived_at=2.0))
    await archive.put(record(old, archived_at=3.0))  # a stale retry
    got = await archive.get("ns", name)
    assert got is not None
    assert got["metadata"]["resourceVersion"] == "205" and got["spec"]["deleted"] is True
    assert ScanRecord(got).archived_at == 2.0
    row = await archive.pool.fetchrow("SELECT is_deleted, archived_at FROM scans")
    assert (row["is_deleted"], row["archived_at"]) == (True, 2.0)


async def test_an_event_shared_by_two_scans_is_stored_once(archive: Archive) -> None:
    parent = scan_object("ns", sensorEventId="shared")
    child = scan_object("ns", sensorEventId="shared", rescanOf=parent["metadata"]["name"])
    await archive.put(record(parent, event_payload={"e": 1}))
    await archive.put(record(child, event_payload={"e": 1}))
    assert await count(archive, "scans") == 2 and await count(archive, "sensor_events") == 1
    assert unpacked(await archive.event("shared")) == {"e": 1}


async def test_rescans_of_lists_direct_children_only_oldest_first(archive: Archive) -> None:
    root = scan_object("ns", "root")
    older = scan_object("ns", "zz-older", rescanOf="root")
    newer = scan_object("ns", "aa-newer", rescanOf="root")
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    newer["metadata"]["creationTimestamp"] = "2026-01-01T00:00:01Z"
    grandchild = scan_object("ns", "grandchild", rescanOf="zz-older")
    elsewhere = scan_object("other", "elsewhere", rescanOf="root")
    for scan in (root, newer, grandchild, older, elsewhere):
        await archive.put(record(scan))
    assert await archive.rescans_of("ns", ["root"]) == ["zz-older", "aa-newer"]
    both = await archive.rescans_of("ns", ["root", "zz-older"])
    assert sorted(both) == ["aa-newer", "grandchild", "zz-older"]
    assert await archive.rescans_of("ns", []) == []


async def test_update_soft_deletes_an_archived_scan_and_keeps_its_archive_time(archive: Archive) -> None:
    scan = scan_object("ns")
    name = scan["metadata"]["name"]
    await archive.put(record(scan, archived_at=42.0))

    def delete(stored: dict[str, Any]) -> dict[str, Any]:
        changed = {**stored, "spec": {**stored["spec"], "deleted": True, "replacedBy": "other-scan"}}
        changed["status"] = {k: v for k, v in changed["status"].items() if k != "archivedAt"}
        return changed

    updated = await archive.update("ns", name, delete)
    assert updated is not None and ScanRecord(updated).archived_at == 42.0
    got = await archive.get("ns", name)
    assert got is not None and got["spec"]["deleted"] is True and ScanRecord(got).archived_at == 42.0
    row = await archive.pool.fetchrow("SELECT is_deleted, manifest, archived_at FROM scans")
    assert row["is_deleted"] is True and row["archived_at"] == 42.0
    assert row["manifest"]["replaced_by_scan_id"] == "other-scan"
    await archive.put(record(scan))  # the same copy again (a retried move) does not undo it
    assert (await archive.get("ns", name) or {})["spec"]["deleted"] is True
    assert await archive.update("elsewhere", name, delete) is None


async def test_concurrent_updates_of_one_archived_scan_never_undo_each_other(archive: Archive) -> None:
    scan = scan_object("ns")
    name = scan["metadata"]["name"]
    await archive.put(record(scan))

    def mark(key: str) -> Any:
        def change(stored: dict[str, Any]) -> dict[str, Any]:
            return {
                **stored,
                "spec": {**stored["spec"], "classifiers": {**stored["spec"].get("classifiers", {}), key: 1}},
            }

        return change

    await asyncio.gather(*(archive.update("ns", name, mark(f"k{i}")) for i in range(8)))
    got = await archive.get("ns", name)
    assert got is not None and set(got["spec"]["classifiers"]) >= {f"k{i}" for i in range(8)}


async def test_a_put_failing_midway_leaves_nothing(archive: Archive) -> None:
    """The event insert succeeds, the scan insert violates NOT NULL: neither is kept."""
    rec = record(scan_object("ns"))
    broken = dataclasses.replace(rec, manifest={**rec.manifest, "timestamp": None})
    with pytest.raises(asyncpg.NotNullViolationError):
        await archive.put(broken)
    assert await count(archive, "scans") == 0 and await count(archive, "sensor_events") == 0
    await archive.put(rec)
    assert await count(archive, "scans") == 1 and await count(archive, "sensor_events") == 1
