"""Searching scans: the MongoDB-style find over manifests, and the backlog.

A find never holds the event loop for long, so other routes answer at their usual latency while
finds run: the filter is checked against `FindLimits` (size, depth, patterns on a linear-time
engine, documents x cost) and compiled, its patterns a slice at a time (refused as soon as those
compiled take it beyond the work budget), before any document is read;
matching runs over the cache's per-version manifests in slices of `SLICE_SECONDS`, yielding to the
loop between slices; the answer is encoded in chunks, yielding likewise, and written as the client drains
it; and at most `CONCURRENT_FINDS` finds compile, match or encode at a time per shim (others wait
their turn), so any other request waits at most that many slices per turn of the event loop.

A find that names a run id, an event id or a classifier value (`api_shim.narrowing`) matches only the
scans the cache's `FindIndex` lists for it. With an archive, the archived candidates its SQL selects
(`api_shim.archive_find`) are tested by the same compiled filter and merged in after the live matches
(read first), in scan id order, a scan in both stores once, as it is live.

A find the index answers alone (`narrowing.exact`: equalities on indexed paths and `is_deleted`)
projected to `scan_id` (or to no field) reads no manifest: its matches are the names the index selects,
read off its id order a slice at a time (or sorted, when few), and its answer is those names, each
encoded by json's own string encoder, joined as the same bytes the general path writes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import asyncpg
from aiohttp import web

from api_shim import archive_find, find_index, models, narrowing, view
from api_shim.cache import ScanCache
from api_shim.errors import ApiError, bad_request
from api_shim.filters import (
    UNCOMPILED,
    Filter,
    FilterError,
    FindLimits,
    Predicate,
    RegexKey,
    check_shape,
    compile_regex_for,
    parse_filter,
    plan_filter,
    regex_cost,
)
from api_shim.find_index import FindIndex
from api_shim.plumbing import SHIM, names_of, ok, parse_body
from api_shim.regex import Regex, RegexError
from api_shim.wire_names import Names, SameField, filter_in_interface_names, spoken
from skyscan.archive import Archive
from skyscan.manifest import MANIFEST_FIELDS

LIMITS = FindLimits()
SLICE_SECONDS = 0.0005  # matching or writing between two yields to the event loop
CONCURRENT_FINDS = 2  # per shim; each adds at most one slice to each turn of the loop
WRITE_CHUNK = 32  # manifests encoded at once (32 full manifests are ~0.3 ms of JSON)
PART_BYTES = 64 << 10  # the answer is written in parts of about this size
SORT_RUN = 1024  # manifests sorted at once (sorting 50,000 out-of-order ids in one go takes ~50 ms)
ARCHIVE_BATCH = 64  # archived manifests fetched (and decoded) at once: about a slice of work
ORDER_RUN = 4096  # names of the index's order filtered at once (~0.1 ms)
ID_PART = 2048  # scan ids joined into one part of the answer (~60 KiB, ~0.1 ms)
NARROW = "Narrow the filter: name a run or event id, a classifier value, or a time range."
_SCAN_ID = itemgetter("scan_id")
T = TypeVar("T")
_turns: WeakKeyDictionary[ScanCache, asyncio.Semaphore] = WeakKeyDictionary()


def _turn(cache: ScanCache) -> asyncio.Semaphore:
    """The finds of one shim (one cache, one event loop) take turns."""
    if cache not in _turns:
        _turns[cache] = asyncio.Semaphore(CONCURRENT_FINDS)
    return _turns[cache]


class _Slice:
    """Yields to the event loop once `SLICE_SECONDS` have passed since the last yield."""

    def __init__(self) -> None:
        self._until = time.perf_counter() + SLICE_SECONDS

    async def end_if_due(self) -> None:
        if time.perf_counter() >= self._until:
            await asyncio.sleep(0)
            self._until = time.perf_counter() + SLICE_SECONDS


def too_costly(cost: int, examined: int, *, at_least: bool = False) -> ApiError:
    return bad_request(
        f"filter too costly: {'at least ' if at_least else ''}{cost} per scan * {examined} scans exceeds the "
        f"work budget of {LIMITS.max_work}",
        "Simplify the filter (fewer conditions, $in over values, fewer or simpler $regex patterns).",
    )


def shape_checked(query: dict[str, Any]) -> dict[str, Any]:
    """`query`, once its size, depth and strings are within `LIMITS`, with its field paths in the
    interface's names (400 when not, or when it names one field by both names)."""
    try:
        check_shape(query, LIMITS)
        renamed: dict[str, Any] = filter_in_interface_names(query)  # recursive: its depth checked first
    except (FilterError, SameField) as e:
        raise bad_request(f"invalid filter: {e}") from None
    return renamed


