"""Scans by the values at the paths most finds name: `event_metadata.run_id`, `event_metadata.event_id`
and `classifiers.<key>`. The cache keeps it as Scans change, so a find naming one of them reads only the
scans that can match (`api_shim.narrowing` picks the conditions; the filter still decides each one).

A Scan is indexed by the values its manifest (`skyscan.manifest.of`) has at those paths, read from the
object without building the manifest, keyed as the matcher compares them (`filters.scalar_key`: 1 and
1.0 are one key, True is not 1). An array is indexed by each of its elements too, as equality tests
them. Only non-null scalars are indexed: a null condition also matches a missing field, which an
index of values cannot list.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from api_shim.filters import scalar_key
from skyscan import manifest

RUN_ID = "event_metadata.run_id"
EVENT_ID = "event_metadata.event_id"
CLASSIFIER = "classifiers."
_EVENT_KEYS = ((RUN_ID, "runId", "run_id"), (EVENT_ID, "eventId", "event_id"))

Entry = tuple[str, tuple[str, Any]]  # (path, scalar key)


def indexed(path: str) -> bool:
    """Whether the index lists scans by their value at `path`."""
    if path.startswith(CLASSIFIER):
        return len(path) > len(CLASSIFIER) and "." not in path[len(CLASSIFIER) :]
    return path in (RUN_ID, EVENT_ID)


def _keys(value: Any) -> list[tuple[str, Any]]:
    found = [value, *value] if isinstance(value, list) else [value]
    return [key for v in found if v is not None and (key := scalar_key(v)) is not None]


def _event_values(scan: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's run and event ids, from the stored camelCase metadata; a value that is not a plain
    number there (the manifest's model would convert it) is read through the manifest's own code."""
    stored = (scan.get("status") or {}).get("eventMetadata")
    if not stored or not isinstance(stored, Mapping):
        return {}
    raw = {path: stored.get(camel) for path, camel, _ in _EVENT_KEYS}
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw.values()):
        return raw
    try:
        converted = manifest.event_metadata(scan) or {}
    except ValueError:  # not valid metadata: the manifest cannot be built, nothing can match
        return {}
    return {path: converted.get(snake) for path, _, snake in _EVENT_KEYS}


def _classifiers(scan: Mapping[str, Any]) -> dict[str, Any]:
    """`manifest.classifiers` over the stored spec: the request's, plus a rescan's own."""
    spec = scan.get("spec") or {}
    found = dict(spec.get("classifiers") or {})
    if spec.get("rescanOf"):
        found.update(rescan=True, origin_scan_id=spec["rescanOf"])
    return found


def entries(scan: Mapping[str, Any]) -> list[Entry]:
    """What the index holds for one Scan (pure)."""
    values = {**_event_values(scan), **{CLASSIFIER + k: v for k, v in _classifiers(scan).items()}}
    return [(sys.intern(path), key) for path, value in values.items() for key in _keys(value)]


class FindIndex:
    def __init__(self) -> None:
        self._names: dict[Entry, set[str]] = {}
        self._entries: dict[str, list[Entry]] = {}

    def put(self, name: str, scan: Mapping[str, Any]) -> None:
        """Index (the new version of) a Scan."""
        self.discard(name)
        found = entries(scan)
        if found:
            self._entries[name] = found
            for entry in found:
                self._names.setdefault(entry, set()).add(name)

    def discard(self, name: str) -> None:
        for entry in self._entries.pop(name, ()):
            names = self._names[entry]
            names.discard(name)
            if not names:
                del self._names[entry]

    def names(self, path: str, values: Iterable[Any]) -> set[str]:
        """The scans whose value at `path` (an `indexed` one) is, or has as an element, one of `values`
        (non-null scalars)."""
        found: set[str] = set()
        for value in values:
            key = scalar_key(value)
            if key is not None:
                found |= self._names.get((path, key), set())
        return found
