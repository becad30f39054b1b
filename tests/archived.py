"""Finished Scans as the operator archives them, built without a cluster (for archive tests)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from skyscan import manifest, model, scan_record
from skyscan.io import payloads
from skyscan.io.archive import ArchivedScan

SPEC = {
    "dockerTag": "4.1.0", "recoAlgo": "millipede_wilks", "nsides": {"8": 0}, "realOrSimulatedEvent": "real",
    "maxPixelRecoTime": 600, "requestClusters": [{"location": "osg", "nWorkers": 1}],
}  # fmt: skip
EVENT = {"run_id": 123, "event_id": 456, "event_type": "neutrino", "mjd": 60000.5, "is_real_event": True}


def scan_object(
    namespace: str = "skyscan",
    name: str | None = None,
    *,
    resource_version: int = 100,
    event: dict[str, Any] | None = EVENT,
    **spec: Any,
) -> dict[str, Any]:
    """A finished Scan as the API server returns it (with the noise `compact` drops)."""
    now = time.time()
    name = name or model.new_scan_id(now, secrets.token_hex(10))
    spec = {**SPEC, "sensorEventId": f"ev-{name}", **spec}
    st: dict[str, Any] = {
        "lastUpdated": now,
        "result": {"isFinal": True},
        "workflow": {"id": "wf-1", "deactivated": "FINISHED"},
    }
    if event:
        st["eventMetadata"] = {
            "runId": event["run_id"], "eventId": event["event_id"], "eventType": event["event_type"],
            "mjd": event["mjd"], "isRealEvent": event["is_real_event"],
        }  # fmt: skip
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": secrets.token_hex(8),
            "resourceVersion": str(resource_version),
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "managedFields": [{"manager": "skyscan-shim"}],
        },
        "spec": spec,
        "status": st,
    }


def record(
    scan: dict[str, Any],
    *,
    event_payload: Any = None,
    result: Any = None,
    archived_at: float | None = None,
) -> ArchivedScan:
    """The ArchivedScan the operator would put for `scan`, with gzip payloads as the cluster holds them."""
    return ArchivedScan(
        scan=scan_record.compact(scan),
        manifest=manifest.of(scan),
        event=payloads.encode(event_payload or {"event": scan["spec"]["sensorEventId"]}, "event"),
        result=payloads.encode(result, "result") if result is not None else None,
        archived_at=archived_at or time.time(),
    )
