"""Every name Skyscan gives to things in the cluster, each defined once: the labels, annotations and
finalizer it sets, and the names of the objects it creates for a scan (deterministic, so every
create is idempotent)."""

from __future__ import annotations

import re
from typing import Any

from skyscan import model

# --- labels
SCAN_ID_LABEL = "skyscan.io/scan-id"  # on every object made for one scan (Job, Secret, Pods)
PAYLOAD_LABEL = "skyscan.io/payload"  # on payload ConfigMaps: "event", "result", "startup" or "log"
MANAGED_BY = {"app.kubernetes.io/managed-by": "skyscan"}
# On every scanner Job and Pod (with the scan's id): what the operator watches and the simulator selects.
SCANNER_LABELS = {"app.kubernetes.io/name": "skyscan", "app.kubernetes.io/component": "scanner"}
SCANNER_SELECTOR = ",".join(f"{k}={v}" for k, v in SCANNER_LABELS.items())

# --- field managers (server-side apply): each component owns the fields it applies, and only those
OPERATOR_MANAGER = "skyscan-operator"
SHIM_MANAGER = "skyscan-shim"
INSTALL_MANAGER = "skyscan-install"  # the CRD and the scanners' ServiceAccount (`skyscan.io.install`)

# --- annotations
TIMESTAMP_ANNOTATION = "skyscan.io/timestamp"  # sub-second creation time (Unix seconds, as a string)
# On a sensor event stored beside its Scan: the scan it was stored for, which the operator makes its owner.
STORED_FOR_ANNOTATION = "skyscan.io/stored-for"

# --- the scanner's identity
SCANNER_SERVICE_ACCOUNT = "skyscan-scanner"  # scanner Pods run as it; it has no RBAC bindings at all
SCANNER_TOKEN_AUDIENCE = "skyscan-scanner"  # the audience of per-scan scanner tokens (the shim alone)
SCANNER_TOKEN_KEY = "token"  # the key of the token in the per-scan Secret

# --- the WMS
WORKFLOW_MARKER_ENV = "SKYSCAN_REQUEST_ID"  # in a workflow's pilot environment: the Scan's uid, to find it by

# --- finalizers
WORKFLOW_FINALIZER = "skyscan.io/wms-workflow"  # present only while the scan may hold a live WMS workflow


# --- object names
# What the API server takes as an object's name (a DNS subdomain): anything else names no scan.
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def is_object_name(name: str) -> bool:
    return _OBJECT_NAME.fullmatch(name) is not None


def job_name(scan_id: str) -> str:
    return f"skyscan-{scan_id}"


def wms_secret_name(scan_id: str) -> str:
    return f"skyscan-{scan_id}-ewms"


def container_name(scan_id: str) -> str:
    return f"skyscan-server-{scan_id}"[:63].rstrip("-")


def scanner_token_secret_name(scan_id: str) -> str:
    """The per-scan Secret holding the scanner's token, which is bound to this Secret."""
    return f"skyscan-{scan_id}-scanner"


def scan_id_of_scanner_secret(name: str) -> str | None:
    """The inverse of `scanner_token_secret_name` (None for any other name)."""
    prefix, suffix = "skyscan-", "-scanner"
    if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix) + len(suffix):
        return name[len(prefix) : -len(suffix)]
    return None


def startup_object_name(scan_id: str) -> str:
    return f"skyscan-startup-{scan_id}"


def event_object_name(sensor_event_id: str) -> str:
    return f"skyscan-event-{sensor_event_id}"


def result_object_name(scan_id: str) -> str:
    return f"skyscan-result-{scan_id}"


def log_object_name(scan_id: str) -> str:
    """The scanner's log, kept once its container ended (`skyscan.scanner_log`)."""
    return f"skyscan-log-{scan_id}"


def scan_id_of(obj: dict[str, Any]) -> str | None:
    """The scan an object was made for, from its label."""
    return (obj["metadata"].get("labels") or {}).get(SCAN_ID_LABEL)


def owner_reference(scan_id: str, uid: str, *, controller: bool = True) -> dict[str, Any]:
    """An ownerReference to a Scan. The controller owns what it made (Job, Secret, result); a shared
    sensor event has every scan using it as a non-controller owner."""
    ref: dict[str, Any] = {"apiVersion": model.API_VERSION, "kind": model.KIND, "name": scan_id, "uid": uid}
    if controller:
        ref.update(controller=True, blockOwnerDeletion=True)
    return ref
