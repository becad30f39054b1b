from __future__ import annotations

from typing import Any

import pytest

from api_shim import view
from api_shim.handlers.events import ended
from skyscan.scan_record import ScanRecord
from skyscan.state import NOT_YET_REQUESTED, scan_state

STARTED = {"processing_stats": {"start": {}, "runtime": {}, "rate": {}}}
RATED = {"processing_stats": {"start": {}, "runtime": {}, "rate": {"a": 1.0}}}


@pytest.mark.parametrize(
    ("final", "wf", "progress", "deactivated", "expected"),
    [
        (False, NOT_YET_REQUESTED, None, None, "PENDING__PRESTARTUP"),
        (False, None, None, None, "PENDING__PRESTARTUP"),
        (False, "WF-1", None, None, "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"),
        (False, "WF-1", STARTED, None, "IN_PROGRESS__WAITING_ON_FIRST_PIXEL_RECO"),
        (False, "WF-1", RATED, None, "IN_PROGRESS__PARTIAL_RESULT_GENERATED"),
        (False, "WF-1", RATED, "ABORTED", "ABORTED__PARTIAL_RESULT_GENERATED"),
        (False, "WF-1", None, "FINISHED", "FINISHED__WAITING_ON_SCANNER_SERVER_STARTUP"),
        (False, "WF-1", STARTED, "aborted", "ABORTED__WAITING_ON_FIRST_PIXEL_RECO"),
        (True, "WF-1", RATED, "ABORTED", "SCAN_HAS_FINAL_RESULT"),
        (True, NOT_YET_REQUESTED, None, None, "SCAN_HAS_FINAL_RESULT"),
    ],
)
def test_scan_state(
    final: bool, wf: str | None, progress: dict[str, Any] | None, deactivated: str | None, expected: str
) -> None:
    assert (
        scan_state(has_final_result=final, workflow_id=wf, progress=progress, deactivated=deactivated)
        == expected
    )


def failed_scan(**status: Any) -> dict[str, Any]:
    """A Scan the operator failed before it got a workflow (its sensor event never stored)."""
    failed = {"type": "Failed", "status": "True", "reason": "EventMissing", "message": "no event",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    return {
        "metadata": {"name": "s1", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {},
        "status": {"conditions": [failed], **status},
    }


@pytest.mark.parametrize(
    ("wf", "progress", "deactivated", "expected"),
    [
        (None, None, None, "ABORTED__PRESTARTUP"),
        ("WF-1", None, None, "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP"),
        ("WF-1", RATED, None, "ABORTED__PARTIAL_RESULT_GENERATED"),
        ("WF-1", STARTED, "FINISHED", "FINISHED__WAITING_ON_FIRST_PIXEL_RECO"),  # the WMS's word wins
    ],
)
def test_a_failed_scan_reads_as_aborted_not_pending(
    wf: str | None, progress: dict[str, Any] | None, deactivated: str | None, expected: str
) -> None:
    state = scan_state(
        has_final_result=False, workflow_id=wf, progress=progress, deactivated=deactivated, failed=True
    )
    assert state == expected


def test_a_failed_scan_with_a_final_result_still_has_its_final_result() -> None:
    assert (
        scan_state(has_final_result=True, workflow_id=None, progress=None, deactivated=None, failed=True)
        == "SCAN_HAS_FINAL_RESULT"
    )


def test_a_scan_failed_for_a_missing_event_is_terminal_and_aborted_on_rest() -> None:
    scan = failed_scan()
    record = ScanRecord(scan)
    assert record.scan_state == "ABORTED__PRESTARTUP"
    assert record.is_terminal
    assert ended(scan)  # its SSE stream ends
    status = view.scan_status(scan, None)
    assert status["scan_state"] == "ABORTED__PRESTARTUP" and status["scan_complete"] is False


def test_a_soft_deleted_pending_scan_stays_prestartup_as_the_reference_has_it() -> None:
    scan = {"metadata": {"name": "s1"}, "spec": {"deleted": True}, "status": {}}
    assert ScanRecord(scan).scan_state == "PENDING__PRESTARTUP"
