"""A find the index answers alone, projected to scan_id: the same bytes as matching each manifest, from
the index's names (no manifest read), without holding the event loop however many scans match."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from typing import Any

import pytest

from api_shim.find import index as find_index
from api_shim.find import search as find
from api_shim.find.index import FindIndex
from api_shim.find.query import parse
from api_shim.repository.cache import ScanCache
from tests.helpers import find_filter
from tests.unit.test_shim_find_select import cache, scan, ticker

__all__ = ["cache"]  # the fixture


def varied(i: int) -> dict[str, Any]:
    """Scan i: classifiers of every kind the index keys apart (a spec holds scalars only), rescans, soft
    deletions, run ids stored loosely (the manifest converts them)."""
    obj = scan(f"scan-{i:03d}", i + 1, priority=i % 3)
    obj["spec"]["classifiers"] = {
        "i": i % 5,
        "tag": ["x", "y"][i % 2],
        "f": (i % 4) / 2,
        "yes": i % 3 == 0,
        **({"none": None} if i % 6 == 0 else {}),
    }
    if i % 9 == 4:
        obj["spec"]["rescanOf"] = f"scan-{i - 1:03d}"
    obj["spec"]["deleted"] = i % 7 == 0
    run: Any = i % 4 if i % 10 else str(i % 4)
    obj["status"] = {
        "eventMetadata": {
            "runId": run,
            "eventId": float(i),
            "eventType": "t",
            "mjd": 1.0,
            "isRealEvent": True,
        }
    }
    return obj


EXACT: list[dict[str, Any]] = [
    {},
    {"classifiers.i": 1},
    {"classifiers.i": 1.0},
    {"classifiers.i": True},
    {"classifiers.yes": True},
    {"classifiers.yes": 1},
    {"classifiers.tag": "x", "classifiers.i": {"$in": [0, 2]}},
    {"classifiers.f": 0.5},
    {"classifiers.f": {"$eq": 1}},
    {"classifiers.none": "x"},
    {"event_metadata.run_id": 3},
    {"event_metadata.run_id": {"$in": [1, 2.0]}, "event_metadata.event_id": {"$in": [5, 6, 9, 10]}},
    {"$and": [{"classifiers.i": 0}, {"$and": [{"classifiers.tag": "y"}]}]},
    {"classifiers.rescan": True},
    {"classifiers.origin_scan_id": "scan-003"},
    {"classifiers.i": {"$in": []}},
    {"classifiers.missing": 1},
    {"classifiers.i": {"$eq": 1, "$in": [1, 2]}},
    {"is_deleted": True},
    {"is_deleted": {"$in": [True, False]}},
    {"is_deleted": 0},
    {"is_deleted": {"$in": [False, 1]}, "classifiers.tag": "y"},
    {"is_deleted": False, "$and": [{"is_deleted": True}]},
]
POOL: list[tuple[str, list[Any]]] = [
    ("classifiers.i", [0, 1, 4, 1.0, True, "1", 7]),
    ("classifiers.tag", ["x", "y", "z"]),
    ("classifiers.f", [0, 0.5, 1, 1.5, False]),
    ("classifiers.yes", [True, False, 0]),
    ("event_metadata.run_id", [0, 1, 3, 3.0, "3"]),
    ("event_metadata.event_id", [0, 7, 21.0, 59]),
    ("is_deleted", [True, False, 0]),
]
PROJECTIONS = [["scan_id"], [], ["nothing"], ["scan_id", "nothing"]]


def condition(rng: random.Random) -> dict[str, Any]:
    path, values = rng.choice(POOL)
    kind = rng.randrange(3)
    if kind == 0:
        return {path: rng.choice(values)}
    if kind == 1:
        return {path: {"$eq": rng.choice(values)}}
    return {path: {"$in": rng.sample(values, rng.randrange(len(values)))}}


def random_filters(n: int) -> list[dict[str, Any]]:
    rng = random.Random(21)
    found = []
    for _ in range(n):
        query: dict[str, Any] = {}
        for _ in range(rng.randrange(1, 4)):
            part = condition(rng)
            if rng.random() < 0.3:
                query.setdefault("$and", []).append(part)
            else:
                query.update(part)
        found.append(query)
    return found


async def slow(cache: ScanCache, query: dict[str, Any], fields: set[str]) -> bytes:
    """The general path: each candidate's manifest matched, then projected and JSON-encoded."""
    live = await find.select(
        cache, find_filter(query).matches, cache.find_index.among(find_index.lookups(parse(query)))
    )
    return b"".join(await find.encode_manifests(live, fields))


async def fast(cache: ScanCache, query: dict[str, Any], fields: set[str]) -> bytes:
    exact = find_index.exact(parse(query))
    assert exact is not None, query
    ids = await find.select_ids(cache.find_index, exact)
    return b"".join(await find.encode_ids(ids, "scan_id" in fields))


