"""`skyscan follow`'s display and exit codes, from events shaped like the scanner's reports."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from skyscan_client import exit_codes
from skyscan_client.events import ScanEvent
from skyscan_client.follow import follow, nside_rows, workers


def progress(done: dict[int, tuple[int, float]], *, left: str | None = "0:01:40") -> dict[str, Any]:
    nsides = {str(n): {"pixels": {"done": d, "generated": g}, "recos": {}} for n, (d, g) in done.items()}
    stats: dict[str, Any] = {"rate": {"all recos": {"wall time": {"mean reco": "0:00:02"}}}}
    if left:
        stats["predictions"] = {"time left": left, "end": "2026-11-23 19:00:00"}
    return {
        "summary": "The Skymap Scanner is busy scanning pixels.",
        "tallies": {"nsides": nsides},
        "processing_stats": stats,
    }


def event(state: str, prog: dict[str, Any] | None = None, **status: Any) -> ScanEvent:
    doc = {"scan_state": state, "is_deleted": False, "wms_deactivated": None, "scan_complete": False}
    doc["wms_workforce"] = {"n_running": 4, "statuses": {"RUNNING": {"Tasking": 4}}}
    return ScanEvent("s1", doc | status, prog, None)


RUNNING = event("IN_PROGRESS__PARTIAL_RESULT_GENERATED", progress({8: (768, 768.0), 64: (100, 576.0)}))
FINAL = event(
    "SCAN_HAS_FINAL_RESULT", progress({8: (768, 768.0), 64: (576, 576.0)}, left=None), scan_complete=True
)


def console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=160, record=True)


def test_the_live_panel_shows_pixels_per_nside_workers_rate_and_eta() -> None:
    screen = console(terminal=True)
    assert follow([RUNNING, FINAL], screen) == exit_codes.OK
    text = screen.export_text()
    assert "SCAN_HAS_FINAL_RESULT" in text and "576/576" in text
    assert "4 running (RUNNING/Tasking: 4)" in text and "0:00:02 per reco" in text


def test_a_line_per_change_when_piped() -> None:
    screen = console(terminal=False)
    follow([RUNNING, FINAL], screen)
    lines = screen.export_text().splitlines()
    assert len(lines) == 2
    assert "868/1344 pixels" in lines[0] and lines[1].split()[2] == "SCAN_HAS_FINAL_RESULT"


def test_json_lines() -> None:
    screen = console(terminal=False)
    follow([RUNNING], screen, as_json=True)
    doc = json.loads(screen.export_text())
    assert doc["scan_id"] == "s1" and doc["status"]["scan_state"] == RUNNING.state


def test_exit_codes_say_how_the_scan_ended() -> None:
    deleted = event("ABORTED__PARTIAL_RESULT_GENERATED", is_deleted=True, wms_deactivated="ABORTED")
    assert follow([RUNNING, deleted], console(False)) == exit_codes.ABORTED
    assert follow([RUNNING], console(False)) == exit_codes.FAILED  # the stream ended on a failure
    assert follow([], console(False)) == exit_codes.FAILED


def test_rows_and_workers_read_the_scanners_shapes() -> None:
    assert nside_rows(RUNNING.progress) == [(8, 768, 768), (64, 100, 576)]
    assert nside_rows(None) == []
    assert workers({"wms_workforce": {"n_running": 0, "statuses": {}}}) == "0 running"


def test_a_polled_scan_the_operator_failed_is_terminal_and_aborted() -> None:
    # Failed before start (e.g. its event missing): no WMS deactivation, only the ABORTED__ state.
    failed = event("ABORTED__PRESTARTUP")
    assert failed.aborted and failed.terminal
    assert not event("PENDING__PRESTARTUP").terminal
