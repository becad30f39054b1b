"""Sensor events, scan results and startup files, each stored as its own gzip-compressed ConfigMap.

Payloads never live in the Scan (events are 0.1-0.5 MB, final results up to ~0.7 MB, and every
Scan update goes to every watcher). Format, for kubectl users and the operator:

- ConfigMap `skyscan-event-<sensor_event_id>` (label `skyscan.io/payload=event`): the sensor
  event. Immutable, shared by every Scan that uses it (rescans, reuse by `sensor_event_id`); each
  such Scan is one of its ownerReferences, so it is garbage-collected with the last of them. The
  shim writes a new event at the same time as its Scan, annotated `skyscan.io/stored-for` with the
  scan's name (the Scan's uid is not known yet), and the operator makes that Scan its owner when it
  first looks for the event; a reused event gets the new Scan as an owner by one patch. The operator
  starts no scan whose event is missing, and deletes (or, if a Scan refers to it, adopts) any payload
  left without an owner past a grace period.
- ConfigMap `skyscan-result-<scan_id>` (label `skyscan.io/payload=result`): the latest result,
  overwritten on each PUT, owned by its Scan. `is_final` lives in the Scan's `status.result`.
- ConfigMap `skyscan-startup-<scan_id>` (label `skyscan.io/payload=startup`): the scanner's
  `startup.json` as its sidecar uploaded it (byte for byte), owned by its Scan; workers fetch it.
- ConfigMap `skyscan-log-<scan_id>` (label `skyscan.io/payload=log`): the scanner's log as kept once
  its container ended (`skyscan.scanner_log`), in `binaryData["log.txt.gz"]`, owned by its Scan;
  written once by the operator (create: a second writer finds it there), annotated with the Pod it
  came from and its size (`skyscan.io/log-bytes`, `skyscan.io/log-cut-bytes`).
- Data: `binaryData["payload.json.gz"]` = gzip of the UTF-8 JSON payload.
  Read one with `kubectl get cm NAME -o jsonpath='{.binaryData.payload\\.json\\.gz}' | base64 -d | gunzip`.

A payload whose compressed form exceeds `MAX_COMPRESSED_BYTES` (below the API server's 1 MiB
ConfigMap limit) raises `PayloadTooLarge`; callers answer 413 and write nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from skyscan import names
from skyscan.io import kube
from skyscan.io.kube import Kube
from skyscan.io.kube_errors import Conflict, NotFound

DATA_KEY = "payload.json.gz"
LOG_KEY = "log.txt.gz"
LOG_POD_ANNOTATION = "skyscan.io/log-pod"  # the Pod whose container's log it is
LOG_BYTES_ANNOTATION = "skyscan.io/log-bytes"  # the log's size as the container wrote it
LOG_CUT_ANNOTATION = "skyscan.io/log-cut-bytes"  # how many of them were left out
MAX_COMPRESSED_BYTES = 1_000_000


class PayloadTooLarge(ValueError):
    def __init__(self, what: str, size: int) -> None:
        super().__init__(f"{what} is {size} bytes compressed; at most {MAX_COMPRESSED_BYTES} fit")
        self.size = size


def encode(payload: Any, what: str) -> bytes:
    return compress(json.dumps(payload, separators=(",", ":")).encode(), what)


def compress(raw: bytes, what: str) -> bytes:
    """Already-serialized JSON, as stored."""
    data = gzip.compress(raw, compresslevel=6, mtime=0)
    if len(data) > MAX_COMPRESSED_BYTES:
        raise PayloadTooLarge(what, len(data))
    return data


def decode(configmap: dict[str, Any]) -> Any:
    raw = (configmap.get("binaryData") or {})[DATA_KEY]
    return json.loads(gzip.decompress(base64.b64decode(raw)))


def owner_reference(scan: dict[str, Any]) -> dict[str, Any]:
    """A payload's owner: not a controller, since a shared event has many."""
    return names.owner_reference(scan["metadata"]["name"], scan["metadata"]["uid"], controller=False)