async def compile_in_slices(query: dict[str, Any], examined: int) -> Filter:
    """The compiled filter, within the work budget over `examined` scans (else 400, as for an invalid
    one). A filter of a thousand nodes names hundreds of patterns, tens of ms to compile: the filter is
    planned first (checked but for its patterns: its cost at least), then its patterns are compiled a
    slice at a time, the find refused as soon as the cost they add goes beyond the budget; then the
    filter with them."""
    try:
        plan = plan_filter(query, LIMITS)
        cost, compiled, turn = plan.cost, dict[RegexKey, Regex](), _Slice()
        if cost * examined > LIMITS.max_work:
            raise too_costly(cost, examined, at_least=bool(plan.patterns))
        for key in plan.patterns:
            try:
                compiled[key] = regex = compile_regex_for(key, LIMITS)
            except RegexError:
                break  # the filter's compiler reports it, in its place
            cost += regex_cost(regex) - regex_cost(UNCOMPILED)
            if cost * examined > LIMITS.max_work:
                raise too_costly(cost, examined, at_least=True)
            await turn.end_if_due()
        found = parse_filter(query, LIMITS, compiled)
    except FilterError as e:
        raise bad_request(f"invalid filter: {e}") from None
    if found.cost * examined > LIMITS.max_work:
        raise too_costly(found.cost, examined)
    return found


def candidates(cache: ScanCache, query: dict[str, Any]) -> set[str] | None:
    """The cached scans that can match `query` by its conditions on indexed paths; None: any can (read
    before the filter is compiled, to budget its compiling: a malformed part narrows nothing)."""
    found: set[str] | None = None
    for lookup in narrowing.lookups(query, find_index.indexed):
        names = cache.find_index.names(lookup.path, lookup.values)
        found = names if found is None else found & names
    return found


async def select(
    cache: ScanCache, matches: Predicate, names: set[str] | None = None
) -> Iterator[dict[str, Any]]:
    """The manifests of the cached Scans (of `names`, or all) that `matches` accepts, in scan id order."""
    found: list[dict[str, Any]] = []
    clock = time.perf_counter
    until = clock() + SLICE_SECONDS
    for document in cache.find_documents(names):
        if matches(document):
            found.append(document)
        if clock() >= until:  # the hot loop: `_Slice.end_if_due` inlined
            await asyncio.sleep(0)
            until = clock() + SLICE_SECONDS
    runs, turn = [], _Slice()
    for start in range(0, len(found), SORT_RUN):
        runs.append(sorted(found[start : start + SORT_RUN], key=_SCAN_ID))
        await turn.end_if_due()
    if all(_SCAN_ID(a[-1]) <= _SCAN_ID(b[0]) for a, b in itertools.pairwise(runs)):
        return itertools.chain.from_iterable(runs)  # the usual case: the cache holds Scans in id order
    return heapq.merge(*runs, key=_SCAN_ID)  # lazily, as the answer is written


