"""REST views of a Scan custom resource (pure functions over the API server's JSON).

The manifest is computed, never stored: request fields come from `spec`, scanner-written fields
from the shim's status keys, the workflow from the operator's. Deprecated fields are constants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from skyscan.state import NOT_YET_REQUESTED, SCAN_HAS_FINAL_RESULT, has_requested_workflow, scan_state
from skyscan_operator.scanner_job import nside_order, scanner_server_args

TIMESTAMP_ANNOTATION = "skyscan.io/timestamp"  # sub-second creation time (Unix seconds, as a string)

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
FIND_DISALLOWED = frozenset({"wms_task", "event_live_json_dict", "event_live_json_dict__hash"})
WMS_TASK_PLACEHOLDER = "use 'wms_workflow_id'"
EVENT_PLACEHOLDER = "use 'sensor_event_id'"

Scan = Mapping[str, Any]


def _status(scan: Scan) -> Mapping[str, Any]:
    return scan.get("status") or {}


def _workflow(scan: Scan) -> Mapping[str, Any]:
    return _status(scan).get("workflow") or {}


def scan_id(scan: Scan) -> str:
    return str(scan["metadata"]["name"])


def created_at(scan: Scan) -> float:
    meta = scan["metadata"]
    stamp = (meta.get("annotations") or {}).get(TIMESTAMP_ANNOTATION)
    if stamp:
        try:
            return float(stamp)
        except ValueError:
            pass
    created = meta.get("creationTimestamp")
    if not created:
        return 0.0
    return datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()


def classifiers(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(spec.get("classifiers") or {})
    if spec.get("rescanOf"):
        out.update(rescan=True, origin_scan_id=spec["rescanOf"])
    return out


def event_metadata(status: Mapping[str, Any]) -> dict[str, Any] | None:
    em = status.get("eventMetadata")
    if not em:
        return None
    return {
        "run_id": em["runId"],
        "event_id": em["eventId"],
        "event_type": em["eventType"],
        "mjd": em["mjd"],
        "is_real_event": em["isRealEvent"],
    }


def progress(status: Mapping[str, Any]) -> dict[str, Any] | None:
    stored = status.get("progress")
    if not stored:
        return None
    # Optional keys are stored only when set (a merge patch drops nulls); the REST shape has them.
    return {**stored, "start": stored.get("start"), "end": stored.get("end")}


def worker_outcomes(scan: Scan) -> list[Mapping[str, Any]]:
    return list(_status(scan).get("workerRequests") or [])


def workflow_id(scan: Scan) -> str:
    return str(_workflow(scan).get("id") or NOT_YET_REQUESTED)


def has_final_result(scan: Scan) -> bool:
    return bool((_status(scan).get("result") or {}).get("isFinal"))


def is_deleted(scan: Scan) -> bool:
    return bool(scan["spec"].get("deleted"))


def manifest(scan: Scan) -> dict[str, Any]:
    spec, status = scan["spec"], _status(scan)
    timestamp = created_at(scan)
    return {
        "scan_id": scan_id(scan),
        "timestamp": timestamp,
        "is_deleted": is_deleted(scan),
        "scanner_server_args": scanner_server_args(spec),
        "wms_workflow_id": workflow_id(scan),
        "wms_address": _workflow(scan).get("address"),
        "wms_task": WMS_TASK_PLACEHOLDER,
        "priority": spec.get("priority", 0),
        "classifiers": classifiers(spec),
        "sensor_event_id": spec["sensorEventId"],
        "event_live_json_dict": EVENT_PLACEHOLDER,
        "event_live_json_dict__hash": None,
        "event_metadata": event_metadata(status),
        "scan_metadata": status.get("scanMetadata"),
        "progress": progress(status),
        "replaced_by_scan_id": spec.get("replacedBy"),
        "last_updated": max(timestamp, float(status.get("lastUpdated") or 0.0)),
    }


def project(doc: Mapping[str, Any], fields: Iterable[str] | None) -> dict[str, Any]:
    """Keep only `fields` (unknown names ignored); None keeps everything."""
    if fields is None:
        return dict(doc)
    wanted = set(fields)
    return {k: v for k, v in doc.items() if k in wanted}


def pipe_projection(projection: str | None) -> set[str] | None:
    """GET manifest's `projection`: `*` (or absent) is everything, else pipe-delimited names."""
    if projection is None or projection.strip() == "*":
        return None
    return {p.strip() for p in projection.split("|")}