def configmap(name: str, kind: str, data: bytes, owners: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {names.PAYLOAD_LABEL: kind, **names.MANAGED_BY},
            "ownerReferences": owners,
        },
        "binaryData": {DATA_KEY: base64.b64encode(data).decode()},
    }


async def encode_async(payload: Any, what: str) -> bytes:
    """Compressing half a megabyte takes milliseconds: keep it off the event loop."""
    return await asyncio.to_thread(encode, payload, what)


async def _read(api: Kube, namespace: str, name: str) -> Any | None:
    raw = await _read_raw(api, namespace, name)
    return None if raw is None else await asyncio.to_thread(json.loads, raw)


async def _read_raw(api: Kube, namespace: str, name: str) -> bytes | None:
    """The stored JSON bytes (uncompressed, not parsed), or None when there is no such object."""
    data = await stored(api, namespace, name)
    return None if data is None else await asyncio.to_thread(gzip.decompress, data)


def _configmap_path(namespace: str, name: str | None = None) -> str:
    return kube.core_path("configmaps", namespace, name)


async def stored(api: Kube, namespace: str, name: str, key: str = DATA_KEY) -> bytes | None:
    """A payload's bytes exactly as stored (gzip), or None when there is no such object."""
    try:
        body = await api.read("GET", _configmap_path(namespace, name))
    except NotFound:
        return None

    def unpack() -> bytes:
        return base64.b64decode((json.loads(body).get("binaryData") or {})[key])

    return await asyncio.to_thread(unpack)


async def create_event(
    api: Kube,
    namespace: str,
    sensor_event_id: str,
    data: bytes,
    owners: Sequence[dict[str, Any]] = (),
    stored_for: str | None = None,
) -> None:
    """Store an encoded event, owned from the start by `owners` (the Scans that use it), or annotated
    with the one Scan it is `stored_for`, which the operator makes its owner."""
    body = configmap(
        names.event_object_name(sensor_event_id), "event", data, [owner_reference(o) for o in owners]
    )
    body["immutable"] = True
    if stored_for is not None:
        body["metadata"]["annotations"] = {names.STORED_FOR_ANNOTATION: stored_for}
    await api.read("POST", _configmap_path(namespace), body=body)  # the answer echoes the payload: unparsed


async def delete_event(api: Kube, namespace: str, sensor_event_id: str) -> None:
    """Delete an event a launch cut short stored (gone already: nothing to do)."""
    with contextlib.suppress(NotFound):  # gone already
        await api.read("DELETE", _configmap_path(namespace, names.event_object_name(sensor_event_id)))


async def event_exists(api: Kube, namespace: str, sensor_event_id: str) -> bool:
    return await event_metadata(api, namespace, sensor_event_id) is not None


async def add_event_owner(api: Kube, namespace: str, sensor_event_id: str, scan: dict[str, Any]) -> None:
    """Make `scan` one more owner of the event (strategic merge on ownerReferences, keyed by uid)."""
    await add_owners(api, namespace, names.event_object_name(sensor_event_id), [owner_reference(scan)])


async def add_owners(
    api: Kube, namespace: str, name: str, owners: list[dict[str, Any]], resource_version: str = ""
) -> None:
    """Add ownerReferences to a payload (strategic merge, keyed by uid); with `resource_version`,
    only if the object has not changed since (else 409)."""
    meta: dict[str, Any] = {"ownerReferences": owners}
    if resource_version:
        meta["resourceVersion"] = resource_version
    await api.request(
        "PATCH",
        _configmap_path(namespace, name),
        body={"metadata": meta},
        content_type=kube.STRATEGIC_MERGE_PATCH,
    )


# Metadata only (no payload bytes): what the operator needs to see whether payloads exist and whom
# they belong to.
_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


async def _get_metadata(
    api: Kube, path: str, accept: str, params: kube.Params | None = None
) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await api.request("GET", path, params=params, accept=accept)
    except NotFound:
        return None
    return found


