"""The bench of finds selecting a third of the live scans (tools/bench/third_finds.py): hey POSTs the
find 4 at a time while another hey probes /healthz, stopped once the finds are done."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import loadgen
import third_finds

LIVE = 30
TOKEN = {"Authorization": "Bearer t"}


def test_a_third_of_the_bench_scans_share_the_classifier() -> None:
    import harness

    ids = [i for i in range(LIVE) if harness.scan_spec(i)["classifiers"][third_finds.CLASSIFIER] == 1]
    assert len(ids) == third_finds.expected(LIVE) == 10
    assert third_finds.BODY["filter"] == {"classifiers.third": 1}


def test_heys_command_line_posts_the_body_or_probes_until_stopped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "hey").write_text("")
    monkeypatch.setenv("SKYSCAN_K8S_BIN_READY", str(tmp_path))
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    body = tmp_path / "body.json"
    assert third_finds.command("http://h/f", 4, TOKEN, n=40, body=body) == [
        "taskset", "-c", "1", str(tmp_path / "hey"), "-c", "4", "-o", "csv", "-t", "60", "-n", "40",
        "-m", "POST", "-D", str(body), "-T", "application/json", "-H", "Authorization: Bearer t", "http://h/f",
    ]  # fmt: skip
    assert third_finds.command("http://h/healthz", 1, {}, rate=100)[4:] == [
        "-c", "1", "-o", "csv", "-t", "60", "-z", "1h", "-q", "100", "http://h/healthz",
    ]  # fmt: skip


async def test_the_finds_and_the_probes_are_counted_and_timed(tmp_path: Path) -> None:
    try:
        loadgen.binary()
    except FileNotFoundError:
        pytest.skip("no hey (tools/k8s/build.sh --bench builds it)")
    seen: Counter[str] = Counter()

    async def find(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == TOKEN["Authorization"]
        assert await request.json() == third_finds.BODY
        seen["find"] += 1
        found = [{"scan_id": str(i)} for i in range(third_finds.expected(LIVE))]
        return web.json_response({"manifests": found})

    async def healthz(_: web.Request) -> web.Response:
        seen["healthz"] += 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/scans/find", find)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        got = await third_finds.measure(f"http://127.0.0.1:{port}", TOKEN, os.getpid(), LIVE, 40, tmp_path)
    finally:
        await runner.cleanup()
    assert got.found == 10
    assert got.finds.n == 40 and seen["find"] == 1 + 16 + 40  # the check, the warm-up, the measured
    assert got.healthz.n > 0 and got.healthz_alone.n > 0
    assert seen["healthz"] == got.healthz.n + got.healthz_alone.n
    assert got.cpu_ms_per_find >= 0
    assert re.fullmatch(r"([\d.]+ ){3}before, ([\d.]+ ){3}after", got.load), got.load
