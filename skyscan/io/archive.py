"""The archive: finished scans moved out of the cluster into PostgreSQL (setting SKYSCAN_ARCHIVE_DSN).

One row per scan in `scans` (the compact Scan object, its REST manifest, its result payload, its
scanner's kept log and the columns searches use) and one per sensor event in `sensor_events`, shared
by every scan that uses it.
Payloads are stored exactly as the cluster stores them (`skyscan.io.payloads`: gzip of the JSON).

The schema is versioned in code: `MIGRATIONS[i]` brings the database to version i + 1. `connect`
applies the missing ones in one transaction under an advisory lock, so processes starting together
migrate once, and records each version in `skyscan_schema`.

A Scan read back from here carries `status.archivedAt` (Unix seconds), which tells readers it is
archived (`skyscan.scan_record.ScanRecord.archived_at`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import asyncpg

from skyscan import manifest
from skyscan.scan_record import ScanRecord, resource_version

SCHEMA_V1 = """
CREATE TABLE sensor_events (
  sensor_event_id text PRIMARY KEY,
  payload bytea NOT NULL
);
CREATE TABLE scans (
  scan_id text PRIMARY KEY,
  namespace text NOT NULL,
  sensor_event_id text NOT NULL REFERENCES sensor_events,
  rescan_of text,
  created_at double precision NOT NULL,
  last_updated double precision NOT NULL,
  is_deleted boolean NOT NULL,
  run_id bigint,
  event_id bigint,
  classifiers jsonb NOT NULL,
  manifest jsonb NOT NULL,
  scan jsonb NOT NULL,
  result bytea,
  archived_at double precision NOT NULL
);
CREATE INDEX scans_run_event ON scans (run_id, event_id);
CREATE INDEX scans_event ON scans (event_id);
CREATE INDEX scans_classifiers ON scans USING gin (classifiers jsonb_path_ops);
CREATE INDEX scans_created ON scans (created_at);
CREATE INDEX scans_rescan_of ON scans (rescan_of) WHERE rescan_of IS NOT NULL;
"""
# A scan failed because its sensor event was never stored is archived without one: its event id no
# longer has to name a stored event (GET /i3-event answers 404 for it, as in the cluster).
SCHEMA_V2 = "ALTER TABLE scans DROP CONSTRAINT IF EXISTS scans_sensor_event_id_fkey;"
# The dashboard's table pages by scan id, newest first, within a namespace (`ORDER BY scan_id COLLATE "C"`).
SCHEMA_V3 = 'CREATE INDEX IF NOT EXISTS scans_newest ON scans (namespace, scan_id COLLATE "C");'
# The scanner's log as kept in the cluster (`skyscan.scanner_log`: gzip of its head and tail).
SCHEMA_V4 = "ALTER TABLE scans ADD COLUMN IF NOT EXISTS scanner_log bytea;"
MIGRATIONS: tuple[str, ...] = (SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4)
# Every table the migrations create (with their indexes): what the archive's role must own
# (skyscan.io.archive_role). A migration that adds a table adds it here.
TABLES = ("skyscan_schema", "sensor_events", "scans")
MIGRATION_LOCK = 0x736B797363616E  # pg_advisory_xact_lock key: "skyscan" in ASCII

# The columns of `scans`, in the order `columns` returns them and the INSERT names them.
SCAN_COLUMNS = (
    "scan_id", "namespace", "sensor_event_id", "rescan_of", "created_at", "last_updated", "is_deleted",
    "run_id", "event_id", "classifiers", "manifest", "scan", "result", "archived_at", "scanner_log",
)  # fmt: skip
# What a soft delete of an archived scan may change (identity, payloads and archive time stay).
REPLACED_COLUMNS = (
    "rescan_of", "last_updated", "is_deleted", "run_id", "event_id", "classifiers", "manifest",
)  # fmt: skip

# The stored copy's resourceVersion as a number (0 when missing or not numeric), to compare copies.
_STORED_VERSION = """
CASE WHEN scans.scan #>> '{metadata,resourceVersion}' ~ '^[0-9]{1,18}$'
     THEN (scans.scan #>> '{metadata,resourceVersion}')::bigint ELSE 0 END
"""
_INSERT_EVENT = """
INSERT INTO sensor_events (sensor_event_id, payload) VALUES ($1, $2)
ON CONFLICT (sensor_event_id) DO NOTHING
"""
# A second put of the same scan replaces the row only with a newer copy (a higher resourceVersion):
# a retried move stores nothing twice, and a stale copy never undoes a newer one.
_INSERT_SCAN = f"""
INSERT INTO scans ({", ".join(SCAN_COLUMNS)})
VALUES ({", ".join(f"${i}" for i in range(1, len(SCAN_COLUMNS) + 1))})
ON CONFLICT (scan_id) DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in SCAN_COLUMNS[1:])}
WHERE {_STORED_VERSION} < ${len(SCAN_COLUMNS) + 1}
"""
# The caller's scan keeps the row's archive time in status.archivedAt.
_REPLACE = f"""
UPDATE scans SET {", ".join(f"{c} = ${i}" for i, c in enumerate(REPLACED_COLUMNS, start=3))},
  scan = jsonb_set(${len(REPLACED_COLUMNS) + 3}, '{{status,archivedAt}}', to_jsonb(scans.archived_at))