@pytest.mark.parametrize("small_runs", [False, True], ids=["sorted", "read off the order"])
async def test_the_index_answers_what_matching_the_manifests_answers(
    cache: ScanCache, monkeypatch: pytest.MonkeyPatch, small_runs: bool
) -> None:
    if small_runs:  # large selections, read off the index's order, a few names at a time, in parts
        monkeypatch.setattr(find, "SORT_RUN", 3)
        monkeypatch.setattr(find, "ORDER_RUN", 7)
        monkeypatch.setattr(find, "ID_PART", 5)
    for i in random.Random(1).sample(range(60), 60):
        cache.observe(varied(i))  # out of id order
    cache.observe({**varied(14), "spec": {**varied(14)["spec"], "deleted": False}})  # undeleted
    cache.forget(scan("scan-020", 1000))
    answers: set[bytes] = set()
    for query in EXACT + random_filters(150):
        for include_deleted in (False, True):
            full = dict(query) if include_deleted or "is_deleted" in query else {**query, "is_deleted": False}
            for projection in PROJECTIONS:
                fields = find.view.find_projection(projection)
                assert find.ids_only(fields)
                expected = await slow(cache, full, fields)
                assert await fast(cache, full, fields) == expected, (full, projection)
                answers.add(expected)
    assert len(answers) > 60  # the filters select many different sets, empty ones and all included


def test_filters_the_index_does_not_answer_alone() -> None:
    for query in [
        {"priority": 1},
        {"scan_id": "scan-001"},
        {"classifiers.i": {"$gt": 1}},
        {"classifiers.i": None},
        {"classifiers.i": {"$in": [1, None]}},
        {"classifiers.i": [1]},
        {"classifiers.i": {"$ne": 1}},
        {"classifiers.i": {"$eq": 1, "$exists": True}},
        {"classifiers.tag": {"$all": ["x"]}},
        {"classifiers.a.b": 1},
        {"classifiers": {"i": 1}},
        {"is_deleted": None},
        {"is_deleted": {"$ne": True}},
        {"$or": [{"classifiers.i": 1}]},
        {"$nor": [{"classifiers.i": 1}]},
        {"$and": [{"classifiers.i": 1}, {"priority": 0}]},
        {"classifiers.i": 1, "timestamp": {"$gt": 0}},
    ]:
        find_filter(query)
        assert find_index.exact(parse(query)) is None, query
    assert not find.ids_only({"scan_id", "priority"}) and not find.ids_only({"classifiers"})


def test_the_index_keeps_every_scan_in_id_order_and_which_are_deleted() -> None:
    index = FindIndex()
    names = [f"scan-{i:03d}" for i in range(50)]
    for name in random.Random(2).sample(names, len(names)):
        index.put(name, {"metadata": {"name": name}, "spec": {"deleted": name.endswith("7")}})
    index.put("scan-007", {"metadata": {"name": "scan-007"}, "spec": {"deleted": False}})  # a new version
    index.discard("scan-010")
    index.discard("scan-010")
    assert index.in_order() == [n for n in names if n != "scan-010"]
    everything = frozenset((False, True))
    assert index.selected([], everything) == (None, None)
    assert index.selected([], {False}) == (None, {"scan-017", "scan-027", "scan-037", "scan-047"})
    assert index.selected([], {True}) == ({"scan-017", "scan-027", "scan-037", "scan-047"}, None)
    assert index.selected([], ()) == (set(), None)
    for name in names:
        index.discard(name)
    assert index.in_order() == [] and index._deleted == set()


def third(i: int) -> dict[str, Any]:
    name = f"scan-{i:06d}"
    return {"metadata": {"name": name}, "spec": {"classifiers": {"third": i % 3}, "deleted": i % 10 == 0}}


async def test_a_find_of_thousands_by_the_index_yields_to_the_loop() -> None:
    count = 100_000
    index = FindIndex()
    for i in range(count):
        index.put(f"scan-{i:06d}", third(i))
    gaps: list[float] = []
    answers: list[int] = []
    found: list[list[str]] = []
    queries = ({"classifiers.third": 1, "is_deleted": False}, {"is_deleted": False})
    gc.collect()
    gc.disable()  # the process's own collector pauses are not the find's
    try:
        ticking = asyncio.create_task(ticker(gaps))
        await asyncio.sleep(0)
        began = time.thread_time()
        for query in queries:
            exact = find_index.exact(parse(query))
            assert exact is not None
            found.append(await find.select_ids(index, exact))
            answers.append(len(b"".join(await find.encode_ids(found[-1], True))))
        took = time.thread_time() - began  # CPU time, as the ticker's gaps
        ticking.cancel()
    finally:
        gc.enable()
    for query, ids in zip(queries, found, strict=True):  # checked outside the measured steps
        assert ids == [f"scan-{i:06d}" for i in range(count) if i % 10 and (i % 3 == 1 or len(query) == 1)]
    assert answers[1] > answers[0] > 0
    assert len(gaps) > 4  # it did yield, more than once per find
    assert max(gaps) < max(0.02, took / 4)  # no one step holds the loop for long


async def test_ids_json_would_escape_are_encoded_as_json_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "ID_PART", 3)
    ids = ["scan-1", 'q"uote', "back\\slash", "tab\t", "\x7f", "é", "☃", "scan-2", "scan-3", "scan-4"]
    for some in (ids, ids[:1], ids[-3:], []):
        expected = json.dumps({"manifests": [{"scan_id": i} for i in some]}).encode()
        assert b"".join(await find.encode_ids(some, True)) == expected
        assert (
            b"".join(await find.encode_ids(some, False))
            == json.dumps({"manifests": [{}] * len(some)}).encode()
        )
