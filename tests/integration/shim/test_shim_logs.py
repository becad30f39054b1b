"""What a client sends never forges or leaks into the shim's log (issue 18, finding 10): a `skyscan-shim
serve` process, text logs, raw requests over a socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import shim_process

pytestmark = pytest.mark.timeout(120)
FORGED = "2026-11-25 00:00:00,000 INFO api_shim.auth: alice logged in as admin"


@dataclass
class ShimProcess:
    url: str
    log: Path
    token: str

    async def send(self, raw: bytes) -> bytes:
        """One raw request on a connection of its own; the answer's status line."""
        parts = urlsplit(self.url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(raw)
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout=10)
        writer.close()
        return status

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


@pytest.fixture
async def served(cluster: Cluster, namespace: str, tmp_path: Path) -> AsyncIterator[ShimProcess]:
    async with shim_process(cluster, namespace, tmp_path, SKYSCAN_LOG_FORMAT="text") as shim:
        yield ShimProcess(shim.url, shim.log, shim.token)


async def logged(shim: ShimProcess, count: int) -> list[str]:
    """The log's lines once it holds `count` access lines (written after each answer)."""

    async def written() -> bool:
        return sum(" api_shim.access: " in line for line in shim.lines()) >= count

    await eventually(written, timeout=10)
    return shim.lines()


async def test_a_scan_id_in_a_path_cannot_forge_a_log_line(served: ShimProcess) -> None:
    forged = FORGED.replace(" ", "%20").replace(",", "%2C").replace(":", "%3A")
    for newline in ("%0A", "%0D", "%0D%0A"):
        path = f"/scan/abc{newline}{forged}/status"
        assert (await served.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())).startswith(
            b"HTTP/1.1 401"
        )
        token = f"Authorization: Bearer {served.token}\r\n"
        assert (await served.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n{token}\r\n".encode())).startswith(
            b"HTTP/1.1 404"
        )
    lines = await logged(served, 6)
    assert not [line for line in lines if line.startswith(FORGED[:23]) or "\r" in line], lines
    assert sum("[scan abc\\n2026-11-25" in line for line in lines) == 2, lines  # escaped, on its own line


async def test_a_malformed_request_logs_one_line_without_its_headers(served: ShimProcess) -> None:
    """aiohttp refuses a folded (obs-fold) header; its error quoted the raw line, a static token in it."""
    secret = served.token
    for raw in (
        f"GET /scans/backlog HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n {secret}\r\n\r\n",
        f"GET /scans/backlog HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\tAuthorization: Bearer {secret}\r\n\r\n",
        "GARBAGE\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    ):
        assert (await served.send(raw.encode())).endswith(b" 400 Bad Request\r\n"), raw

    lines = await logged(served, 5)  # /healthz's, then the four refusals'
    assert sum(" 400 " in line for line in lines if " api_shim.access: " in line) == 4, lines
    assert sum("refused a malformed HTTP request (400 BadHttpMessage)" in line for line in lines) >= 2, lines
    text = served.log.read_text()
    assert secret not in text
    assert "Traceback" not in text and "AssertionError" not in text, text