async def select_archived(
    archive: Archive, namespace: str, query: dict[str, Any], compiled: Filter, live: ScanCache, examined: int
) -> list[dict[str, Any]]:
    """The archived manifests `compiled` accepts among the candidates the archive selects for `query`,
    in scan id order, leaving out scans that are live now (the live copy wins). Refused (400) when the
    candidates are more than `LIMITS.max_archived`, or with the `examined` live ones beyond the work
    budget, or when the archive's statement timeout ends a query."""
    where, params = archive_find.translate(query, first_param=2)
    count, candidates_sql = archive_find.queries(where.text, len(params) + 2)
    found: list[dict[str, Any]] = []
    try:
        async with archive.connection() as conn:
            archived = await conn.fetchval(count, namespace, *params, LIMITS.max_archived + 1)
            if archived > LIMITS.max_archived:
                raise bad_request(
                    f"filter too broad: it selects more than {LIMITS.max_archived} archived scans", NARROW
                )
            if compiled.cost * (examined + archived) > LIMITS.max_work:
                raise bad_request(
                    f"filter too costly: {compiled.cost} per scan * {examined + archived} scans (live and "
                    f"archived) exceeds the work budget of {LIMITS.max_work}",
                    NARROW,
                )
            turn = _Slice()
            async for rows in _batches(conn, candidates_sql, [namespace, *params], archived <= ARCHIVE_BATCH):
                for (document,) in rows:
                    if compiled.matches(document) and document["scan_id"] not in live:
                        found.append(document)
                await turn.end_if_due()
    except asyncpg.QueryCanceledError:
        raise bad_request(
            "filter too slow over the archive: its statement timeout ended the query", NARROW
        ) from None
    return found


async def _batches(
    conn: asyncpg.Connection, query: str, args: list[Any], few: bool
) -> AsyncIterator[list[asyncpg.Record]]:
    """The rows of `query`: `few` (about a batch, by a count just made) at once, more through a cursor
    `ARCHIVE_BATCH` at a time (a cursor costs a transaction and more round trips)."""
    if few:
        yield await conn.fetch(query, *args)
        return
    async with conn.transaction(readonly=True):
        cursor = await conn.cursor(query, *args)
        while rows := await cursor.fetch(ARCHIVE_BATCH):
            yield rows


async def select_ids(index: FindIndex, exact: narrowing.Exact) -> list[str]:
    """The names of the scans `exact` selects, in id order, from the index alone: a few sorted at once,
    more read off the index's order (a snapshot) `ORDER_RUN` at a time, a slice at a time."""
    keep, drop = index.selected([(lookup.path, lookup.values) for lookup in exact.lookups], exact.deleted)
    if keep is not None and len(keep) <= SORT_RUN:
        return sorted(keep)
    order, found, turn = index.in_order(), list[str](), _Slice()
    for start in range(0, len(order), ORDER_RUN):
        run: Iterable[str] = order[start : start + ORDER_RUN]
        if keep is not None:
            run = filter(keep.__contains__, run)
        if drop is not None:
            run = itertools.filterfalse(drop.__contains__, run)
        found += run
        await turn.end_if_due()
    return found


def merge(live: Iterable[T], archived: Iterable[T], key: Callable[[T], str]) -> Iterator[T]:
    """Both in scan id order (`key`); a scan in both (archived while the find ran) once, as it is live."""
    last = None
    for item in heapq.merge(live, archived, key=key):  # equal ids: the live one first
        if key(item) != last:
            last = key(item)
            yield item


async def encode_manifests(
    found: Iterator[dict[str, Any]], fields: Iterable[str], names: Names = Names.INTERFACE
) -> list[bytes]:
    """`{"manifests": [...]}`, projected to `fields` and in `names`, as JSON in parts of about
    `PART_BYTES` (encoded `WRITE_CHUNK` manifests at a time, a slice at a time)."""
    parts: list[bytes] = []
    pending, size, separator, turn = [b'{"manifests": ['], 0, "", _Slice()
    while chunk := [spoken(view.project(m, fields), names) for m in itertools.islice(found, WRITE_CHUNK)]:
        encoded = (separator + json.dumps(chunk)[1:-1]).encode()
        pending.append(encoded)
        size += len(encoded)
        separator = ", "
        if size >= PART_BYTES:
            parts.append(b"".join(pending))
            pending, size = [], 0
        await turn.end_if_due()
    parts.append(b"".join([*pending, b"]}"]))
    return parts


