"""How `skyscan` turns its command line into requests: launch's body, find's filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from skyscan_client import tables
from skyscan_client.cli import find_filter, launch_request, parser, state_matches
from skyscan_client.tables import backlog_place, wms
from skyscan_client.types import Status


def test_launch_flags_go_on_top_of_the_file(tmp_path: Path) -> None:
    (tmp_path / "request.yaml").write_text("reco_algo: splinempe\nnsides: {'8': 0}\npriority: 3\n")
    (tmp_path / "event.json").write_text(json.dumps({"run_id": 123456, "event_id": 1}))
    args = parser().parse_args(
        ["launch", "--file", str(tmp_path / "request.yaml"), "--event", str(tmp_path / "event.json"),
         "--nsides", "8:0", "64:12", "--cluster", "osg=4", "--cluster", "osg=2", "--simulated",
         "--worker-memory", "4GB", "--scanner-memory", "1024000000", "--classifier", "shift=alice",
         "--classifier", "n=3", "--env", "A=b=c", "--debug-mode", "client-logs"]
    )  # fmt: skip
    assert launch_request(args) == {
        "reco_algo": "splinempe",
        "priority": 3,
        "event_live_json": {"run_id": 123456, "event_id": 1},
        "nsides": {"8": 0, "64": 12},
        "real_or_simulated_event": "simulated",
        "request_clusters": [["osg", 4], ["osg", 2]],  # the list form: a cluster may come twice
        "worker_memory_bytes": "4GB",
        "scanner_server_memory_bytes": 1024000000,
        "classifiers": {"shift": "alice", "n": 3},
        "scanner_server_env_from_user": {"A": "b=c"},
        "debug_mode": ["client-logs"],
        "docker_tag": "latest",
    }


def test_bad_flags_are_usage_errors() -> None:
    for argv in (["launch", "--nsides", "8:x"], ["launch", "--cluster", "osg"], ["find", "--run", "r"]):
        with pytest.raises(SystemExit) as caught:
            parser().parse_args(argv)
        assert caught.value.code == 2


def test_find_filter_from_options() -> None:
    args = parser().parse_args(["find", "--run", "7", "--event", "9", "--classifier", "n=3"])
    assert find_filter(args) == {
        "$and": [
            {"event_metadata.run_id": 7},
            {"event_metadata.event_id": 9},
            {"classifiers.n": {"$in": ["3", 3]}},  # stored as text or as a number
        ]
    }
    raw = parser().parse_args(["find", "--filter", '{"priority": {"$gt": 5}}'])
    assert find_filter(raw) == {"priority": {"$gt": 5}}
    assert find_filter(parser().parse_args(["find"])) == {}


def test_state_matches_a_part() -> None:
    assert state_matches("IN_PROGRESS__PARTIAL_RESULT_GENERATED", "in_progress")
    assert state_matches("SCAN_HAS_FINAL_RESULT", "final")
    assert not state_matches("PENDING__PRESTARTUP", "IN_PROGRESS")


def test_a_workflow_never_created_is_not_shown_active() -> None:
    """`skyscan status`'s WMS row: the deactivation, else active only once a workflow exists."""

    def doc(deactivated: str | None, workflow_id: str | None) -> Status:
        workforce = {"workflow_id": workflow_id, "statuses": {}, "n_running": 0, "top_errors": {}}
        return {
            "scan_state": "PENDING__PRESTARTUP",
            "is_deleted": False,
            "wms_deactivated": deactivated,
            "scan_complete": False,
            "scanner_server_logs": {"url": None},
            "wms_workforce": workforce,
        }

    assert wms(doc(None, "not-yet-requested")) == "not requested"
    assert wms(doc(None, None)) == "not requested"
    assert wms(doc(None, "")) == "not requested"
    assert wms(doc(None, "WF-1")) == "active"
    assert wms(doc("ABORTED", "WF-1")) == "ABORTED"
    assert wms({**doc(None, None), "wms_workforce": None}) == "not requested"  # type: ignore[typeddict-item]


def test_a_waiting_scans_place_in_words() -> None:
    """`skyscan status`'s backlog row (shown only while the scan waits)."""
    place = {"position": 3, "wait_reason": "Priority", "estimated_start": 1, "estimated_wait_seconds": 240.4}
    assert backlog_place(place) == "position 3 · Priority (scans ahead of it start first) · about 4 min"
    far = {"position": None, "wait_reason": "Quota", "estimated_start": None, "estimated_wait_seconds": None}
    assert backlog_place(far) == "Quota (the cap on running scans is reached)"
    assert backlog_place({**far, "wait_reason": "Later"}) == "Later"  # a reason from a newer service
    waits = [backlog_place({**place, "estimated_wait_seconds": s}) for s in (0, 89.4, 90, 5399, 5400, 7200)]
    assert [w.rpartition("about ")[2] for w in waits] == ["0 s", "89 s", "2 min", "90 min", "1.5 h", "2.0 h"]
    for reason in ("Rate", "Outage", "Retry"):
        assert backlog_place({**far, "wait_reason": reason}).startswith(f"{reason} (")


def test_status_shows_the_backlog_row_only_while_the_scan_waits() -> None:
    doc: Status = {
        "scan_state": "PENDING__PRESTARTUP", "is_deleted": False, "wms_deactivated": None,
        "scan_complete": False, "scanner_server_logs": {"url": None}, "wms_workforce": {"workflow_id": "x"},
    }  # fmt: skip

    def rows(d: Status) -> list[str]:
        console = Console(record=True, width=200)
        console.print(tables.status("s1", d))
        return [" ".join(line.split()) for line in console.export_text().splitlines()]

    ended = {**doc, "scan_complete": True, "is_deleted": True, "scanner_server_logs": {"url": "u"}}
    head = ["scan s1", "state PENDING__PRESTARTUP"]
    assert rows({**ended, "backlog": None}) == [  # type: ignore[typeddict-item]
        *head, "complete yes", "deleted yes", "WMS active", "workers 0 running", "logs u"]  # fmt: skip
    waiting = rows({**doc, "backlog": {"position": 1, "wait_reason": "Rate", "estimated_wait_seconds": 5}})
    assert waiting == [
        *head, "complete no", "deleted no", "WMS active", "workers 0 running", "logs -",
        "backlog position 1 · Rate (next to start, at the admission rate) · about 5 s"]  # fmt: skip
    assert rows(doc) == waiting[:-1]
