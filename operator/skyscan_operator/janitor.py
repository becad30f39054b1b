"""The payload janitor (pure): which payload ConfigMaps without an owner to delete, and which to adopt.

The REST shim creates results and startup files already owned by their Scan, and a new sensor event
beside its Scan, which the operator makes its owner within moments. So a payload without an owner past
the grace period is debris (an event whose Scan was never made: a launch cut short; a kubectl-made event
whose Scan never came; one left by `kubectl delete scan --cascade=orphan`), or an event that a Scan uses
and no reconcile has adopted yet. Then debris is deleted and a used payload is adopted by every Scan
that names it (so it goes with the last of them). Each change is made only if the object has not changed
since it was listed (a resourceVersion precondition), and at most `budget` changes per sweep.

Which Scans name a payload is asked of the API server only when a sweep finds an ownerless payload
past the grace period, which is rare: the operator keeps no state for finished scans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from skyscan import conditions as cond
from skyscan import names
from skyscan.scan_record import ScanRecord

Ref = tuple[str, str]  # (namespace, ConfigMap name)


@dataclass(frozen=True)
class Delete:
    name: str
    resource_version: str


@dataclass(frozen=True)
class Adopt:
    name: str
    resource_version: str
    owners: tuple[dict[str, Any], ...]


def referenced(scans: Iterable[Mapping[str, Any]]) -> dict[Ref, list[dict[str, Any]]]:
    """Payload object -> ownerReferences of the Scans naming it: a sensor event by each Scan whose
    `spec.sensorEventId` it is, a result or a startup file by its Scan."""
    refs: dict[Ref, list[dict[str, Any]]] = {}
    for scan in scans:
        meta = scan["metadata"]
        namespace, scan_id = meta["namespace"], meta["name"]
        owner = names.owner_reference(scan_id, meta["uid"], controller=False)
        objects = [names.result_object_name(scan_id), names.startup_object_name(scan_id)]
        if event := ScanRecord(scan).spec.get("sensorEventId"):
            objects.append(names.event_object_name(str(event)))
        for name in objects:
            refs.setdefault((namespace, name), []).append(owner)
    return refs


def ownerless(listed: Iterable[Mapping[str, Any]], *, now: float, grace: float) -> list[Mapping[str, Any]]:
    """Listed payload metadata without an owner, not being deleted, older than `grace`."""
    return [
        meta
        for meta in listed
        if not meta.get("ownerReferences")
        and not meta.get("deletionTimestamp")
        and (created := cond.epoch(meta.get("creationTimestamp"))) is not None
        and now - created >= grace
    ]


def sweep(
    namespace: str,
    listed: Iterable[Mapping[str, Any]],
    refs: Mapping[Ref, list[dict[str, Any]]],
    *,
    now: float,
    grace: float,
    budget: int,
) -> list[Delete | Adopt]:
    """The changes for one page of listed payload metadata: ownerless, not being deleted, older than
    `grace`; at most `budget` of them."""
    changes: list[Delete | Adopt] = []
    for meta in ownerless(listed, now=now, grace=grace)[: max(0, budget)]:
        name, version = str(meta["name"]), str(meta.get("resourceVersion") or "")
        owners = refs.get((namespace, name))
        changes.append(Adopt(name, version, tuple(owners)) if owners else Delete(name, version))
    return changes
