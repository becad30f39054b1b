"""The shim cache's LIST against the real API server: from the watch cache in one answer, or (asking
for the latest version) in pages from etcd; every page merged in, only compact Scans held, Scans gone
from the listing dropped, and a continue token that expired mid-listing (etcd compacted under it: the
API server answers 410) answered by listing again."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from api_shim.repository import cache as cache_module
from api_shim.repository.cache import ScanCache
from skyscan import model
from skyscan.io import kube
from skyscan.io.kube import Kube, scan_path
from skyscan.scan_record import compact
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.unit.test_crd import minimal_spec

COUNT = 5


@pytest.fixture
async def stored(api: Kube, namespace: str) -> list[dict[str, Any]]:

    async def one(i: int) -> dict[str, Any]:
        body = {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "metadata": {"name": f"scan-{i}"},
            "spec": minimal_spec(sensorEventId=f"ev{i}"),
        }
        created: dict[str, Any] = await api.request("POST", scan_path(namespace), body=body)
        return created

    return list(await asyncio.gather(*(one(i) for i in range(COUNT))))


@pytest.fixture
async def cache(
    api: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ScanCache, list[str | None]]]:
    """A cache listing the latest version 2 Scans a page, and the continue token of each page it asked
    for."""
    monkeypatch.setattr(cache_module, "PAGE_SIZE", 2)
    monkeypatch.setattr(cache_module, "LIST_RESOURCE_VERSION", "")
    scans = ScanCache(api, namespace)
    asked: list[str | None] = []
    page = scans._page

    async def counted(token: str | None) -> str:
        asked.append(token)
        return await page(token)

    monkeypatch.setattr(scans, "_page", counted)
    yield scans, asked
    await scans.stop()


async def test_every_page_is_merged_and_only_compact_scans_are_held(
    cache: tuple[ScanCache, list[str | None]], stored: list[dict[str, Any]]
) -> None:
    scans, asked = cache
    ghost = {**compact(stored[0]), "metadata": {"name": "gone", "resourceVersion": "1"}}
    scans.observe(ghost)  # deleted while nobody watched: the listing no longer has it
    later = {**compact(stored[0]), "metadata": {"name": "later", "resourceVersion": str(2**62)}}
    scans.observe(later)  # a write observed while the listing was read: newer than it
    await scans._relist()
    assert len(asked) == 3 and asked[0] is None and all(asked[1:])  # 5 Scans, 2 a page
    assert scans.synced.is_set() and int(scans.resource_version) >= max(
        int(s["metadata"]["resourceVersion"]) for s in stored
    )
    assert scans.get("gone") is None and scans.get("later") == later
    for obj in stored:
        assert "managedFields" in obj["metadata"]  # what the API server sends ...
        assert scans.get(obj["metadata"]["name"]) == compact(obj)  # ... and what the cache keeps


async def test_a_listing_from_the_watch_cache_comes_whole(
    api: Kube, namespace: str, stored: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "PAGE_SIZE", 2)  # asked for, but not how the watch cache answers

    async def in_watch_cache() -> bool:  # it trails etcd for a moment after writes (a loaded run saw 4)
        listed = await api.request("GET", scan_path(namespace), params={"resourceVersion": "0"})
        return len(listed["items"]) == COUNT

    await eventually(in_watch_cache, timeout=10)
    scans = ScanCache(api, namespace)
    await scans._relist()
    assert sorted(s["metadata"]["name"] for s in scans) == [f"scan-{i}" for i in range(COUNT)]
    assert scans.synced.is_set() and scans.resource_version


async def compact_etcd(cluster: Cluster) -> None:
    """Compact the local control plane's etcd at its current revision (as the API server does every
    5 minutes), through etcd's HTTP gateway."""
    assert cluster.local is not None
    base = f"http://127.0.0.1:{cluster.local.ports['etcd']}/v3/kv"
    async with httpx.AsyncClient() as http:
        head = (await http.post(f"{base}/range", json={"key": base64.b64encode(b"/").decode()})).json()
        revision = head["header"]["revision"]
        reply = await http.post(f"{base}/compaction", json={"revision": revision, "physical": True})
        reply.raise_for_status()


async def test_an_expired_continue_token_means_listing_again(
    cluster: Cluster,
    api: Kube,
    namespace: str,
    cache: tuple[ScanCache, list[str | None]],
    stored: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if cluster.local is None:
        pytest.skip("compacts the local control plane's etcd")
    scans, asked = cache
    page = scans._page

    async def compacted_first(token: str | None) -> str:
        if token and asked.count(None) == 1:  # the first listing's second page
            await api.request(
                "PATCH",
                scan_path(namespace, "scan-0"),
                body={"metadata": {"labels": {"touched": "yes"}}},
                content_type=kube.MERGE_PATCH,
            )  # the revision moves past the listing's snapshot
            await compact_etcd(cluster)
        return await page(token)

    monkeypatch.setattr(scans, "_page", compacted_first)
    await scans.start()
    await asyncio.wait_for(scans.synced.wait(), 30)
    assert asked.count(None) == 2  # the 410 on the first listing's continue token: listed again
    assert sorted(s["metadata"]["name"] for s in scans) == [f"scan-{i}" for i in range(COUNT)]
    assert (scans.get("scan-0") or {})["metadata"]["labels"] == {"touched": "yes"}
