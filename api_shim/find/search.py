"""Running a find over the live scans and the archive, without holding the event loop for long.

A find's parse is kept by its body's bytes (`Finds.ask`), with its compiled filter when it has no
pattern; a find of a few live scans answers the bytes of their manifests kept per Scan version (`Forms`,
the forms the shim's GETs keep).
It is held to the work budget (`FindLimits.max_work`: scans x cost) before any scan is read, its
patterns compiled a slice at a time. The index narrows the live scans read (`index.lookups`), and
answers alone a find of its equalities projected to at most `scan_id` (`index.exact`). Matching,
archived rows and encoding run in slices of `SLICE_SECONDS`, at most `CONCURRENT_FINDS` finds at
once. Archived matches (the candidates of `sql`, tested by the same filter) are merged in scan id
order after the live ones are read, a scan in both once, as it is live.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Hashable, Iterable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Protocol, TypeVar

import asyncpg

from api_shim import view
from api_shim.errors import ApiError, bad_request
from api_shim.find import index, sql
from api_shim.find.index import FindIndex
from api_shim.find.match import UNCOMPILED, Filter, Predicate, compile_filter, cost, regex_cost
from api_shim.find.query import FilterError, FindLimits, Pattern, Query, parse
from api_shim.find.regex import Regex, RegexError, compile_regex
from api_shim.wire_names import Names, spoken
from skyscan.io.archive import Archive
from skyscan.manifest import MANIFEST_FIELDS

LIMITS = FindLimits()
SLICE_SECONDS = 0.0005  # matching or writing between two yields to the event loop
CONCURRENT_FINDS = 2  # per shim; each adds at most one slice to each turn of the loop
WRITE_CHUNK = 32  # manifests encoded at once (32 full manifests are ~0.3 ms of JSON)
PART_BYTES = 64 << 10  # the answer is written in parts of about this size
SORT_RUN = 1024  # at most this many names sorted at once, more read off the index's order
ARCHIVE_BATCH = 64  # archived manifests fetched (and decoded) at once: about a slice of work
ORDER_RUN = 4096  # names of the index's order filtered at once (~0.1 ms)
ID_PART = 2048  # scan ids joined into one part of the answer (~60 KiB, ~0.1 ms)
KEPT_ASKS = 256  # finds kept parsed by their body's bytes (patterns aside: each may hold MiBs)
KEPT_BODY_BYTES = 4096  # a body kept is at most this large
NARROW = "Narrow the filter: name a run or event id, a classifier value, or a time range."
FEW = 8  # a find answering at most this many live scans answers their kept bytes
T = TypeVar("T")
Found = tuple[int, dict[str, Any]]  # a manifest and the version of its Scan (0: archived)
Form = tuple[Hashable, ...]  # a REST form of a Scan kept encoded: what it is, what it depends on


class Live(Protocol):
    """The live scans as a find reads them (the shim's cache)."""

    find_index: FindIndex

    def find_documents(self, names: Collection[str] | None = None) -> Iterator[Found]: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: object) -> bool: ...


@dataclass(frozen=True)
class Asked:
    """A find as asked; `compiled` when its filter has no pattern (compiling again gives the same)."""

    query: Query
    fields: frozenset[str]
    compiled: Filter | None
    lookups: list[index.Lookup]
    exact: index.Exact | None


class _Slice:
    """Yields to the event loop once `SLICE_SECONDS` have passed since the last yield."""

    def __init__(self) -> None:
        self._until = time.perf_counter() + SLICE_SECONDS

    async def end_if_due(self) -> None:
        if time.perf_counter() >= self._until:
            await asyncio.sleep(0)
            self._until = time.perf_counter() + SLICE_SECONDS


def too_costly(cost: int, examined: int, *, at_least: bool = False, archived: bool = False) -> ApiError:
    scans = f"{examined} scans (live and archived)" if archived else f"{examined} scans"
    return bad_request(
        f"filter too costly: {'at least ' if at_least else ''}{cost} per scan * {scans} exceeds the work "
        f"budget of {LIMITS.max_work}",
        NARROW
        if archived
        else "Simplify the filter (fewer conditions, $in over values, fewer or simpler $regex patterns).",
    )


def compile_regex_for(pattern: Pattern, limits: FindLimits) -> Regex:
    return compile_regex(
        pattern.pattern,
        pattern.options,
        max_length=limits.max_regex_length,
        max_program=limits.max_regex_program,
    )