WHERE namespace = $1 AND scan_id = $2
"""


@dataclass(frozen=True)
class ArchivedScan:
    """One finished scan as it moves into the archive."""

    scan: Mapping[str, Any]  # the compact Scan object (skyscan.scan_record.compact)
    manifest: Mapping[str, Any]  # skyscan.manifest.of(scan)
    event: bytes | None  # gzip payload of its sensor event; None: it was never stored (EventMissing)
    result: bytes | None  # gzip payload of its result, if it has one
    archived_at: float  # Unix seconds
    scanner_log: bytes | None = None  # gzip of its scanner's kept log, if one was kept


def _bigint(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def with_archived_at(scan: Mapping[str, Any], archived_at: float) -> dict[str, Any]:
    """A copy of `scan` whose status says when it was archived."""
    return {**scan, "status": {**ScanRecord(scan).status, "archivedAt": archived_at}}


def _searched(scan: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The columns derived from the Scan and its manifest that searches filter on."""
    event = manifest.get("event_metadata") or {}
    return {
        "rescan_of": ScanRecord(scan).rescan_of,
        "last_updated": manifest["last_updated"],
        "is_deleted": bool(manifest["is_deleted"]),
        "run_id": _bigint(event.get("run_id")),
        "event_id": _bigint(event.get("event_id")),
        "classifiers": manifest["classifiers"],
        "manifest": dict(manifest),
    }


def columns(rec: ArchivedScan) -> dict[str, Any]:
    """The `scans` row of a record, by column name in SCAN_COLUMNS order (pure)."""
    meta = rec.scan["metadata"]
    row = {
        "scan_id": meta["name"],
        "namespace": meta["namespace"],
        "sensor_event_id": rec.manifest["sensor_event_id"],
        "created_at": rec.manifest["timestamp"],
        **_searched(rec.scan, rec.manifest),
        "scan": with_archived_at(rec.scan, rec.archived_at),
        "result": rec.result,
        "archived_at": rec.archived_at,
        "scanner_log": rec.scanner_log,
    }
    return {c: row[c] for c in SCAN_COLUMNS}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def _prepare_connection(conn: asyncpg.Connection) -> None:
    """jsonb in and out as Python values (on every pooled connection)."""
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=json.loads, schema="pg_catalog")


async def migrate(conn: asyncpg.Connection) -> int:
    """Apply the migrations the database lacks; returns the schema version it is at now."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        # A migration over a big table may outlast the statement timeout meant for queries.
        await conn.execute("SET LOCAL statement_timeout = 0")
        await conn.execute("CREATE TABLE IF NOT EXISTS skyscan_schema (version integer PRIMARY KEY)")
        current = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM skyscan_schema"))
        for version, sql in enumerate(MIGRATIONS[current:], start=current + 1):
            await conn.execute(sql)
            await conn.execute("INSERT INTO skyscan_schema (version) VALUES ($1)", version)
        return max(current, len(MIGRATIONS))


class ArchiveUnavailable(OSError):
    """PostgreSQL refused, reset or did not answer a connection: the archive's outage, told apart from
    the API server's (both are OSErrors to their clients)."""


P = ParamSpec("P")
T = TypeVar("T")


