"""Searching scans: the MongoDB-style find over manifests, and the backlog.

A find never holds the event loop for long, so other routes answer at their usual latency while
finds run: the filter is checked against `FindLimits` (size, depth, patterns on a linear-time
engine, documents x cost) before any document is read; matching runs over the cache's per-version
manifests in slices of `SLICE_SECONDS`, yielding to the loop between slices; the answer is encoded
in chunks, yielding likewise, and written as the client drains it; and at most `CONCURRENT_FINDS`
finds match or encode at a time per shim (others wait their turn), so any other request waits at
most that many slices per turn of the event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any
from weakref import WeakKeyDictionary

from aiohttp import web

from api_shim import models, view
from api_shim.cache import ScanCache
from api_shim.errors import bad_request
from api_shim.filters import FilterError, FindLimits, Predicate, parse_filter
from api_shim.plumbing import SHIM, ok, parse_body

LIMITS = FindLimits()
SLICE_SECONDS = 0.0005  # matching or writing between two yields to the event loop
CONCURRENT_FINDS = 2  # per shim; each adds at most one slice to each turn of the loop
WRITE_CHUNK = 32  # manifests encoded at once (32 full manifests are ~0.3 ms of JSON)
PART_BYTES = 64 << 10  # the answer is written in parts of about this size
SORT_RUN = 1024  # manifests sorted at once (sorting 50,000 out-of-order ids in one go takes ~50 ms)
_SCAN_ID = itemgetter("scan_id")
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


async def select(cache: ScanCache, matches: Predicate) -> Iterator[dict[str, Any]]:
    """The manifests of the cached Scans that `matches` accepts, in scan id order."""
    found: list[dict[str, Any]] = []
    clock = time.perf_counter
    until = clock() + SLICE_SECONDS
    for document in cache.find_documents():
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


async def encode_manifests(found: Iterator[dict[str, Any]], fields: Iterable[str]) -> list[bytes]:
    """`{"manifests": [...]}`, projected to `fields`, as JSON in parts of about `PART_BYTES` (encoded
    `WRITE_CHUNK` manifests at a time, a slice at a time)."""
    parts: list[bytes] = []
    pending, size, separator, turn = [b'{"manifests": ['], 0, "", _Slice()
    while chunk := [view.project(m, fields) for m in itertools.islice(found, WRITE_CHUNK)]:
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
    try:
        compiled = parse_filter(query, LIMITS)
    except FilterError as e:
        raise bad_request(f"invalid filter: {e}") from None
    cache = request.app[SHIM].cache
    examined = len(cache)
    if compiled.cost * examined > LIMITS.max_work:
        raise bad_request(
            f"filter too costly: {compiled.cost} per scan * {examined} scans exceeds the work budget of "
            f"{LIMITS.max_work}",
            "Simplify the filter (fewer conditions, $in over values, fewer or simpler $regex patterns).",
        )
    async with _turn(cache):  # the CPU work; a client reading slowly does not hold a turn
        parts = await encode_manifests(await select(cache, compiled.matches), fields)
    return await send(request, parts)


async def backlog(request: web.Request) -> web.Response:
    entries = [e for e in (view.backlog_entry(s) for s in request.app[SHIM].cache.backlog()) if e]
    entries.sort(key=lambda e: (e["timestamp"], e["scan_id"]))
    return ok({"entries": entries})
