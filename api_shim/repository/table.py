"""The dashboard's table of scans (`GET /scans`): a page of scans, newest first, below a cursor, from the
live copy and, on demand, the archive, chosen by a parsed find filter (`api_shim.find`) and by state.

Scan ids begin with their creation time, so newest first is scan id order reversed, and a page ends
where the next begins (`before`, a scan id): a cursor that stays right while scans arrive, which an
offset would not. Live scans are read off the find index's id order, a run of names at a time, each
unpacked only when its manifest matches; archived ones by keyset over (namespace, scan id), a batch
at a time, so a page costs the same whether the archive holds a thousand scans or a million.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import asyncpg

from api_shim import view
from api_shim.errors import bad_request
from api_shim.find import index, sql
from api_shim.find.match import Predicate, compile_filter
from api_shim.find.query import Query
from api_shim.repository.cache import ScanCache
from api_shim.repository.store import Obj
from skyscan.io.archive import Archive

RUN = 256  # live names examined per turn of the event loop
ARCHIVE_BATCHES = 20  # batches of limit + 1 archived scans a page reads at most (a state filter skips)


@dataclass(frozen=True)
class TableAsk:
    filter: Query  # a find filter, without patterns
    states: frozenset[str]  # `view.in_states`; empty: any
    archived: bool  # archived scans too
    before: str | None  # only scans whose id sorts before this one
    limit: int


@dataclass(frozen=True)
class TablePage:
    rows: list[dict[str, Any]]  # `view.table_row`, newest first
    next: str | None  # the next page's `before`; None: this is the last


async def page(cache: ScanCache, archive: Archive | None, namespace: str, ask: TableAsk) -> TablePage:
    matches = compile_filter(ask.filter, {}).matches
    found = await _live(cache, ask, matches)
    if archive is not None and ask.archived:
        found += await _archived(archive, namespace, ask, matches, cache)
    found.sort(key=view.scan_id, reverse=True)
    rows = [view.table_row(scan) for scan in found[: ask.limit]]
    return TablePage(rows, rows[-1]["scan_id"] if len(found) > ask.limit else None)


async def _live(cache: ScanCache, ask: TableAsk, matches: Predicate) -> list[Obj]:
    """Up to `limit` + 1 live scans below `before`, newest first."""
    within = cache.find_index.among(index.lookups(ask.filter))
    order = sorted(within) if within is not None else cache.find_index.in_order()
    end = len(order) if ask.before is None else bisect.bisect_left(order, ask.before)
    found: list[Obj] = []
    while end > 0 and len(found) <= ask.limit:
        run = order[max(0, end - RUN) : end]
        end -= len(run)
        documents = {doc["scan_id"]: doc for _, doc in cache.find_documents(run)}
        for name in reversed(run):
            doc = documents.get(name)
            if doc is None or not matches(doc) or (scan := cache.get(name)) is None:
                continue
            if view.in_states(scan, ask.states):
                found.append(scan)
                if len(found) > ask.limit:
                    break
        await asyncio.sleep(0)
    return found


async def _archived(
    archive: Archive, namespace: str, ask: TableAsk, matches: Predicate, live: Container[str]
) -> list[Obj]:
    """Up to `limit` + 1 archived scans below `before`, newest first, leaving out live ones (the live
    copy wins). The SQL selects candidates; the matcher decides, as for a find."""
    where, params = sql.translate(ask.filter, first_param=4)
    query = (
        "SELECT scan_id, manifest, scan FROM scans WHERE namespace = $1"
        f' AND ($2::text IS NULL OR scan_id COLLATE "C" < $2) AND ({where.text})'
        ' ORDER BY scan_id COLLATE "C" DESC LIMIT $3'
    )
    found: list[Obj] = []
    before, batch = ask.before, ask.limit + 1
    try:
        async with archive.connection() as conn:
            for _ in range(ARCHIVE_BATCHES):
                rows = await conn.fetch(query, namespace, before, batch, *params)
                for row in rows:
                    scan = row["scan"]
                    if (
                        row["scan_id"] not in live
                        and matches(row["manifest"])
                        and view.in_states(scan, ask.states)
                    ):
                        found.append(scan)
                if len(found) > ask.limit or len(rows) < batch:
                    break
                before = rows[-1]["scan_id"]
    except asyncpg.QueryCanceledError:
        raise bad_request(
            "filter too slow over the archive: its statement timeout ended the query",
            "Narrow the table: a run and event, a classifier or a time range.",
        ) from None
    return found[: ask.limit + 1]