async def compile_in_slices(asked: Asked, examined: int) -> Filter:
    """The compiled filter, within the work budget over `examined` scans (else 400). A filter may name
    hundreds of patterns, tens of ms to compile: costed with each uncompiled (its least), they are
    compiled a slice at a time, the find refused as soon as they take it beyond the budget."""
    found = asked.compiled
    if found is None:
        patterns = asked.query.patterns()
        compiled, turn = dict[Pattern, Regex](), _Slice()
        at_least = cost(asked.query, compiled)
        if at_least * examined > LIMITS.max_work:
            raise too_costly(at_least, examined, at_least=bool(patterns))
        for pattern in patterns:
            try:
                compiled[pattern] = regex = compile_regex_for(pattern, LIMITS)
            except RegexError as e:
                raise bad_request(f"invalid filter: invalid $regex: {e}") from None
            at_least += regex_cost(regex) - regex_cost(UNCOMPILED)
            if at_least * examined > LIMITS.max_work:
                raise too_costly(at_least, examined, at_least=True)
            await turn.end_if_due()
        found = compile_filter(asked.query, compiled)
    if found.cost * examined > LIMITS.max_work:
        raise too_costly(found.cost, examined)
    return found


async def in_order(found_in: FindIndex, keep: set[str] | None, drop: set[str] | None = None) -> list[str]:
    """The index's scans in `keep` (None: all) and not in `drop`, in id order: a few sorted at once,
    more read off the index's order `ORDER_RUN` at a time, a slice at a time."""
    if keep is not None and len(keep) <= SORT_RUN:
        return sorted(keep)  # `drop` is only given without `keep`
    order, found, turn = found_in.in_order(), list[str](), _Slice()
    for start in range(0, len(order), ORDER_RUN):
        run: Iterable[str] = order[start : start + ORDER_RUN]
        if keep is not None:
            run = filter(keep.__contains__, run)
        if drop is not None:
            run = itertools.filterfalse(drop.__contains__, run)
        found += run
        await turn.end_if_due()
    return found


async def select_ids(found_in: FindIndex, exact: index.Exact) -> list[str]:
    return await in_order(found_in, *found_in.selected(exact.lookups, exact.deleted))


async def select(live: Live, matches: Predicate, names: set[str] | None = None) -> Iterator[Found]:
    """The manifests of the live Scans (of `names`, or all) that `matches` accepts, in scan id order."""
    found: list[Found] = []
    clock = time.perf_counter
    until = clock() + SLICE_SECONDS
    for version, document in live.find_documents(await in_order(live.find_index, names)):
        if matches(document):
            found.append((version, document))
        if clock() >= until:  # the hot loop: `_Slice.end_if_due` inlined
            await asyncio.sleep(0)
            until = clock() + SLICE_SECONDS
    return iter(found)


async def select_archived(
    archive: Archive, namespace: str, query: Query, compiled: Filter, live: Live, examined: int
) -> list[dict[str, Any]]:
    """The archived manifests `compiled` accepts among the candidates the archive selects for `query`,
    in scan id order, but for scans live now (the live copy wins). Refused (400) when the candidates
    are more than `LIMITS.max_archived`, or with the `examined` live ones beyond the work budget, or
    when the archive's statement timeout ends a query."""
    where, params = sql.translate(query, first_param=2)
    count, candidates_sql = sql.queries(where.text, len(params) + 2)
    found: list[dict[str, Any]] = []
    try:
        async with archive.connection() as conn:
            archived = await conn.fetchval(count, namespace, *params, LIMITS.max_archived + 1)
            if archived > LIMITS.max_archived:
                raise bad_request(
                    f"filter too broad: it selects more than {LIMITS.max_archived} archived scans", NARROW
                )
            if compiled.cost * (examined + archived) > LIMITS.max_work:
                raise too_costly(compiled.cost, examined + archived, archived=True)
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
    """The rows of `query`: `few` at once, more `ARCHIVE_BATCH` at a time through a cursor (which costs
    a transaction and more round trips)."""
    if few:
        yield await conn.fetch(query, *args)
        return
    async with conn.transaction(readonly=True):
        cursor = await conn.cursor(query, *args)
        while rows := await cursor.fetch(ARCHIVE_BATCH):
            yield rows


def merge(live: Iterable[T], archived: Iterable[T], key: Callable[[T], str]) -> Iterator[T]:
    """Both in scan id order (`key`); a scan in both (archived while the find ran) once, as it is live."""
    last = None
    for item in heapq.merge(live, archived, key=key):  # equal ids: the live one first
        if key(item) != last:
            last = key(item)
            yield item