def _reaching(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except ArchiveUnavailable:
            raise
        except OSError as e:  # TimeoutError and the connection errors
            raise ArchiveUnavailable(f"PostgreSQL did not answer: {e!r}") from e

    return call


class Archive:
    """The archive over a connection pool (`connection()` for other queries, e.g. finds). A connection
    that cannot be made or is lost raises `ArchiveUnavailable`."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, dsn: str, *, pool_size: int = 4, statement_timeout: float = 5.0) -> Archive:
        """Open a pool (every connection with a server-side statement timeout) and migrate."""
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=pool_size,
            init=_prepare_connection,
            server_settings={"statement_timeout": str(int(statement_timeout * 1000))},
            # The server cancels slow statements; this bounds waiting on a server that stopped answering.
            command_timeout=statement_timeout + 5.0,
        )
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
        except BaseException:
            await pool.close()
            raise
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            async with self.pool.acquire() as conn:
                yield conn
        except OSError as e:
            raise ArchiveUnavailable(f"PostgreSQL did not answer: {e!r}") from e

    @_reaching
    async def put(self, rec: ArchivedScan) -> None:
        """Store a scan and its event in one transaction; safe to repeat (see _INSERT_SCAN)."""
        row = columns(rec)
        async with self.pool.acquire() as conn, conn.transaction():
            if rec.event is not None:
                await conn.execute(_INSERT_EVENT, row["sensor_event_id"], rec.event)
            await conn.execute(_INSERT_SCAN, *row.values(), resource_version(rec.scan))

    @_reaching
    async def get(self, namespace: str, scan_id: str) -> dict[str, Any] | None:
        """The archived Scan object (with status.archivedAt), or None."""
        found = await self.pool.fetchval(
            "SELECT scan FROM scans WHERE namespace = $1 AND scan_id = $2", namespace, scan_id
        )
        return dict(found) if found is not None else None

    @_reaching
    async def has(self, namespace: str, scan_id: str) -> bool:
        found = await self.pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM scans WHERE namespace = $1 AND scan_id = $2)", namespace, scan_id
        )
        return bool(found)

    @_reaching
    async def result(self, namespace: str, scan_id: str) -> bytes | None:
        """The gzip result payload; None when the scan is not archived or has no result."""
        found = await self.pool.fetchval(
            "SELECT result FROM scans WHERE namespace = $1 AND scan_id = $2", namespace, scan_id
        )
        return bytes(found) if found is not None else None

    @_reaching
    async def scanner_log(self, namespace: str, scan_id: str) -> bytes | None:
        """The gzip of the scan's scanner's kept log; None when not archived or none was kept."""
        found = await self.pool.fetchval(
            "SELECT scanner_log FROM scans WHERE namespace = $1 AND scan_id = $2", namespace, scan_id
        )
        return bytes(found) if found is not None else None

    @_reaching
    async def event(self, sensor_event_id: str) -> bytes | None:
        """The gzip sensor event payload, or None."""
        found = await self.pool.fetchval(
            "SELECT payload FROM sensor_events WHERE sensor_event_id = $1", sensor_event_id
        )
        return bytes(found) if found is not None else None

    @_reaching
    async def rescans_of(self, namespace: str, parents: Sequence[str]) -> list[str]:
        """The archived scans that directly rescan any of `parents`, oldest first."""
        rows = await self.pool.fetch(
            "SELECT scan_id FROM scans WHERE namespace = $1 AND rescan_of = ANY($2::text[])"
            " ORDER BY created_at, scan_id",
            namespace,
            list(parents),
        )
        return [str(r["scan_id"]) for r in rows]

    @_reaching
    async def update(
        self, namespace: str, scan_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Store `change(stored copy)` of an archived scan (a soft delete, a replacement mark), its
        manifest recomputed; the row is locked from read to write, so concurrent changes never undo
        each other. None if the scan is not archived."""
        async with self.pool.acquire() as conn, conn.transaction():
            stored = await conn.fetchval(
                "SELECT scan FROM scans WHERE namespace = $1 AND scan_id = $2 FOR UPDATE", namespace, scan_id
            )
            if stored is None:
                return None
            scan = change(stored)
            searched = _searched(scan, manifest.of(scan))
            # jsonb_set needs the parent object to exist
            status = ScanRecord(scan).status
            values = (searched[c] for c in REPLACED_COLUMNS)
            await conn.execute(_REPLACE, namespace, scan_id, *values, {**scan, "status": status})
            return with_archived_at(scan, ScanRecord(stored).archived_at or 0.0)