async def event_metadata(api: Kube, namespace: str, sensor_event_id: str) -> dict[str, Any] | None:
    """The stored event's metadata (owners, resourceVersion), or None when there is none."""
    found = await _get_metadata(
        api, _configmap_path(namespace, names.event_object_name(sensor_event_id)), _METADATA
    )
    return None if found is None else dict(found.get("metadata") or {})


async def list_payload_metadata(
    api: Kube, namespace: str, page_size: int = 500
) -> AsyncIterator[list[dict[str, Any]]]:
    """The metadata of every payload ConfigMap of the namespace, a page at a time."""
    token: str | None = None
    while True:
        params: kube.Params = {"labelSelector": names.PAYLOAD_LABEL, "limit": page_size, "continue": token}
        page = await _get_metadata(api, _configmap_path(namespace), _METADATA_LIST, params) or {}
        yield [dict(item.get("metadata") or {}) for item in page.get("items") or []]
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


async def delete_payload(api: Kube, namespace: str, name: str, resource_version: str) -> None:
    """Delete a payload only if it has not changed since `resource_version` was seen (else 409)."""
    await api.request(
        "DELETE",
        _configmap_path(namespace, name),
        body={"preconditions": {"resourceVersion": resource_version}},
    )


async def read_event(api: Kube, namespace: str, sensor_event_id: str) -> Any | None:
    return await _read(api, namespace, names.event_object_name(sensor_event_id))


async def write_result(api: Kube, namespace: str, scan: dict[str, Any], data: bytes) -> None:
    """Create or overwrite the scan's result object."""
    name = names.result_object_name(scan["metadata"]["name"])
    await _write_owned(api, namespace, scan, name, "result", data)


async def _write_owned(
    api: Kube, namespace: str, scan: dict[str, Any], name: str, kind: str, data: bytes
) -> None:
    body = configmap(name, kind, data, [owner_reference(scan)])
    await api.apply(_configmap_path(namespace, name), body, names.SHIM_MANAGER, parse=False)


async def read_result(api: Kube, namespace: str, scan_id: str) -> Any | None:
    return await _read(api, namespace, names.result_object_name(scan_id))


async def write_startup(api: Kube, namespace: str, scan: dict[str, Any], data: bytes) -> None:
    """Create or overwrite the scan's startup.json object (`data` from `compress`)."""
    name = names.startup_object_name(scan["metadata"]["name"])
    await _write_owned(api, namespace, scan, name, "startup", data)


async def read_startup(api: Kube, namespace: str, scan_id: str) -> bytes | None:
    """The stored startup.json, byte for byte, or None before the sidecar uploaded it."""
    return await _read_raw(api, namespace, names.startup_object_name(scan_id))


async def log_metadata(api: Kube, namespace: str, scan_id: str) -> dict[str, Any] | None:
    """The kept scanner log's metadata (its annotations say whose and how big), or None."""
    found = await _get_metadata(api, _configmap_path(namespace, names.log_object_name(scan_id)), _METADATA)
    return None if found is None else dict(found.get("metadata") or {})


async def create_log(
    api: Kube, namespace: str, scan: dict[str, Any], data: bytes, annotations: dict[str, str]
) -> bool:
    """Keep a scanner's log (`data`: gzip, within `MAX_COMPRESSED_BYTES`), once: False if it was kept
    already (by an earlier run of the operator, say)."""
    body = configmap(names.log_object_name(scan["metadata"]["name"]), "log", b"", [owner_reference(scan)])
    body["binaryData"] = {LOG_KEY: base64.b64encode(data).decode()}
    body["metadata"]["labels"][names.SCAN_ID_LABEL] = scan["metadata"]["name"]
    body["metadata"]["annotations"] = annotations
    body["immutable"] = True
    try:
        await api.read("POST", _configmap_path(namespace), body=body)
    except Conflict:  # AlreadyExists
        return False
    return True


async def stored_log(api: Kube, namespace: str, scan_id: str) -> bytes | None:
    """The kept scanner log as stored (gzip of its text), or None when none was kept."""
    return await stored(api, namespace, names.log_object_name(scan_id), LOG_KEY)