async def encode_manifests(
    found: Iterator[Found], fields: Iterable[str], names: Names = Names.INTERFACE
) -> list[bytes]:
    """`{"manifests": [...]}`, projected to `fields` and in `names`, as JSON in parts of about
    `PART_BYTES` (`WRITE_CHUNK` manifests encoded at a time, a slice at a time)."""
    parts: list[bytes] = []
    pending, size, separator, turn = [b'{"manifests": ['], 0, "", _Slice()
    while chunk := [spoken(view.project(m, fields), names) for _, m in itertools.islice(found, WRITE_CHUNK)]:
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
    """`encode_manifests`' bytes for manifests projected to their `scan_id` (`projected`) or to no
    field, joined from each id as json encodes a string, `ID_PART` ids to a part."""
    parts, turn = [b'{"manifests": ['], _Slice()
    for start in range(0, len(ids), ID_PART):
        run = ids[start : start + ID_PART]
        if projected:
            text = '{"scan_id": ' + '}, {"scan_id": '.join(map(encode_basestring_ascii, run)) + "}"
        else:
            text = ", ".join(["{}"] * len(run))
        parts.append(((", " if start else "") + text).encode())
        await turn.end_if_due()
    parts.append(b"]}")
    return parts


def ids_only(fields: Collection[str]) -> bool:
    """Whether a projection to `fields` keeps of a manifest at most its scan_id (unknown names nothing)."""
    return set(fields).intersection(MANIFEST_FIELDS) <= {"scan_id"}


class Forms(Protocol):
    """The REST forms of live Scans kept encoded per version (the shim's, shared with its GETs)."""

    def get(self, name: str, form: Form, version: int | None = None) -> tuple[bytes, bool] | None: ...
    def keep(self, name: str, version: int, deleted: bool, form: Form, body: bytes) -> None: ...


class Finds:
    """One shim's finds over its live scans and archive: their turns at the CPU, those asked before by
    their body's bytes, and the forms of live scans they answer, kept encoded per Scan version."""

    def __init__(self, live: Live, archive: Archive | None, namespace: str, forms: Forms) -> None:
        self.live, self.archive, self.namespace, self.forms = live, archive, namespace, forms
        self.turn = asyncio.Semaphore(CONCURRENT_FINDS)
        self.asked: OrderedDict[bytes, Asked] = OrderedDict()

    def asked_before(self, body: bytes) -> Asked | None:
        found = self.asked.get(body)
        if found is not None:
            self.asked.move_to_end(body)
        return found

    def ask(self, body: bytes, doc: dict[str, Any], fields: Iterable[str]) -> Asked:
        """The find of filter `doc` projected to `fields` (400 for an invalid filter), kept for the next
        find of the same `body` when that is small and has no pattern."""
        try:
            query = parse(doc, LIMITS)
        except FilterError as e:
            raise bad_request(f"invalid filter: {e}") from None
        has_patterns, fields = bool(query.patterns()), frozenset(fields)
        compiled = None if has_patterns else compile_filter(query, {})
        exact = index.exact(query) if ids_only(fields) else None
        asked = Asked(query, fields, compiled, index.lookups(query), exact)
        if not has_patterns and len(body) <= KEPT_BODY_BYTES:
            self.asked[body] = asked
            if len(self.asked) > KEPT_ASKS:
                self.asked.popitem(last=False)
        return asked

    def encoded(self, found: Found, fields: frozenset[str], names: Names) -> bytes:
        """A manifest as answered; a live scan's encoded once per version of its Scan."""
        version, document = found
        name, form = document["scan_id"], ("find", fields, names)
        kept = self.forms.get(name, form, version)  # none for an archived one (version 0)
        if kept is not None:
            return kept[0]
        body = json.dumps(spoken(view.project(document, fields), names)).encode()
        if version:
            self.forms.keep(name, version, document["is_deleted"], form, body)
        return body

    async def answer(self, asked: Asked, names: Names) -> list[bytes]:
        """The answer to `asked`, in `names`, as the parts of its JSON body."""
        live, exact = self.live, asked.exact
        async with self.turn:  # the CPU work; a client reading slowly does not hold a turn
            within = live.find_index.among(asked.lookups)
            examined = len(live) if within is None else len(within)
            compiled = await compile_in_slices(asked, examined)
            if exact is not None:
                ids = await select_ids(live.find_index, exact)
            else:
                found = await select(live, compiled.matches, within)
        archived: list[dict[str, Any]] = []
        if self.archive is not None:  # after the live snapshot: a scan leaves it only once archived
            archived = await select_archived(
                self.archive, self.namespace, asked.query, compiled, live, examined
            )
        if exact is not None:
            if archived:
                ids = list(merge(ids, [m["scan_id"] for m in archived], str))
            async with self.turn:
                return await encode_ids(ids, "scan_id" in asked.fields)
        if archived:
            found = merge(found, [(0, m) for m in archived], lambda f: str(f[1]["scan_id"]))
        if within is not None and len(within) <= FEW:  # the kept bytes of each, without a turn: a few
            kept = b", ".join(self.encoded(f, asked.fields, names) for f in found)
            return [b'{"manifests": [' + kept + b"]}"]
        async with self.turn:
            return await encode_manifests(found, asked.fields, names)