async def encode_ids(ids: list[str], projected: bool) -> list[bytes]:
    """`encode_manifests`' answer for manifests projected to their `scan_id` (`projected`) or to no
    field: the same bytes, joined from each id as json encodes a string, `ID_PART` ids to a part."""
    parts, turn = [b'{"manifests": ['], _Slice()
    for start in range(0, len(ids), ID_PART):
        run = ids[start : start + ID_PART]
        if projected and _plain("".join(run)):  # each encodes as itself in quotes (Kubernetes names do)
            text = '{"scan_id": "' + '"}, {"scan_id": "'.join(run) + '"}'
        elif projected:
            text = '{"scan_id": ' + '}, {"scan_id": '.join(map(encode_basestring_ascii, run)) + "}"
        else:
            text = ", ".join(["{}"] * len(run))
        parts.append(((", " if start else "") + text).encode())
        await turn.end_if_due()
    parts.append(b"]}")
    return parts


_UNESCAPED = bytes(c for c in range(0x20, 0x7F) if c not in b'"\\')  # what json writes as itself


def _plain(text: str) -> bool:
    """Whether json encodes `text` as itself in quotes (ASCII, none of it escaped)."""
    return text.isascii() and not text.encode().translate(None, _UNESCAPED)


def ids_only(fields: set[str]) -> bool:
    """Whether a projection to `fields` keeps of a manifest at most its scan_id (unknown names nothing)."""
    return fields.intersection(MANIFEST_FIELDS) <= {"scan_id"}


async def send(request: web.Request, parts: list[bytes]) -> web.StreamResponse:
    """Write the parts as the client drains them, a slice at a time (never one large write)."""
    response = web.StreamResponse()
    response.content_type = "application/json"
    response.charset = "utf-8"
    response.content_length = sum(len(p) for p in parts)
    await response.prepare(request)
    turn = _Slice()
    try:
        for part in parts:
            await response.write(part)
            await turn.end_if_due()
        await response.write_eof()
    except ConnectionResetError:  # the client left: nobody to answer
        pass
    return response


async def find_scans(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, models.FindBody)
    fields = view.find_projection(body.manifest_projection)
    refused = sorted(fields & view.FIND_DISALLOWED)
    if refused:
        raise bad_request(
            f"manifest_projection cannot include: {', '.join(refused)}",
            "These deprecated fields are too large to return from /scans/find.",
        )
    query = dict(body.filter)
    if "is_deleted" not in query and not body.include_deleted:
        query["is_deleted"] = False
    shim = request.app[SHIM]
    cache = shim.scans.cache
    exact: narrowing.Exact | None = None
    async with _turn(cache):  # the CPU work; a client reading slowly does not hold a turn
        query = shape_checked(query)
        names = candidates(cache, query)
        examined = len(cache) if names is None else len(names)
        compiled = await compile_in_slices(query, examined)
        if ids_only(fields):
            exact = narrowing.exact(query, find_index.indexed)
        if exact is not None:
            ids = await select_ids(cache.find_index, exact)
        else:
            live = await select(cache, compiled.matches, names)
    archived: list[dict[str, Any]] = []
    if shim.scans.archive is not None:  # after the live snapshot: a scan leaves it only once archived
        archived = await select_archived(shim.scans.archive, shim.namespace, query, compiled, cache, examined)
    async with _turn(cache):
        if exact is not None:
            if archived:
                ids = list(merge(ids, [_SCAN_ID(m) for m in archived], str))
            parts = await encode_ids(ids, "scan_id" in fields)
        else:
            parts = await encode_manifests(merge(live, archived, _SCAN_ID), fields, names_of(request))
    return await send(request, parts)


async def backlog(request: web.Request) -> web.Response:
    entries = [e for e in (view.backlog_entry(s) for s in request.app[SHIM].scans.cache.backlog()) if e]
    entries.sort(key=lambda e: (e["timestamp"], e["scan_id"]))
    return ok({"entries": entries})
