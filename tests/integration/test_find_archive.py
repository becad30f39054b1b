"""`/scans/find` over the archive: the same filter cases answered by the in-memory matcher over a list
of manifests and by the archive's SQL + the matcher over the same manifests stored in a real PostgreSQL;
the SQL narrows on the indexes; the archive's limits."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_shim.errors import ApiError
from api_shim.find import search as find
from api_shim.find.query import FindLimits, parse
from api_shim.find.sql import queries, translate
from api_shim.repository.cache import ScanCache
from skyscan.io import kube
from skyscan.io.archive import Archive, ArchivedScan
from tests.helpers import find_filter
from tests.unit.test_shim_filters import DOC, MATCH_CASES

NAMESPACE = "skyscan"
BASE = {"timestamp": 1700000000.25, "last_updated": 1700000100.5, "sensor_event_id": "ev-1"}
DOCS: list[dict[str, Any]] = [
    {**BASE, **copy.deepcopy(DOC)},
    {
        **BASE,
        "scan_id": "abd",
        "priority": 1,
        "is_deleted": True,
        "classifiers": {"origin": "ALERT", "tags": ["b"], "n": 3.0, "rescan": True, "origin_scan_id": "abc"},
        "event_metadata": {"run_id": 124, "event_id": 987, "is_real_event": False},
        "progress": {"summary": "half"},
        "items": [{"k": 3, "v": ["x", "z"]}],
        "timestamp": 1700000001.0,
    },
    {
        **BASE,
        "scan_id": "b-1",
        "priority": 5.5,
        "is_deleted": False,
        "classifiers": {"n": True, "origin": None},
        "event_metadata": None,
        "progress": None,
        "timestamp": 1700000002,
        "last_updated": 1800000000.0,
    },
    {
        **BASE,
        "scan_id": "B",
        "priority": "5",
        "is_deleted": False,
        "classifiers": {},
        "event_metadata": {"run_id": 2**62, "event_id": -5, "is_real_event": True},
        "items": [[{"k": 2}]],
    },
    {
        **BASE,
        "scan_id": "abc.1",
        "is_deleted": False,
        "classifiers": {"tags": [["a"]], "n": 2**53 + 1},
        "event_metadata": {"run_id": 123, "event_id": 988, "is_real_event": True},
    },
]
ARCHIVE_CASES: list[dict[str, Any]] = [
    {"event_metadata.run_id": 123},
    {"event_metadata.run_id": 123.0},
    {"event_metadata.run_id": True},
    {"event_metadata.run_id": {"$in": [124, 2**62, "123"]}},
    {"event_metadata.run_id": {"$gt": 123.5}},
    {"event_metadata.run_id": {"$gte": 123.5}},
    {"event_metadata.run_id": {"$lt": 123.5}},
    {"event_metadata.run_id": {"$lte": 123}},
    {"event_metadata.run_id": {"$gt": 2**64}},
    {"event_metadata.run_id": {"$lt": 2**64}},
    {"event_metadata.run_id": {"$gt": -(2**64)}},
    {"event_metadata.run_id": {"$gt": "1"}},
    {"event_metadata.run_id": 10**400},
    {"timestamp": {"$lt": 10**400}},
    {"timestamp": {"$gt": float("-inf")}},
    {"classifiers.n": 10**20},
    {"event_metadata.run_id": None},
    {"event_metadata.run_id": {"$exists": False}},
    {"event_metadata.run_id": {"$exists": True}},
    {"event_metadata.run_id": {"$ne": 123}},
    {"event_metadata.run_id": {"$nin": [123, 124]}},
    {"event_metadata.run_id": {"$not": {"$gt": 123}}},
    {"event_metadata.run_id": {"$not": {"$regex": "1"}}},
    {"event_metadata.run_id": {"$in": []}},
    {"event_metadata.event_id": {"$lt": 0}},
    {"event_metadata.event_id": {"$in": [987, 988]}, "event_metadata.run_id": 123},
    {"timestamp": {"$gte": 1700000001}},
    {"timestamp": 1700000002},
    {"timestamp": {"$lt": "z"}},
    {"last_updated": {"$gt": 1.7e9}},
    {"is_deleted": True},
    {"is_deleted": {"$ne": True}},
    {"is_deleted": 0},
    {"scan_id": {"$gt": "B"}},
    {"scan_id": {"$lt": "b"}},
    {"scan_id": {"$in": ["abc", "B"]}},
    {"scan_id": {"$nin": ["abc"]}},
    {"classifiers.origin": "alert"},
    {"classifiers.origin": None},
    {"classifiers.origin": {"$exists": False}},
    {"classifiers.n": 3},
    {"classifiers.n": True},
    {"classifiers.n": 1},
    {"classifiers.n": 2**53 + 1},
    {"classifiers.n": {"$gt": 2}},
    {"classifiers.n": {"$in": [3, True]}},
    {"classifiers.n": {"$nin": [3]}},
    {"classifiers.origin": {"$nin": [None]}},  # a missing field is null for $nin too
    {"classifiers.origin": {"$nin": [None, "alert"]}},
    {"progress.summary": {"$nin": [None]}},
    {"classifiers.tags": "a"},
    {"classifiers.tags": {"$ne": "b"}},
    {"classifiers.tags": {"$all": ["a", "b"]}},
    {"classifiers.tags": {"$all": []}},
    {"classifiers.rescan": True},
    {"classifiers.origin_scan_id": "abc"},
    {"classifiers": {}},
    {"classifiers": {"origin": None, "n": True}},
    {"classifiers": 5},
    {"progress.summary": "half"},
    {"progress.summary": {"$exists": True}},
    {"items.k": {"$gte": 2}},
    {"items.v": "z"},
    {"items.0.k": 3},
    {"event_metadata.is_real_event": False},
    {"priority": {"$gt": 5}},
    {"priority": "5"},
    {"$or": [{"event_metadata.run_id": 124}, {"classifiers.n": True}]},
    {"$nor": [{"event_metadata.run_id": 123}, {"is_deleted": True}]},
    {"$nor": [{"progress.summary": "half"}]},
    {"$and": [{"classifiers.origin": {"$exists": True}}, {"$or": [{"priority": 1}, {"scan_id": "b-1"}]}]},
]
CASES = list({json.dumps(q): q for q in [q for q, _ in MATCH_CASES] + ARCHIVE_CASES}.values())


@pytest.fixture
async def live() -> AsyncIterator[ScanCache]:
    async with kube.Kube(
        kube.Endpoint("http://unused.invalid")
    ) as api:  # never called: an empty cache, no live scans
        yield ScanCache(api, NAMESPACE)


@pytest.fixture
async def stored(archive: Archive) -> Archive:
    for document in DOCS:
        scan = {"metadata": {"name": document["scan_id"], "namespace": NAMESPACE, "resourceVersion": "1"}}
        await archive.put(ArchivedScan(scan, document, b"event", None, 1.0))
    return archive


async def archived_ids(archive: Archive, live: ScanCache, query: dict[str, Any]) -> list[str]:
    found = await find.select_archived(archive, NAMESPACE, parse(query), find_filter(query), live, 0)
    return [m["scan_id"] for m in found]


@pytest.mark.parametrize("batch", [64, 2], ids=["one fetch", "a cursor"])
async def test_the_archive_answers_every_filter_as_the_matcher(
    stored: Archive, live: ScanCache, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(find, "ARCHIVE_BATCH", batch)
    mismatches = []
    for query in CASES:
        matches = find_filter(query).matches
        expected = sorted(d["scan_id"] for d in DOCS if matches(d))
        got = await archived_ids(stored, live, query)
        if got != expected:
            mismatches.append((query, expected, got))
    assert mismatches == []
    # The cases tell the documents apart (most select some but not all), and the SQL narrows most.
    counts = [sum(find_filter(q).matches(d) for d in DOCS) for q in CASES]
    assert sum(0 < c < len(DOCS) for c in counts) > 0.7 * len(CASES)
    assert sum(translate(parse(q))[0].text != "TRUE" for q in CASES) > 0.6 * len(CASES)


async def test_another_namespace_and_live_scans_are_left_out(stored: Archive, live: ScanCache) -> None:
    assert await archived_ids(stored, live, {"scan_id": "abc"}) == ["abc"]
    live.observe({"metadata": {"name": "abc", "resourceVersion": "5"}, "spec": {}})
    assert await archived_ids(stored, live, {"scan_id": "abc"}) == []  # the live copy wins
    found = await find.select_archived(stored, "elsewhere", parse({}), find_filter({}), live, 0)
    assert found == []


@pytest.mark.parametrize(
    ("query", "index"),
    [
        ({"event_metadata.run_id": 7, "is_deleted": False}, "scans_run_event"),
        ({"event_metadata.run_id": {"$in": [7, 8]}}, "scans_run_event"),
        ({"event_metadata.event_id": 7}, "scans_event"),
        ({"classifiers.i": 7, "is_deleted": False}, "scans_classifiers"),
        ({"classifiers.i": {"$in": [7, 8]}}, "scans_classifiers"),
        ({"timestamp": {"$gte": 1_000_000_000, "$lt": 1_000_000_010}}, "scans_created"),
    ],
)
async def test_selective_filters_use_the_indexes(archive: Archive, query: dict[str, Any], index: str) -> None:
    await archive.pool.execute(
        """
        INSERT INTO sensor_events VALUES ('ev', 'x');
        INSERT INTO scans
        SELECT 'scan-' || i, 'skyscan', 'ev', NULL, 1e9 + i, 1e9 + i, i % 7 = 0, i / 3, i,
               jsonb_build_object('i', i),
               jsonb_build_object('scan_id', 'scan-' || i, 'padding', repeat('x', 1000)),  -- manifest-sized
               '{}', NULL, 1
        FROM generate_series(1, 5000) AS i;
        ANALYZE scans;
        """
    )
    where, params = translate(parse(query), first_param=2)
    assert where.exact
    _, select = queries(where.text, len(params) + 2)
    plan = await archive.pool.fetch(f"EXPLAIN {select}", NAMESPACE, *params)
    text = "\n".join(row[0] for row in plan)
    assert index in text, text


async def test_too_broad_a_filter_is_refused(
    stored: Archive, live: ScanCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(find, "LIMITS", FindLimits(max_archived=4))
    assert len(await archived_ids(stored, live, {"is_deleted": False})) == 4
    with pytest.raises(ApiError, match="selects more than 4 archived scans") as refused:
        await archived_ids(stored, live, {})
    assert refused.value.status == 400
    monkeypatch.setattr(find, "LIMITS", FindLimits(max_work=7))  # cost 2 x 4 candidates
    with pytest.raises(ApiError, match="exceeds the work budget of 7"):
        await archived_ids(stored, live, {"is_deleted": False})


async def test_a_statement_timeout_is_a_400(archive_dsn: str, live: ScanCache) -> None:
    archive = await Archive.connect(archive_dsn, statement_timeout=0.3)
    holder = await asyncpg.connect(archive_dsn)
    try:
        async with holder.transaction():  # the find's query waits for the table past its timeout
            await holder.execute("LOCK TABLE scans IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(ApiError, match="statement timeout ended the query") as refused:
                await archived_ids(archive, live, {"event_metadata.run_id": 1})
        assert refused.value.status == 400
        assert await archived_ids(archive, live, {"event_metadata.run_id": 1}) == []
    finally:
        await holder.close()
        await archive.close()


# Random scans and filters: the values collide often (1 and 1.0 and True, "a" and "A", arrays holding
# them), the paths are the archive's columns, its classifiers and the manifest's other fields, and the
# documents keep the archive's invariants (ids integers, timestamps numbers below 2**53).
SCALARS = st.sampled_from([None, True, False, 0, 1, 2, -1, 1.0, 1.5, 2**53 + 1, 2**62, "a", "b", "A", ""])
VALUES = SCALARS | st.lists(SCALARS, max_size=3)
IDS = st.sampled_from([1, 2, 3, 2**62]) | st.integers(-(2**63), 2**63 - 1)
MANIFESTS = st.fixed_dictionaries(
    {
        "scan_id": st.sampled_from(["s0", "s1", "s2", "S1", "s10", "t"]),
        "sensor_event_id": st.just("ev-1"),
        "timestamp": st.sampled_from([0, 1, 1.0, 1.5, 2, 1.7e9]),
        "last_updated": st.sampled_from([1, 2.5, 1.8e9]),
        "is_deleted": st.booleans(),
        "priority": VALUES,
        "classifiers": st.dictionaries(st.sampled_from(["a", "n"]), VALUES, max_size=2),
        "event_metadata": st.none() | st.fixed_dictionaries({}, optional={"run_id": IDS, "event_id": IDS}),
    },
    optional={
        "progress": st.none() | st.fixed_dictionaries({"summary": SCALARS}),
        "items": st.lists(st.fixed_dictionaries({"k": VALUES}), max_size=2),
    },
)
PATHS = st.sampled_from(
    [
        "event_metadata.run_id", "event_metadata.event_id", "timestamp", "last_updated", "is_deleted",
        "scan_id", "classifiers.a", "classifiers.n", "classifiers", "priority", "progress.summary", "items.k",
    ]
)  # fmt: skip
ORDERED = st.sampled_from(["$gt", "$gte", "$lt", "$lte"])
CONDITIONS = st.one_of(
    VALUES,
    st.dictionaries(
        st.just("classifiers"), st.dictionaries(st.sampled_from(["a", "n"]), SCALARS, max_size=2)
    ),
    st.builds(lambda op, v: {op: v}, st.sampled_from(["$eq", "$ne"]), VALUES),
    st.dictionaries(ORDERED, SCALARS, min_size=1, max_size=2),
    st.builds(
        lambda op, vs: {op: vs}, st.sampled_from(["$in", "$nin", "$all"]), st.lists(VALUES, max_size=3)
    ),
    st.builds(lambda b: {"$exists": b}, st.booleans()),
    st.builds(lambda op, v: {"$not": {op: v}}, ORDERED, SCALARS),
)
FILTERS = st.recursive(
    st.dictionaries(PATHS, CONDITIONS, min_size=1, max_size=2),
    lambda inner: st.builds(
        lambda op, parts: {op: parts},
        st.sampled_from(["$and", "$or", "$nor"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(MANIFESTS, max_size=6, unique_by=itemgetter("scan_id")), query=FILTERS)
async def test_the_archive_and_the_matcher_agree_on_random_filters_over_random_scans(
    archive: Archive, live: ScanCache, docs: list[dict[str, Any]], query: dict[str, Any]
) -> None:
    await archive.pool.execute("DELETE FROM scans")
    for document in docs:
        scan = {"metadata": {"name": document["scan_id"], "namespace": NAMESPACE, "resourceVersion": "1"}}
        await archive.put(ArchivedScan(scan, document, b"event", None, 1.0))
    expected = sorted(d["scan_id"] for d in docs if find_filter(query).matches(d))
    assert await archived_ids(archive, live, query) == expected
    where, params = translate(parse(query), first_param=2)
    if where.exact:  # the SQL alone answers as the matcher does
        rows = await archive.pool.fetch(
            f'SELECT scan_id FROM scans WHERE namespace = $1 AND ({where.text}) ORDER BY scan_id COLLATE "C"',
            NAMESPACE,
            *params,
        )
        assert [r[0] for r in rows] == expected
