"""The reference service's wire names beside the interface's (pure).

IceCube's own clients (the skymap_scanner server, the reference's scanner init container and its
request scripts) send and read the names the reference service used; the interface renamed some of
them. Both are accepted on input everywhere; an answer speaks one dialect, the caller's: the
interface's unless the route is one of the reference's own paths (`/scan/{id}/ewms/...`,
`/scan/{id}/i3-event`) or the caller's credential says otherwise (scanner credentials by the shim's
`scanner_names` setting, a static token or an OIDC issuer by its `names`). An answer never holds both
names of a field: the event would be sent twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices

from skyscan.manifest import EVENT_PLACEHOLDER, WMS_TASK_PLACEHOLDER


class Names(StrEnum):
    INTERFACE = "interface"
    REFERENCE = "reference"


# interface name -> the reference's, wherever either appears (request bodies, manifests, find filters
# and projections, status, workflow-id, results, the event route); no interface name is a reference
# name of another field, so one table serves every document.
REFERENCE: Mapping[str, str] = {
    "sensor_event_id": "i3_event_id",
    "event_live_json": "event_i3live_json",
    "event_live_json_dict": "event_i3live_json_dict",
    "event_live_json_dict__hash": "event_i3live_json_dict__hash",
    "wms_workflow_id": "ewms_workflow_id",
    "wms_address": "ewms_address",
    "wms_task": "ewms_task",
    "requested_wms_workflow": "requested_ewms_workflow",
    "eligible_for_wms": "eligible_for_ewms",
    "wms_deactivated": "ewms_deactivated",
    "wms_workforce": "ewms_workforce",
    "scan_result": "skyscan_result",
    "sensor_event": "i3_event",
}
INTERFACE: Mapping[str, str] = {reference: name for name, reference in REFERENCE.items()}
# The deprecated fields' placeholders name the field to use, so they follow the dialect too.
PLACEHOLDERS: Mapping[tuple[str, Any], str] = {
    ("wms_task", WMS_TASK_PLACEHOLDER): "use 'ewms_workflow_id'",
    ("event_live_json_dict", EVENT_PLACEHOLDER): "use 'i3_event_id'",
}
# The reference's paths below /scan/{scan_id} for the interface's.
REFERENCE_PATHS: Mapping[str, str] = {
    "/wms/workflow-id": "/ewms/workflow-id",
    "/wms/workforce": "/ewms/workforce",
    "/wms/taskforces": "/ewms/taskforces",
    "/sensor-event": "/i3-event",
}


def alias(name: str) -> AliasChoices:
    """A request field's names: the interface's, then the reference's (both given: refused as extra)."""
    return AliasChoices(name, REFERENCE[name])


def spoken(doc: dict[str, Any], names: Names) -> dict[str, Any]:
    """`doc` (interface names) with its top-level names in `names`, in the same order."""
    if names is Names.INTERFACE:
        return doc
    return {
        REFERENCE.get(key, key): PLACEHOLDERS.get((key, value), value) if isinstance(value, str) else value
        for key, value in doc.items()
    }


def spoken_scan(manifest: dict[str, Any], result: dict[str, Any], names: Names) -> dict[str, Any]:
    """GET and DELETE /scan/{id}: the manifest and the result, each in `names`."""
    return {"manifest": spoken(manifest, names), "result": spoken(result, names)}


def field_name(name: str) -> str:
    """A field (or dotted path into one) in the interface's name."""
    head, dot, rest = name.partition(".")
    return INTERFACE.get(head, head) + dot + rest


def field_names(names: Iterable[str]) -> list[str]:
    return [field_name(n) for n in names]
