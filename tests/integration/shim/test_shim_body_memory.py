"""Request bodies cost the shim memory only while they are handled, and only so much at once: a
`skyscan-shim serve` process's RSS under a burst of large authenticated bodies, and the budget's
waiting and refusal over real HTTP (issue 18, finding 4: no request inflates the shim)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from api_shim.bodies import BODIES
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, scan_body, shim_process

pytestmark = pytest.mark.timeout(180)
MIB = 1 << 20


def rss_mib(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


@pytest.fixture
async def served(cluster: Cluster, namespace: str, tmp_path: Path) -> AsyncIterator[tuple[int, str, str]]:
    """A shim process: its pid, URL and a user's token."""
    async with shim_process(cluster, namespace, tmp_path, SKYSCAN_LOG_LEVEL="WARNING") as shim:
        yield shim.pid, shim.url, shim.token


async def test_large_bodies_are_let_go_once_answered_and_handled_a_budget_at_a_time(
    served: tuple[int, str, str],
) -> None:
    """Thirty 10 MB bodies on thirty keep-alive connections: aiohttp kept each request (its body cached
    on it) until its connection's next request, 300 MB held by idle connections."""
    pid, url, token = served
    body = json.dumps({**scan_body(), "event_live_json": " " * (10 * MIB)}).encode()
    limits = httpx.Limits(max_connections=30, max_keepalive_connections=30)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        idle, _ = rss_mib(pid)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        replies = await asyncio.gather(
            *(http.post("/scan", content=body, headers=headers) for _ in range(30))
        )
        assert {r.status_code for r in replies} == {400}, replies[0].text  # not a JSON object: refused
        now, peak = rss_mib(pid)  # the thirty connections still open
    assert now - idle < 100, (idle, now, peak)  # 300 MB more before
    assert peak - idle < 400, (idle, now, peak)  # 64 MiB of bodies at once, each parsed: a few times that


async def test_a_body_waits_for_room_and_is_refused_when_none_comes(make_shim: MakeShim) -> None:
    shim = await make_shim(body_bytes_at_once=MIB, body_wait_seconds=0.5)
    budget = shim.app[BODIES]
    parts = urlsplit(shim.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:  # a client sending 900 KB slowly holds room for them
        writer.write(
            f"POST /scans/find HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {shim.tokens['user']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {900_000}\r\n\r\n".encode()
            + b'{"filter": {'
        )
        await writer.drain()
        await eventually(lambda: asyncio.sleep(0, budget.held == 900_000), timeout=10, interval=0.01)

        refused = await shim.call("POST", "/scans/find", data=b" " * 200_000 + b'{"filter": {}}')
        assert (refused.status, refused.body["reason"]) == (503, "too many request bodies"), refused.body
        assert refused.headers["Retry-After"] == "5"
        small = await shim.call("POST", "/scans/find", json_body={"filter": {}})  # 14 bytes fit beside
        assert small.status == 200, small.body

        waiting = asyncio.create_task(
            shim.call("POST", "/scans/find", data=b" " * 200_000 + b'{"filter": {}}')
        )
        await asyncio.sleep(0.1)
        assert not waiting.done()  # waits, unread, for the slow body to be handled
        writer.write(b"}}" + b" " * (900_000 - 14))
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
        assert (await asyncio.wait_for(waiting, 10)).status == 200
    finally:
        writer.close()
    assert budget.held == 0 and budget.peak <= MIB, (budget.held, budget.peak)
