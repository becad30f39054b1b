"""The benchmark harness's own arithmetic and bookkeeping (tools/bench): percentiles, the load loop,
the report's verdicts, and the archived-history rows it COPYs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import harness
import history
import loadgen
import profile_get
import suite

from skyscan import manifest


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert harness.percentile(values, 99) == 99.0  # not the largest of 100
    assert harness.percentile(values, 50) == 50.0
    assert harness.percentile(values, 100) == 100.0
    assert harness.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert harness.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        harness.percentile([], 50)
    with pytest.raises(ValueError):
        harness.percentile([1.0], 0)


def test_stats_in_milliseconds_and_per_second() -> None:
    got = harness.stats([0.004, 0.001, 0.002, 0.003], elapsed=2.0)
    assert got == harness.Stats(n=4, per_s=2.0, p50_ms=2.0, p99_ms=4.0, max_ms=4.0)


async def test_load_loop_calls_each_index_once_at_the_concurrency() -> None:
    seen: list[int] = []
    running = peak = 0

    async def call(i: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001)
        seen.append(i)
        running -= 1

    elapsed, latencies = await harness.load_loop(call, 50, 4)
    assert sorted(seen) == list(range(50))
    assert peak == 4
    assert len(latencies) == 50 and all(0 < t <= elapsed for t in latencies)


async def test_side_by_side_alternates_the_order_of_kinds() -> None:
    order: list[str] = []

    def kind(name: str) -> Callable[[int], Awaitable[None]]:
        async def call(_: int) -> None:
            order.append(name)

        return call

    got = await harness.side_by_side({"a": kind("a"), "b": kind("b")}, 8, 1, rounds=4)
    warm_up, ab, ba = ["a", "a", "b", "b"], ["a", "a", "b", "b"], ["b", "b", "a", "a"]
    assert order == warm_up + ab + ba + ab + ba
    assert got["a"].n == got["b"].n == 8


async def test_interleaved_rounds_alternate_and_add_up_each_kinds_runs() -> None:
    calls: list[tuple[str, int]] = []

    def kind(name: str, seconds: float) -> harness.Measure:
        async def measure(n: int) -> tuple[float, list[float]]:
            calls.append((name, n))
            return seconds, [seconds / n] * n

        return measure

    got = await harness.interleaved({"a": kind("a", 1.0), "b": kind("b", 2.0)}, 40, 6, rounds=2)
    assert calls == [("a", 6), ("b", 6), ("a", 20), ("b", 20), ("b", 20), ("a", 20)]
    assert (got["a"].n, got["a"].per_s, got["b"].per_s) == (40, 20.0, 10.0)
    assert got["b"].p50_ms == 100.0


HEY_CSV = """response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset
0.0021,0.0003,0.0000,0.0000,0.0017,0.0000,200,0.0004
0.0013,0.0000,0.0000,0.0000,0.0012,0.0000,200,0.0026
0.0410,0.0000,0.0000,0.0000,0.0400,0.0001,503,0.0030
"""


def test_heys_csv_gives_each_latency_status_and_the_runs_end() -> None:
    got = loadgen.parse_csv(HEY_CSV)
    assert got.latencies == [0.0021, 0.0013, 0.041]
    assert got.statuses == {200: 2, 503: 1}
    assert got.elapsed == pytest.approx(0.044)  # the last answer's end: its offset + its latency
    assert loadgen.parse_csv(HEY_CSV.splitlines()[0]) == loadgen.Run([], Counter(), 0.0)


def test_hey_sends_a_multiple_of_its_concurrency() -> None:
    assert [loadgen.sent(n, 16) for n in (16, 1000, 1008)] == [16, 992, 1008]
    with pytest.raises(ValueError):
        loadgen.sent(15, 16)


def test_hey_is_pinned_to_one_cpu_where_there_are_two(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hey = tmp_path / "hey"
    hey.write_text("")
    monkeypatch.setenv("SKYSCAN_K8S_BIN_READY", str(tmp_path))
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    args = loadgen.command("http://h/x", 10, 4, {"Authorization": "Bearer t"})
    assert args == ["taskset", "-c", "1", str(hey), "-n", "10", "-c", "4", "-o", "csv",
                    "-H", "Authorization: Bearer t", "http://h/x"]  # fmt: skip
    assert loadgen.client() == "hey, pinned to CPU 1"
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    assert loadgen.command("http://h/x", 10, 4, {})[0] == str(hey)
    assert loadgen.client() == "hey (not pinned: one CPU)"


def test_a_profiles_parts_are_shares_of_all_samples() -> None:
    top, middleware = "<module> (api_shim/app.py:1)", "metrics_middleware (/x/api_shim/metrics.py:3)"
    raw = "\n".join([
        f"{top};_run_once (asyncio/base_events.py:9);RequestHandler.log_access (aiohttp/web_protocol.py:5);"
        "format (logging/__init__.py:7) 30",
        f"{top};{middleware};observe (/x/api_shim/metrics.py:4);inc (prometheus_client/metrics.py:2) 10",
        f"{top};{middleware};guarded (/x/api_shim/app.py:6) 60",
    ])  # fmt: skip
    got = profile_get.shares(profile_get.samples(raw))
    assert got["samples"] == 100
    assert got["parts_pct"] == {"access log": 30.0, "metrics": 10.0}
    assert got["top_product_inclusive_pct"]["<module> (api_shim/app.py)"] == 100.0
    assert got["top_product_inclusive_pct"]["metrics_middleware (api_shim/metrics.py)"] == 70.0
    assert "inc (prometheus_client/metrics.py)" not in got["top_product_inclusive_pct"]
    assert got["top_own_pct"] == {
        "format (logging/__init__.py)": 30.0, "inc (prometheus_client/metrics.py)": 10.0,
        "guarded (api_shim/app.py)": 60.0,
    }  # fmt: skip


async def test_own_process_figures() -> None:
    assert harness.rss_mib(os.getpid()) > 1
    assert harness.cpu_seconds(os.getpid()) > 0
    assert 0 <= await harness.cpu_percent(os.getpid(), 0.05) < 300


def test_goal_verdicts_and_table() -> None:
    passed = suite.measured("shim RSS", 90.4, "MiB", "shim RSS, MiB")
    failed = suite.measured("cold start", 3.2, "s", "shim cold start, s")
    plain = suite.measured("idle CPU", 1.5, "% of a core")
    assert (passed.verdict, passed.goal) == ("PASS", "< 100 MiB")
    assert failed.verdict == "FAIL"
    assert plain.verdict == plain.goal == ""
    driven = suite.Row("GET", "3000/s", client="hey, pinned to CPU 1")
    lines = suite.markdown([passed, failed, driven]).splitlines()
    assert lines[0].startswith("| measure |") and "| load client |" in lines[0] and len(lines) == 5
    assert lines[2] == "| shim RSS | 90.4 MiB |  |  | < 100 MiB | PASS |"
    assert lines[4] == "| GET | 3000/s |  | hey, pinned to CPU 1 |  |  |"


def test_a_ratio_goal_needs_the_throughput_and_the_p99() -> None:
    bare = harness.stats([0.002] * 98 + [0.010] * 2, 1.0)  # 100/s, p99 10 ms
    fast = harness.stats([0.002] * 98 + [0.019] * 2, 100 / 85)  # 85/s, p99 19 ms
    assert suite.versus("GET", fast, bare, "bare", 0.8, 2).verdict == "PASS"
    assert suite.versus("GET", fast, bare, "bare", 0.9, 2).verdict == "FAIL"  # too few per second
    slow_tail = harness.stats([0.002] * 98 + [0.021] * 2, 100 / 85)
    row = suite.versus("GET", slow_tail, bare, "bare", 0.8, 2)
    assert (row.verdict, row.goal) == ("FAIL", "≥ 0.8x, p99 ≤ 2x")  # the tail too long
    assert suite.versus("POST", slow_tail, bare, "raw", 0.5).verdict == "PASS"  # no p99 goal


def test_history_rows_are_the_products_manifests() -> None:
    template = history.Template.make("ns")
    rows = list(history.scan_rows(template, "ns", 40, 2, now=2_000_000_000.0))
    assert [r["event_id"] for r in rows] == [40, 41]
    row = rows[1]
    scan, mani = json.loads(row["scan"]), json.loads(row["manifest"])
    assert mani == manifest.of(scan)  # the stored manifest is what the product computes
    assert scan["metadata"]["name"] == mani["scan_id"] == row["scan_id"]
    assert scan["status"]["archivedAt"] == row["archived_at"]
    assert mani["event_metadata"]["run_id"] == row["run_id"] == history.ARCHIVED_RUN0 + 4
    assert mani["classifiers"] == json.loads(row["classifiers"]) == {"origin": "bench", "i": 10_000_041}
    assert mani["sensor_event_id"] == row["sensor_event_id"] == history.event_id(41) == history.event_id(40)


def test_history_records_follow_the_table_and_refuse_drift() -> None:
    template = history.Template.make("ns")
    row = next(history.scan_rows(template, "ns", 0, 1, now=2_000_000_000.0))
    columns = list(reversed(row))
    assert history.as_records(iter([row]), columns) == [tuple(row[c] for c in columns)]
    with pytest.raises(ValueError, match="new_column"):
        history.as_records(iter([row]), [*columns, "new_column"])


async def test_a_broken_measurement_is_a_row_and_the_run_goes_on() -> None:
    report = suite.Report()

    async def broken() -> None:
        raise TimeoutError("no Job within 60 s")

    async def fine() -> None:
        report.add(suite.Row("next", "1 s"))

    await report.section("Scan created → Job created", broken())
    await report.section("next", fine())
    assert [(r.what, r.figure) for r in report.rows] == [
        ("Scan created → Job created", "error: TimeoutError: no Job within 60 s"),
        ("next", "1 s"),
    ]
