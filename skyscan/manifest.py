"""The REST manifest of a Scan: its model (`Manifest`, with the scanner's progress report it holds) and
the view computed from the object, never stored (pure).

Request fields come from `spec`, scanner-written fields from the shim's status keys, the workflow
from the operator's; deprecated fields are constants. The shim serves it and matches `/scans/find`
against it; the archive stores it beside the archived Scan so history is searched the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from skyscan import model
from skyscan.model import INTEGER_MAX, INTEGER_MIN, EventMetadata, Integer
from skyscan.scan_record import ScanRecord
from skyscan.scanner_args import scanner_server_args

Threshold = Annotated[float, Field(ge=0, le=1)]


def finite(value: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or Infinity (nor a number beyond a double), so neither may a stored object."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError("must not contain NaN or an infinite number (JSON has neither)")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(finite)]


def within_int64(value: dict[str, Any]) -> dict[str, Any]:
    """A free-form object the Scan holds: the API server keeps an integer as an int64 and would round
    a larger one to a float, silently; refused instead, naming where."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict | list):
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in pairs)
        elif isinstance(item, int) and not isinstance(item, bool) and not INTEGER_MIN <= item <= INTEGER_MAX:
            where = path if len(path) <= 100 else path[:100] + "..."
            raise ValueError(f"integers are at most {INTEGER_MAX} and at least {INTEGER_MIN} (at '{where}')")
    return value


# A free-form object stored in the Scan (the scanner's progress and scan_metadata).
HeldJsonObject = Annotated[dict[str, Any], AfterValidator(finite), AfterValidator(within_int64)]
ClassifiersOut = dict[str, str | bool | int | float | list[str | bool | int | float | None] | None]


class Lenient(BaseModel):
    """Nested scanner-written objects: unknown keys are dropped, as the reference does."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class ProcessingStats(Lenient):
    start: HeldJsonObject
    runtime: HeldJsonObject
    rate: HeldJsonObject = Field(default_factory=dict)
    end: str = ""
    finished: bool = False
    predictions: HeldJsonObject = Field(default_factory=dict)


class Progress(Lenient):
    summary: str
    epilogue: str
    tallies: HeldJsonObject
    processing_stats: ProcessingStats
    predictive_scanning_threshold: Threshold
    last_updated: str
    start: Integer | None = None
    end: Integer | None = None


class Manifest(BaseModel):
    scan_id: str
    timestamp: float
    is_deleted: bool
    scanner_server_args: str
    wms_workflow_id: str | None
    wms_address: str | None
    wms_task: str | JsonObject = Field(json_schema_extra={"deprecated": True})
    priority: int
    classifiers: ClassifiersOut
    sensor_event_id: str
    event_live_json_dict: str | JsonObject = Field(json_schema_extra={"deprecated": True})
    event_live_json_dict__hash: str | None = Field(json_schema_extra={"deprecated": True})
    event_metadata: EventMetadata | None
    scan_metadata: JsonObject | None
    progress: Progress | None
    replaced_by_scan_id: str | None
    last_updated: float


# The one list of the manifest's fields: `of` computes each (a test holds the two alike), the OpenAPI
# document describes them, /scans/find projects and matches them.
MANIFEST_FIELDS = tuple(Manifest.model_fields)
WMS_TASK_PLACEHOLDER = "use 'wms_workflow_id'"
EVENT_PLACEHOLDER = "use 'sensor_event_id'"

Scan = Mapping[str, Any]


def spec_of(scan: Scan) -> model.ScanSpec:
    return ScanRecord(scan).scan_spec()


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
