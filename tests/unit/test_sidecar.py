"""The startup.json sidecar as a real process against a real local HTTP server (no cluster needed)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

SCAN = "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0"
FAST = ["--poll-seconds", "0.05", "--settle-seconds", "0.3"]


@dataclass
class Receiver:
    """Answers PUT /scan/{id}/startup.json with the queued statuses, then 200."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[str, str, bytes]] = field(default_factory=list)  # (path, authorization, body)

    async def put(self, request: web.Request) -> web.Response:
        self.received.append((request.path, request.headers.get("Authorization", ""), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"status": status}, status=status)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_put("/scan/{scan_id}/startup.json", r.put)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    r.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield r
    await runner.cleanup()


async def start(receiver: Receiver, path: Path, *args: str, **env: str) -> asyncio.subprocess.Process:
    environment = {
        **os.environ,
        "SKYSCAN_SKYDRIVER_ADDRESS": receiver.url + "/",
        "SKYSCAN_SKYDRIVER_SCAN_ID": SCAN,
        "SKYSCAN_SKYDRIVER_AUTH": "the-scans-token",
        **env,
    }
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "skyscan.io.sidecar", str(path), *FAST, *args,
        env=environment, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def finish(proc: asyncio.subprocess.Process, timeout: float = 20) -> tuple[int, str]:
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


def startup_json(n: int = 40_000) -> bytes:
    return json.dumps(
        {"GCDQp_packet": [[i, i * 0.5, -i] for i in range(n)], "baseline_GCD_file": "x"}
    ).encode()


async def test_waits_for_the_whole_file_then_uploads_with_retries(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [503, 502]  # the shim is briefly unavailable: retried
    path = tmp_path / "startup.json"
    proc = await start(receiver, path, "--exit-when-done")
    content = startup_json()
    assert len(content) > 500_000
    await asyncio.sleep(0.3)
    with path.open("wb") as f:  # written in pieces, as a slow writer would
        for i in range(0, len(content), 100_000):
            f.write(content[i : i + 100_000])
            f.flush()
            await asyncio.sleep(0.1)
    code, log = await finish(proc)
    assert code == 0, log
    assert len(receiver.received) == 3
    for request_path, authorization, body in receiver.received:
        assert request_path == f"/scan/{SCAN}/startup.json"
        assert authorization == "Bearer the-scans-token"
        assert body == content  # never a partial file
    assert "uploaded" in log


async def test_stays_alive_after_the_upload_until_terminated(receiver: Receiver, tmp_path: Path) -> None:
    path = tmp_path / "startup.json"
    path.write_bytes(startup_json(1000))
    proc = await start(receiver, path)
    for _ in range(200):
        if receiver.received:
            break
        await asyncio.sleep(0.05)
    assert receiver.received
    await asyncio.sleep(0.5)
    assert proc.returncode is None  # a native sidecar lives as long as its Pod
    proc.send_signal(signal.SIGTERM)
    code, log = await finish(proc)
    assert code == 0, log


async def test_a_refusal_is_not_retried(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [403]
    path = tmp_path / "startup.json"
    path.write_bytes(startup_json(10))
    code, log = await finish(await start(receiver, path, "--exit-when-done"))
    assert code == 1 and "HTTP 403" in log
    assert len(receiver.received) == 1


async def test_an_unreachable_shim_is_retried_until_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "startup.json"
    path.write_bytes(startup_json(10))
    unreachable = Receiver(url="http://127.0.0.1:9")  # the discard port: connection refused
    code, log = await finish(await start(unreachable, path, "--exit-when-done", "--retry-seconds", "1.5"))
    assert code == 1 and "still failing after 1.5s" in log and "retrying" in log


async def test_a_5xx_is_retried_while_the_next_try_starts_within_the_limit(
    receiver: Receiver, tmp_path: Path
) -> None:
    receiver.statuses = [503] * 10
    path = tmp_path / "startup.json"
    path.write_bytes(startup_json(10))
    code, log = await finish(await start(receiver, path, "--exit-when-done", "--retry-seconds", "1.2"))
    # Tries at 0 s and 0.5 s; the next would be 1 s later, past the 1.2 s limit: not made.
    assert code == 1 and "still failing after 1.2s: HTTP 503" in log
    assert len(receiver.received) == 2


async def test_an_invalid_file_is_never_uploaded_and_usage_errors(receiver: Receiver, tmp_path: Path) -> None:
    path = tmp_path / "startup.json"
    path.write_bytes(b'{"half": [1, 2, ')
    code, log = await finish(await start(receiver, path, "--exit-when-done", "--wait-timeout", "1"))
    assert code == 1 and "did not appear complete" in log and not receiver.received
    code, log = await finish(await start(receiver, path, SKYSCAN_SKYDRIVER_SCAN_ID=""))
    assert code == 2 and "SKYSCAN_SKYDRIVER_SCAN_ID" in log


async def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "skyscan-sidecar"  # what the scanner Pod's sidecar runs
    proc = await asyncio.create_subprocess_exec(str(script), "--help", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0 and b"SKYSCAN_SKYDRIVER_AUTH" in out
