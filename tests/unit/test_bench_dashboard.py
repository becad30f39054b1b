"""The dashboard bench's bookkeeping (tools/bench/dashboard_bench.py): a figure's goal and verdict, a row
that could not run said so, and every row skipped, saying why, where there is no chromium."""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "bench"))
import dashboard_bench
from dashboard_bench import Figure


def test_a_figure_says_its_goal_and_whether_it_met_it() -> None:
    met = Figure("skymap drawn", 640, "ms", 1000.0)
    assert (met.figure, met.goal, met.verdict) == ("640 ms", "< 1000 ms", "PASS")
    assert Figure("skymap drawn", 1000, "ms", 1000.0).verdict == "FAIL"  # the goal is an upper limit
    plain = Figure("draws", 2, "")
    assert (plain.figure, plain.goal, plain.verdict) == ("2", "", "")
    failed = Figure("dashboard: skymap_drawn", None, note="error: TimeoutError: no canvas")
    assert (failed.figure, failed.verdict) == ("error: TimeoutError: no canvas", "")


def test_without_chromium_every_row_is_skipped_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard_bench, "HAVE_CHROMIUM", False)

    async def unused(_: Any) -> Figure:
        raise AssertionError("no row runs without a browser")

    figures = asyncio.run(dashboard_bench.measure("http://x", "t", 1, None, "ns", 1, [unused]))  # type: ignore[arg-type]
    assert [(f.what, f.figure) for f in figures] == [("dashboard: unused", "skipped: no chromium")]
    # A row is one function, listed: each a coroutine function of the Dashboard.
    assert dashboard_bench.skymap_drawn in dashboard_bench.ROWS
    assert all(inspect.iscoroutinefunction(row) for row in dashboard_bench.ROWS)
