"""The shim's Scan cache tells a quiet watch from a broken one (issue 18, item 1). A watch of Scans nobody
changes brings nothing, not even bookmarks, and must not make the shim unready; an API server that
stops answering (paused with SIGSTOP: its connections stay open, nothing is refused) must, although no
request fails outright. The API server is a control plane's of the test's own: pausing the session's
would disturb other tests. (The API server killed under a whole shim: e2e/test_restarts.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_shim.repository.cache import ScanCache
from skyscan.io import kube
from skyscan_local import control_plane
from tests.helpers import eventually

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SKYSCAN_TEST_KUBECONFIG")), reason="pauses the API server of a local control plane"
)

IDLE, ANSWER = 1.0, 2.0  # the cache's bounds here (30 s and 30 s by default)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scan.yaml"


def scan(name: str) -> dict[str, Any]:
    body: dict[str, Any] = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "Scan")
    body["metadata"] = {"name": name}
    return body


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[control_plane.ClusterState]:
    state = control_plane.start(tmp_path / "c", tie_to_parent=True)
    try:
        yield state
    finally:
        control_plane.stop(tmp_path / "c")
        control_plane.remove(tmp_path / "c")


@pytest.mark.timeout(120)
async def test_a_quiet_watch_is_not_broken_and_an_api_server_that_stops_answering_is(
    plane: control_plane.ClusterState,
) -> None:
    apiserver = next(p for p in plane.processes if p.name == "kube-apiserver")
    async with await kube.connect(plane.kubeconfig) as api:
        await api.request("POST", kube.scan_path("default"), body=scan("before"))
        cache = ScanCache(api, "default", idle=IDLE, answer=ANSWER)
        await cache.start()
        try:
            await asyncio.wait_for(cache.synced.wait(), 30)

            # Listed from the API server's watch cache (resourceVersion 0), which may not hold the scan
            # made just before yet: the watch brings it then.
            async def held() -> bool:
                return "before" in cache

            await eventually(held, timeout=10)

            # Quiet for four idle bounds: the watch is renewed each time, never counted broken.
            quiet_until = time.monotonic() + 4 * IDLE
            while time.monotonic() < quiet_until:
                assert cache.broken_for() == 0
                await asyncio.sleep(0.05)

            os.kill(apiserver.pid, signal.SIGSTOP)
            try:
                paused = time.monotonic()

                async def broken() -> bool:
                    return cache.broken_for() > 1

                await eventually(broken, timeout=IDLE + ANSWER + 10, interval=0.05)
                noticed = time.monotonic() - paused - 1
            finally:
                os.kill(apiserver.pid, signal.SIGCONT)
            print(f"broken {noticed:.1f}s after the API server stopped answering ({IDLE} + {ANSWER} s)")
            assert noticed <= IDLE + ANSWER + 1

            async def mended() -> bool:
                return cache.broken_for() == 0

            await eventually(mended, timeout=20)
            await api.request("POST", kube.scan_path("default"), body=scan("after"))

            async def watched() -> bool:
                return "after" in cache

            await eventually(watched, timeout=10)
        finally:
            await cache.stop()
