"""The REST `scan_state`, computed from what a Scan records (reference behaviour, §2 of the notes).

A final result wins over everything; otherwise the stage comes from whether a WMS workflow exists
and what progress the scanner reported, prefixed by the WMS deactivation (ABORTED/FINISHED). A scan
the operator failed (`Failed=True`) without a WMS deactivation to show, e.g. one that never got a
workflow (its sensor event missing, its start attempts used up), is ABORTED too: the reference lists
`ABORTED__PRESTARTUP`, and a failed scan must not read as pending forever. Neither the soft-delete
flag nor the Job's state takes part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOT_YET_REQUESTED = "not-yet-requested"  # the manifest's wms_workflow_id before a workflow exists

SCAN_HAS_FINAL_RESULT = "SCAN_HAS_FINAL_RESULT"
PARTIAL_RESULT_GENERATED = "PARTIAL_RESULT_GENERATED"
WAITING_ON_FIRST_PIXEL_RECO = "WAITING_ON_FIRST_PIXEL_RECO"
WAITING_ON_SCANNER_SERVER_STARTUP = "WAITING_ON_SCANNER_SERVER_STARTUP"
PRESTARTUP = "PRESTARTUP"


def has_requested_workflow(workflow_id: str | None) -> bool:
    return workflow_id not in (None, "", NOT_YET_REQUESTED)


def workers_refusal(
    *, deleted: bool, has_final_result: bool, workflow_id: str | None, deactivated: str | None
) -> str | None:
    """Why a scan in this state takes no more workers (add-workers' 422, the reference's three rules
    and an ended workflow), else None. A workflow takes them whether its queues are active or not."""
    if deleted:
        return "this scan has been deleted--cannot add workers"
    if not has_requested_workflow(workflow_id):
        return "a WMS workflow has not been assigned--cannot add workers"
    if has_final_result:
        return "this scan has a final result--cannot add workers"
    if deactivated:
        return f"its WMS workflow is {deactivated.lower()}--cannot add workers"
    return None


def scan_state(
    *,
    has_final_result: bool,
    workflow_id: str | None,
    progress: Mapping[str, Any] | None,
    deactivated: str | None,
    failed: bool = False,
) -> str:
    if has_final_result:
        return SCAN_HAS_FINAL_RESULT
    if not has_requested_workflow(workflow_id):
        prefix, stage = "PENDING", PRESTARTUP
    elif not progress:
        prefix, stage = "PENDING", WAITING_ON_SCANNER_SERVER_STARTUP
    elif (progress.get("processing_stats") or {}).get("rate"):
        prefix, stage = "IN_PROGRESS", PARTIAL_RESULT_GENERATED
    else:
        prefix, stage = "IN_PROGRESS", WAITING_ON_FIRST_PIXEL_RECO
    if deactivated and has_requested_workflow(workflow_id):
        prefix = deactivated.upper()
    elif failed:
        prefix = "ABORTED"
    return f"{prefix}__{stage}"
