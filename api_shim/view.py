"""REST views of a Scan custom resource (pure functions over the API server's JSON).

The manifest itself is `skyscan.manifest`; these are the other REST shapes and projections.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from api_shim.wire_names import field_names
from skyscan import conditions as cond
from skyscan import manifest, model
from skyscan.manifest import MANIFEST_FIELDS, spec_of
from skyscan.scan_record import ScanRecord
from skyscan.scanner_args import sorted_nsides
from skyscan.state import SCAN_HAS_FINAL_RESULT, has_requested_workflow

FIND_DISALLOWED = frozenset({"wms_task", "event_live_json_dict", "event_live_json_dict__hash"})
Scan = Mapping[str, Any]


def scan_id(scan: Scan) -> str:
    return ScanRecord(scan).name


def worker_outcomes(scan: Scan) -> list[model.WorkerRequestOutcome]:
    return ScanRecord(scan).worker_requests()


def workflow_id(scan: Scan) -> str:
    return ScanRecord(scan).rest_workflow_id


def has_final_result(scan: Scan) -> bool:
    return ScanRecord(scan).has_final_result


def is_deleted(scan: Scan) -> bool:
    return ScanRecord(scan).deleted


def project(doc: Mapping[str, Any], fields: Iterable[str] | None) -> dict[str, Any]:
    """Keep only `fields` (unknown names ignored); None keeps everything."""
    if fields is None:
        return dict(doc)
    wanted = set(fields)
    return {k: v for k, v in doc.items() if k in wanted}


def pipe_projection(projection: str | None) -> set[str] | None:
    """GET manifest's `projection`: `*` (or absent) is everything, else pipe-delimited names (either
    wire name of a field: the projection is in the interface's)."""
    if projection is None or projection.strip() == "*":
        return None
    return set(field_names(p.strip() for p in projection.split("|")))


def body_projection(projection: str | list[str]) -> set[str] | None:
    if projection == "*" or "*" in projection:
        return None
    return set(field_names(projection))


def find_projection(projection: str | list[str]) -> set[str]:
    """`*`, `["*"]` and lists holding `*` mean every allowed field; naming a disallowed one is an error
    (raised by the caller, which gets the offending names back as the set difference)."""
    if projection == "*":
        return set(MANIFEST_FIELDS) - FIND_DISALLOWED
    asked = set(field_names(projection))
    if "*" in asked:
        return (set(MANIFEST_FIELDS) - FIND_DISALLOWED) | (asked - {"*"})
    return asked


def scan_request(scan: Scan, rescan_ids: list[str]) -> dict[str, Any]:
    spec = spec_of(scan)
    return {
        "scan_id": scan_id(scan),
        "rescan_ids": rescan_ids,
        "docker_tag": spec.docker_tag,
        "scanner_server_memory_bytes": spec.scanner_server_memory_bytes,
        "reco_algo": spec.reco_algo,
        "nsides": dict(sorted_nsides(spec.nsides)),
        "real_or_simulated_event": spec.real_or_simulated_event.value,
        "predictive_scanning_threshold": spec.predictive_scanning_threshold,
        "classifiers": dict(spec.classifiers),
        "request_clusters": [[c.location, c.n_workers] for c in spec.request_clusters],
        "worker_memory_bytes": spec.worker_memory_bytes,
        "worker_disk_bytes": spec.worker_disk_bytes,
        "max_pixel_reco_time": spec.max_pixel_reco_time,
        "priority": spec.priority,
        "debug_mode": [m.value for m in spec.debug_mode],
        "sensor_event_id": spec.sensor_event_id,
        "scanner_server_env_from_user": dict(spec.scanner_server_env_from_user),
    }


SCANNER_LOG_PATH = "/scan/{scan_id}/logs/scanner-server"


def logs_url(scan: Scan, template: str | None, namespace: str) -> str | None:
    """Where the scanner server's log is read: the deployment's template, else the shim's own route
    (a path on this service) once the scan's scanner Pod exists; null before."""
    if template:
        return template.format(scan_id=scan_id(scan), namespace=namespace)
    return SCANNER_LOG_PATH.format(scan_id=scan_id(scan)) if ScanRecord(scan).scanner_pod else None


