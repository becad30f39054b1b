"""The benchmark harness against the real parts it measures (a few scans, seconds): the Scans it
stores are served by a real shim, its bare server answers the same bytes, and the archived history it
COPYs is read back by the product's Archive. The whole `make bench --quick` takes minutes, too long
for CI; these keep its pieces from drifting from the product."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import aiohttp
import asyncpg

from skyscan.io.kube import Kube

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import harness
import history

from skyscan import manifest
from skyscan.io.archive import Archive
from tests.conftest import Cluster


async def test_a_real_shim_serves_the_stored_scans(
    cluster: Cluster, api: Kube, namespace: str, tmp_path: Path
) -> None:
    ids = await harness.create_scans(api, namespace, 6, event=True, first=20)
    config = harness.ShimConfig.make(cluster.kubeconfig, namespace, tmp_path)
    async with (
        harness.running(harness.start_shim(config)) as shim,
        aiohttp.ClientSession(headers=config.headers) as http,
    ):
        assert 0 < await shim.wait_ok(timeout=60) < 60
        async with http.get(f"{shim.base}/scan/{ids[3]}/manifest") as r:
            assert r.status == 200
            body = await r.read()
        got = json.loads(body)
        assert got["scan_id"] == ids[3]
        assert got["event_metadata"]["event_id"] == 23 and got["classifiers"]["i"] == 23
        async with harness.running(harness.start_bare_server(body, tmp_path)) as bare:

            def getter(base: str) -> harness.Call:
                async def get(_: int) -> None:
                    async with http.get(f"{base}/scan/{random.choice(ids)}/manifest") as r:
                        assert r.status == 200
                        await r.read()

                return get

            figures = await harness.side_by_side(
                {"shim": getter(shim.base), "bare": getter(bare.base)}, 8, 2, rounds=2
            )
            async with http.get(f"{bare.base}/anything") as r:
                assert await r.read() == body
        assert figures["shim"].n == figures["bare"].n == 8
        assert harness.rss_mib(shim.pid) > 20


async def test_the_archive_reads_the_copied_history(archive_dsn: str) -> None:
    archive = await Archive.connect(archive_dsn)
    try:
        conn = await asyncpg.connect(archive_dsn)
        indexes = "SELECT count(*) FROM pg_indexes WHERE tablename = 'scans'"
        before = await conn.fetchval(indexes)
        took = await history.load(archive_dsn, "bench-ns", 25)
        assert await conn.fetchval("SELECT count(*) FROM scans") == 25
        assert await conn.fetchval("SELECT count(*) FROM sensor_events") == 7  # 4 scans an event
        assert await conn.fetchval(indexes) == before  # dropped for the load, built again
        row = await conn.fetchrow("SELECT scan_id, sensor_event_id FROM scans WHERE event_id = 9")
        await conn.close()
        assert set(took) == {"events_s", "scans_s", "indexes_s"}
        scan = await archive.get("bench-ns", row["scan_id"])
        assert scan is not None and scan["status"]["archivedAt"] > 0
        assert manifest.of(scan)["event_metadata"]["run_id"] == history.ARCHIVED_RUN0
        event = await archive.event(row["sensor_event_id"])
        assert event == history.EVENT
    finally:
        await archive.close()
