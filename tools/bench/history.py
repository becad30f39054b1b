"""A history of archived scans for the benchmarks, loaded with PostgreSQL COPY straight into the
archive's tables (schema v1, made by `skyscan.io.archive.Archive.connect`), not through the API.

Rows are made from one template: a real Scan object (harness.scan_spec/scan_status, finished,
archived) turned into its manifest and compact form by the product's own functions, serialized once;
each row then only formats its varied values (scan id, timestamps, run and event id, classifier,
sensor event) into that JSON text, so a million rows take seconds of Python. Archived scan `i` has
run_id ARCHIVED_RUN0 + i // 10, event_id i, classifiers.i = ARCHIVED_I0 + i: disjoint from the live
scans' values.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from harness import EVENT, scan_spec, scan_status

from skyscan import manifest, model, names, scan_record

ARCHIVED_RUN0 = 900_000
ARCHIVED_I0 = 10_000_000
SCANS_PER_EVENT = 4  # rescans share their event: the archive stores it once
BATCH = 20_000
_SENTINELS = {
    "name": "0000000000ax5e471ne15e471ne15e47",
    "event": "5e471ne1e7e575e471ne1e7e5e471ne1",
    "created": "1111111111.125",
    "updated": "1222222222.25",
    "archived": "1333333333.5",
    "run": "987654321987",
    "event_id": "876543219876",
    "i": "765432198765",
}


@dataclass(frozen=True)
class Template:
    """The manifest and compact Scan JSON texts with `{field}` holes for the varied values."""

    manifest: str
    scan: str

    @classmethod
    def make(cls, namespace: str) -> Template:
        s = _SENTINELS
        spec = {
            **scan_spec(0),
            "sensorEventId": s["event"],
            "classifiers": {"origin": "bench", "i": int(s["i"])},
        }
        st = scan_status(0)
        st["eventMetadata"] |= {"runId": int(s["run"]), "eventId": int(s["event_id"])}
        st |= {"lastUpdated": float(s["updated"]), "archivedAt": float(s["archived"])}
        obj = {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "metadata": {
                "name": s["name"],
                "namespace": namespace,
                "uid": s["name"],
                "generation": 1,
                "creationTimestamp": "2025-01-01T00:00:00Z",
                "annotations": {names.TIMESTAMP_ANNOTATION: s["created"]},
            },
            "spec": spec,
            "status": st,
        }
        return cls(_holes(json.dumps(manifest.of(obj))), _holes(json.dumps(scan_record.compact(obj))))


def _holes(text: str) -> str:
    text = text.replace("{", "{{").replace("}", "}}")
    for field, sentinel in _SENTINELS.items():
        if sentinel not in text and field != "archived":
            raise ValueError(f"the template lost its {field} ({sentinel}): the manifest changed shape")
        text = text.replace(sentinel, "{" + field + "}")
    return text


def event_id(i: int) -> str:
    return f"a{i // SCANS_PER_EVENT:031x}"


def scan_rows(t: Template, namespace: str, first: int, n: int, now: float) -> Iterator[dict[str, Any]]:
    """Archived scans first..first+n-1 as column -> value (json/jsonb as text), oldest first."""
    base = now - 400 * 86400
    for i in range(first, first + n):
        created = base + i * 0.5
        values = {
            "name": model.new_scan_id(created, f"{random.getrandbits(80):020x}"),
            "event": event_id(i),
            "created": repr(created),
            "updated": repr(created + 3600),
            "archived": repr(created + 8 * 86400),
            "run": str(ARCHIVED_RUN0 + i // 10),
            "event_id": str(i),
            "i": str(ARCHIVED_I0 + i),
        }
        yield {
            "scan_id": values["name"],
            "namespace": namespace,
            "sensor_event_id": values["event"],
            "rescan_of": None,
            "created_at": created,
            "last_updated": created + 3600,
            "is_deleted": False,
            "run_id": ARCHIVED_RUN0 + i // 10,
            "event_id": i,
            "classifiers": json.dumps({"origin": "bench", "i": ARCHIVED_I0 + i}),
            "manifest": t.manifest.format(**values),
            "scan": t.scan.format(**values),
            "result": None,
            "archived_at": created + 8 * 86400,
            "scanner_log": None,  # no kept log: the bench's archived scans never ran a scanner
        }


def as_records(rows: Iterator[dict[str, Any]], columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows in the table's column order; a column the bench does not know stops it (schema drift)."""
    out = []
    for row in rows:
        if len(row) != len(columns):
            unknown = set(columns) ^ set(row)
            raise ValueError(f"archive columns differ from what the bench fills: {sorted(unknown)}")
        out.append(tuple(row[c] for c in columns))
    return out


async def load(dsn: str, namespace: str, n: int) -> dict[str, float]:
    """`n` archived scans of `namespace` and their events, by COPY in batches: the scans table's
    secondary indexes are dropped first and built again after (as one does for a bulk load), then
    ANALYZE. Returns the seconds each part took."""
    import asyncpg  # only the archive benchmarks need the driver

    took: dict[str, float] = {}
    began = time.monotonic()
    conn = await asyncpg.connect(dsn)
    try:
        columns = [r["column_name"] for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'scans'"
            " ORDER BY ordinal_position")]  # fmt: skip
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'scans'"
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
        )
        for ix in indexes:
            await conn.execute(f'DROP INDEX "{ix["indexname"]}"')
        events = [(event_id(i * SCANS_PER_EVENT), EVENT) for i in range(-(-n // SCANS_PER_EVENT))]
        for at in range(0, len(events), BATCH):
            await conn.copy_records_to_table("sensor_events", records=events[at : at + BATCH])
        took["events_s"] = time.monotonic() - began
        template, now = Template.make(namespace), time.time()
        for at in range(0, n, BATCH):
            records = as_records(scan_rows(template, namespace, at, min(BATCH, n - at), now), columns)
            await conn.copy_records_to_table("scans", records=records, columns=columns)
        took["scans_s"] = time.monotonic() - began - took["events_s"]
        mark = time.monotonic()
        for ix in indexes:
            await conn.execute(ix["indexdef"])
        await conn.execute("ANALYZE scans")
        await conn.execute("ANALYZE sensor_events")
        took["indexes_s"] = time.monotonic() - mark
    finally:
        await conn.close()
    return {k: round(v, 1) for k, v in took.items()}
