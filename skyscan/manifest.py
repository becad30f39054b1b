"""The REST manifest of a Scan: a view computed from the object, never stored (pure).

Request fields come from `spec`, scanner-written fields from the shim's status keys, the workflow
from the operator's; deprecated fields are constants. The shim serves it and matches `/scans/find`
against it; the archive stores it beside the archived Scan so history is searched the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyscan import model
from skyscan.scanner_args import scanner_server_args
from skyscan.status import ScanRecord

MANIFEST_FIELDS = (
    "scan_id",
    "timestamp",
    "is_deleted",
    "scanner_server_args",
    "wms_workflow_id",
    "wms_address",
    "wms_task",
    "priority",
    "classifiers",
    "sensor_event_id",
    "event_live_json_dict",
    "event_live_json_dict__hash",
    "event_metadata",
    "scan_metadata",
    "progress",
    "replaced_by_scan_id",
    "last_updated",
)
WMS_TASK_PLACEHOLDER = "use 'wms_workflow_id'"
EVENT_PLACEHOLDER = "use 'sensor_event_id'"

Scan = Mapping[str, Any]


def spec_of(scan: Scan) -> model.ScanSpec:
    return model.ScanSpec.model_validate(scan["spec"], context=model.STORED)



def classifiers(spec: model.ScanSpec) -> dict[str, Any]:
    out = dict(spec.classifiers)
    if spec.rescan_of:
        out.update(rescan=True, origin_scan_id=spec.rescan_of)
    return out



def event_metadata(scan: Scan) -> dict[str, Any] | None:
    """The REST (snake_case) form of the stored event metadata."""
    stored = ScanRecord(scan).event_metadata()
    return model.EventMetadata.model_validate(stored.model_dump()).model_dump() if stored else None



def progress(scan: Scan) -> dict[str, Any] | None:
    stored = ScanRecord(scan).progress
    if not stored:
        return None
    # Optional keys are stored only when set (a merge patch drops nulls); the REST shape has them.
    return {**stored, "start": stored.get("start"), "end": stored.get("end")}



def of(scan: Scan) -> dict[str, Any]:
    record, spec = ScanRecord(scan), spec_of(scan)
    timestamp = record.created_at
    return {
        "scan_id": record.name,
        "timestamp": timestamp,
        "is_deleted": spec.deleted,
        "scanner_server_args": scanner_server_args(spec),
        "wms_workflow_id": record.rest_workflow_id,
        "wms_address": record.wms_address,
        "wms_task": WMS_TASK_PLACEHOLDER,
        "priority": spec.priority,
        "classifiers": classifiers(spec),
        "sensor_event_id": spec.sensor_event_id,
        "event_live_json_dict": EVENT_PLACEHOLDER,
        "event_live_json_dict__hash": None,
        "event_metadata": event_metadata(scan),
        "scan_metadata": record.scan_metadata,
        "progress": progress(scan),
        "replaced_by_scan_id": spec.replaced_by,
        "last_updated": max(timestamp, record.last_updated),
    }

