"""The find's matching pass: over per-version manifests kept by the cache, in id order, yielding to
the event loop every few milliseconds however many Scans there are."""

from __future__ import annotations

import asyncio
import copy
import gc
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api_shim.find import search as find
from api_shim.find.index import lookups
from api_shim.find.query import parse
from api_shim.repository.cache import ScanCache
from skyscan import manifest
from skyscan.io import kube
from tests.helpers import find_filter
from tests.unit.test_shim_view import SCAN


def scan(name: str, version: int, priority: int = 0) -> dict[str, Any]:
    obj = copy.deepcopy(SCAN)
    obj["metadata"].update(name=name, resourceVersion=str(version))
    obj["spec"]["priority"] = priority
    return obj


@pytest.fixture
async def cache() -> AsyncIterator[ScanCache]:
    async with kube.Kube(
        kube.Endpoint("http://unused.invalid")
    ) as api:  # never called: the cache is filled by hand
        yield ScanCache(api, "skyscan")


async def test_documents_are_built_once_per_version(
    cache: ScanCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []

    def build(obj: dict[str, Any]) -> dict[str, Any]:
        built.append(obj["metadata"]["name"])
        return manifest_of(obj)

    manifest_of = manifest.of
    monkeypatch.setattr(manifest, "of", build)
    first = scan("a", 1)
    cache.observe(first)
    ((_, document),) = cache.find_documents()
    assert document == manifest_of(first)
    assert next(cache.find_documents()) == (1, document) and built == ["a"]  # kept
    cache.observe(scan("b", 2))
    snapshot = cache.find_documents()
    assert next(snapshot) == (1, document)
    cache.observe(scan("b", 3, priority=7))
    assert next(snapshot)[1]["priority"] == 0  # a snapshot reads Scans as they were when it began
    _, (_, document) = cache.find_documents()
    assert document["priority"] == 7 and built == ["a", "b", "b"]  # rebuilt for the new version
    assert list(cache.find_documents())[1][1] == document and built == ["a", "b", "b"]
    cache.forget(scan("a", 4))
    cache.forget(scan("b", 4))
    assert list(cache.find_documents()) == []
    assert not cache._documents


async def test_select_answers_in_id_order(cache: ScanCache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "SORT_RUN", 7)  # many sorted runs, merged
    names = [f"scan-{i:04d}" for i in range(100)]
    for version, name in enumerate(random.sample(names, len(names)), start=1):
        cache.observe(scan(name, version, priority=int(name[-2:]) % 3))
    found = [d for _, d in await find.select(cache, find_filter({"priority": 1}).matches)]
    assert [m["scan_id"] for m in found] == [n for n in names if int(n[-2:]) % 3 == 1]


async def ticker(gaps: list[float]) -> None:
    """Notes the loop thread's CPU time between two turns of the event loop in `gaps`, until
    cancelled: how long one step held the loop, whatever else the machine runs (wall time would count
    the time the process waited for a core on a loaded machine)."""
    last = time.thread_time()
    while True:
        await asyncio.sleep(0)
        now = time.thread_time()
        gaps.append(now - last)
        last = now


async def test_select_yields_to_the_loop(cache: ScanCache) -> None:
    count = 20_000
    for version, i in enumerate(random.sample(range(count), count), start=1):
        cache.observe(scan(f"scan-{i:05d}", version, priority=i % 3))
    matches = find_filter({"priority": {"$in": [1, 2]}, "scan_id": {"$regex": "^scan-\\d+$"}}).matches
    await find.select(cache, matches)  # builds the documents
    gaps: list[float] = []
    gc.collect()
    gc.disable()  # the process's own collector pauses are not the find's
    try:
        ticking = asyncio.create_task(ticker(gaps))
        await asyncio.sleep(0)
        found = [d for _, d in await find.select(cache, matches)]
        ticking.cancel()
    finally:
        gc.enable()
    assert len(found) == sum(1 for i in range(count) if i % 3)
    assert len(gaps) > 10  # it did yield, many times
    assert max(gaps) < 0.05  # generous for a shared machine: a slice is 2 ms


async def test_a_narrowed_select_finds_what_the_full_one_finds(cache: ScanCache) -> None:
    for i in range(60):
        obj = scan(f"scan-{i:03d}", i + 1, priority=i % 3)
        obj["spec"]["classifiers"] = {"i": i % 5, "tag": ["x", "y"][i % 2]}
        obj["status"] = {
            "eventMetadata": {"runId": i % 4, "eventId": i, "eventType": "t", "mjd": 1.0, "isRealEvent": True}
        }
        cache.observe(obj)
    cache.forget(scan("scan-000", 100))
    queries: list[dict[str, Any]] = [
        {"event_metadata.run_id": 1},
        {"event_metadata.run_id": {"$in": [1, 2.0]}, "classifiers.tag": "x"},
        {"$and": [{"classifiers.i": 0}, {"event_metadata.event_id": {"$in": [0, 5, 10, 15]}}]},
        {"classifiers.i": 3, "priority": 0},
        {"classifiers.i": 99},
    ]
    for query in queries:
        names = cache.find_index.among(lookups(parse(query)))
        assert names is not None and len(names) < len(cache)
        matches = find_filter(query).matches
        narrowed = [m["scan_id"] for _, m in await find.select(cache, matches, names)]
        assert narrowed == [m["scan_id"] for _, m in await find.select(cache, matches)], query
    assert cache.find_index.among(lookups(parse({"priority": 1}))) is None
    assert len(list(await find.select(cache, find_filter({"event_metadata.run_id": 0}).matches))) == 14