def body_projection(projection: str | list[str]) -> set[str] | None:
    if projection == "*" or "*" in projection:
        return None
    return set(projection)


def find_projection(projection: str | list[str]) -> set[str]:
    """`*`, `["*"]` and lists holding `*` mean every allowed field; naming a disallowed one is an error
    (raised by the caller, which gets the offending names back as the set difference)."""
    if projection == "*":
        return set(MANIFEST_FIELDS) - FIND_DISALLOWED
    asked = set(projection)
    if "*" in asked:
        return (set(MANIFEST_FIELDS) - FIND_DISALLOWED) | (asked - {"*"})
    return asked


def scan_request(scan: Scan, rescan_ids: list[str]) -> dict[str, Any]:
    spec = scan["spec"]
    return {
        "scan_id": scan_id(scan),
        "rescan_ids": rescan_ids,
        "docker_tag": spec["dockerTag"],
        "scanner_server_memory_bytes": spec["scannerServerMemoryBytes"],
        "reco_algo": spec["recoAlgo"],
        "nsides": dict(sorted(spec["nsides"].items(), key=nside_order)),
        "real_or_simulated_event": spec["realOrSimulatedEvent"],
        "predictive_scanning_threshold": float(spec.get("predictiveScanningThreshold", 1.0)),
        "classifiers": dict(spec.get("classifiers") or {}),
        "request_clusters": [[c["location"], c["nWorkers"]] for c in spec["requestClusters"]],
        "worker_memory_bytes": spec["workerMemoryBytes"],
        "worker_disk_bytes": spec["workerDiskBytes"],
        "max_pixel_reco_time": spec["maxPixelRecoTime"],
        "priority": spec.get("priority", 0),
        "debug_mode": list(spec.get("debugMode") or []),
        "sensor_event_id": spec["sensorEventId"],
        "scanner_server_env_from_user": dict(spec.get("scannerServerEnvFromUser") or {}),
    }


def logs_url(scan: Scan, template: str | None, namespace: str) -> str | None:
    return template.format(scan_id=scan_id(scan), namespace=namespace) if template else None


def workforce(scan: Scan) -> dict[str, Any]:
    wf = _status(scan).get("workforce") or {}
    return {
        "workflow_id": workflow_id(scan),
        "statuses": wf.get("statuses") or {},
        "n_running": wf.get("nRunning", 0),
        "top_errors": wf.get("topErrors") or {},
    }


def state(scan: Scan) -> str:
    status = _status(scan)
    return scan_state(
        has_final_result=has_final_result(scan),
        workflow_id=_workflow(scan).get("id"),
        progress=status.get("progress"),
        deactivated=_workflow(scan).get("deactivated"),
    )


def scan_status(scan: Scan, logs: str | None) -> dict[str, Any]:
    current = state(scan)
    return {
        "scan_state": current,
        "is_deleted": is_deleted(scan),
        "wms_deactivated": _workflow(scan).get("deactivated"),
        "scan_complete": current == SCAN_HAS_FINAL_RESULT,
        "scanner_server_logs": {"url": logs},
        "wms_workforce": workforce(scan),
    }


def workflow_id_view(scan: Scan) -> dict[str, Any]:
    current = workflow_id(scan)
    return {
        "workflow_id": current,
        "requested_wms_workflow": has_requested_workflow(current),
        "eligible_for_wms": True,
        "wms_address": _workflow(scan).get("address"),
    }


def backlog_entry(scan: Scan) -> dict[str, Any] | None:
    backlog = _status(scan).get("backlog")
    if not backlog:
        return None
    return {
        "scan_id": scan_id(scan),
        "timestamp": float(backlog["enteredAt"]),
        "pickled_k8s_job": None,
        "priority": backlog.get("priority", 0),
        "pending_timestamp": float(backlog.get("pendingSince", 0.0)),
        "next_attempt": backlog.get("attempts", 0),
    }
