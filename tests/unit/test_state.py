from __future__ import annotations

from typing import Any

import pytest

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