def workforce(scan: Scan) -> dict[str, Any]:
    record = ScanRecord(scan)
    wf = record.workforce() or model.Workforce()
    return {"workflow_id": record.rest_workflow_id, **wf.model_dump(mode="json")}


def state(scan: Scan) -> str:
    return ScanRecord(scan).scan_state


TABLE_FIELDS = ("scan_id", "timestamp", "is_deleted", "priority", "classifiers", "event_metadata", "progress")


def table_row(scan: Scan) -> dict[str, Any]:
    """A scan as the dashboard's table shows it: the manifest's `TABLE_FIELDS` and the scan's state."""
    return {**project(manifest.of(scan), TABLE_FIELDS), "scan_state": state(scan)}


def in_states(scan: Scan, states: frozenset[str]) -> bool:
    """Whether the scan's state is one of `states`, each a whole state or either half of one
    (`ABORTED`, `PENDING`, `WAITING_ON_FIRST_PIXEL_RECO`...); no states: any."""
    if not states:
        return True
    current = state(scan)
    return current in states or bool(set(current.split("__")) & states)


def scan_status(scan: Scan, logs: str | None, now: float | None = None) -> dict[str, Any]:
    record = ScanRecord(scan)
    current = record.scan_state
    return {
        "scan_state": current,
        "is_deleted": record.deleted,
        "wms_deactivated": record.deactivated,
        "scan_complete": current == SCAN_HAS_FINAL_RESULT,
        "scanner_server_logs": {"url": logs},
        "wms_workforce": workforce(scan),
        "backlog": backlog_place(scan, time.time() if now is None else now),
    }


def backlog_place(scan: Scan, now: float) -> dict[str, Any] | None:
    """Where a waiting scan stands, as the operator wrote it (its position among the first shown
    only), and its estimated wait from then on; null unless it waits."""
    backlog = ScanRecord(scan).backlog()
    if backlog is None or backlog.wait_reason is None:
        return None
    start = backlog.estimated_start
    return {
        "position": backlog.position,
        "wait_reason": backlog.wait_reason,
        "estimated_start": start,
        "estimated_wait_seconds": None if start is None else max(0.0, start - now),
    }


def workflow_id_view(scan: Scan) -> dict[str, Any]:
    current = workflow_id(scan)
    return {
        "workflow_id": current,
        "requested_wms_workflow": has_requested_workflow(current),
        "eligible_for_wms": True,
        "wms_address": ScanRecord(scan).wms_address,
    }


def backlog_entry(scan: Scan) -> dict[str, Any] | None:
    record = ScanRecord(scan)
    backlog = record.backlog()
    return None if backlog is None else _backlog_entry(record, backlog, None)


def _backlog_entry(record: ScanRecord, backlog: model.BacklogStatus, position: int | None) -> dict[str, Any]:
    return {
        "scan_id": record.name,
        "timestamp": backlog.entered_at,
        "pickled_k8s_job": None,
        "priority": record.priority,
        "pending_timestamp": backlog.pending_since,
        "next_attempt": backlog.attempts,
        "position": position,
    }


def backlog_entries(scans: Iterable[Scan]) -> list[dict[str, Any]]:
    """The backlog in admission order, as the operator admits (priority, then age, then id): first
    the scans in a start attempt (admitted, their Job not yet created), without a position; then
    the waiting ones, numbered from 1. One sort per call."""
    ranked = []
    for scan in scans:
        record = ScanRecord(scan)
        if (backlog := record.backlog()) is not None:
            waiting = not record.condition_true(cond.ADMITTED)
            ranked.append(((waiting, -record.priority, backlog.entered_at, record.name), record, backlog))
    ranked.sort(key=lambda r: r[0])
    entries, position = [], 0
    for (waiting, *_), record, backlog in ranked:
        position += waiting
        entries.append(_backlog_entry(record, backlog, position if waiting else None))
    return entries
