"""A `skyscan-shim serve` process told to stop (SIGTERM, as the kubelet does when a Pod is deleted) serves
on for `SKYSCAN_SHUTDOWN_DELAY_SECONDS` before it closes its port: requests a Service still routes to it
in a rollout are answered, never refused."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import shim_process

pytestmark = pytest.mark.timeout(120)


async def test_a_stopped_shim_serves_through_its_shutdown_delay_then_exits(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    async with shim_process(cluster, namespace, tmp_path, SKYSCAN_SHUTDOWN_DELAY_SECONDS="3") as shim:
        async with httpx.AsyncClient(base_url=shim.url, timeout=5) as http:
            os.kill(shim.pid, signal.SIGTERM)
            stopped_at = time.monotonic()
            answered = 0
            while time.monotonic() - stopped_at < 2:  # well inside the delay
                assert (await http.get("/healthz")).status_code == 200
                answered += 1

            async def closed() -> bool:
                try:
                    await http.get("/healthz")
                except httpx.ConnectError:
                    return True
                return False

            await eventually(closed, timeout=30)
        assert answered > 1
        assert time.monotonic() - stopped_at >= 3  # its port closed, not before the delay
        assert "stopping: serving 3 s more, then closing" in shim.log.read_text()
