"""Scans by the values at the paths most finds name: `event_metadata.run_id`, `event_metadata.event_id`
and `classifiers.<key>`, kept by the cache as Scans change, so a find naming one reads only the scans
that can match (`lookups`; the filter still decides each one). Values are keyed as the matcher compares
them (1 and 1.0 are one key, True is not 1), an array's elements too; only non-null scalars (a null
condition also matches a missing field, which no index of values lists). The scans' names in id order,
and which are soft-deleted, let a find the index answers alone (`exact`) list its matches in order
without reading a manifest.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from api_shim.find.match import scalar_key
from api_shim.find.query import All, Compare, Cond, Field, In, Query
from skyscan import manifest
from skyscan.scan_record import ScanRecord

RUN_ID = "event_metadata.run_id"
EVENT_ID = "event_metadata.event_id"
CLASSIFIER = "classifiers."
DELETED = "is_deleted"


def indexed(path: str) -> bool:
    """Whether the index lists scans by their value at `path`."""
    if path.startswith(CLASSIFIER):
        return len(path) > len(CLASSIFIER) and "." not in path[len(CLASSIFIER) :]
    return path in (RUN_ID, EVENT_ID)


def _add(found: list[tuple[str, Any]], path: str, value: Any) -> None:
    if isinstance(value, str | int | float):  # booleans too; not null
        found.append((path, value))
    elif isinstance(value, list):
        found += [(path, v) for v in value if isinstance(v, str | int | float)]


def entries(scan: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(path, value) for each non-null scalar the Scan's manifest has at an indexed path, or has in an
    array there (pure), read without building the manifest: run and event ids from the stored metadata
    (through the manifest's code when not plain numbers there), classifiers with a rescan's own."""
    found: list[tuple[str, Any]] = []
    record = ScanRecord(scan)
    stored = record.status.get("eventMetadata")
    if stored and isinstance(stored, dict):
        run, event = stored.get("runId"), stored.get("eventId")
        if not {type(run), type(event)} <= {int, float}:
            try:
                converted = manifest.event_metadata(scan) or {}
            except ValueError:  # not valid metadata: the manifest cannot be built, nothing can match
                converted = {}
            run, event = converted.get("run_id"), converted.get("event_id")
        _add(found, RUN_ID, run)
        _add(found, EVENT_ID, event)
    classifiers = record.classifiers
    if record.rescan_of:
        classifiers.update(rescan=True, origin_scan_id=record.rescan_of)
    for key, value in classifiers.items():
        _add(found, CLASSIFIER + key, value)
    return found


class FindIndex:
    def __init__(self) -> None:
        # (path, is a boolean) -> value -> its scans: one as its name, more as a set (booleans apart:
        # True == 1 in a dict, not in the matcher)
        self._buckets: dict[tuple[str, bool], dict[Any, str | set[str]]] = {}
        # Each bucket's key, one object that every scan's entries share: 10,000 scans hold 50,000 entries,
        # so a (path, is a boolean) pair made per entry (and its path string) would cost ~7 MiB of RSS.
        self._keys: dict[tuple[str, bool], tuple[str, bool]] = {}
        # name -> (key, value, key, value, ...): flat, with no tuple per entry
        self._held: dict[str, tuple[Any, ...]] = {}
        self._order: list[str] = []  # every scan indexed, in id (= name) order
        self._deleted: set[str] = set()  # those soft-deleted

    def put(self, name: str, scan: Mapping[str, Any]) -> None:
        """Index (the new version of) a Scan."""
        self._unlist(name)
        held: list[Any] = []
        for path, value in entries(scan):
            key = (path, type(value) is bool)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = {}
                self._keys[key] = key
            else:
                key = self._keys[key]
            held += (key, value)
            names = bucket.get(value)
            if names is None:
                bucket[value] = name
            elif isinstance(names, set):
                names.add(name)
            elif names != name:
                bucket[value] = {names, name}
        if held:
            self._held[name] = tuple(held)
        at = bisect.bisect_left(self._order, name)
        if at == len(self._order) or self._order[at] != name:
            self._order.insert(at, name)  # a new scan: its id is the latest, so this is an append
        if ScanRecord(scan).deleted:
            self._deleted.add(name)
        else:
            self._deleted.discard(name)

    def discard(self, name: str) -> None:
        """Forget a Scan (gone from the cache)."""
        self._unlist(name)
        at = bisect.bisect_left(self._order, name)
        if at < len(self._order) and self._order[at] == name:
            del self._order[at]
        self._deleted.discard(name)

    def _unlist(self, name: str) -> None:
        held = self._held.pop(name, ())
        for key, value in zip(held[::2], held[1::2], strict=True):
            bucket = self._buckets[key]
            names = bucket.get(value)
            if isinstance(names, set):
                names.discard(name)
                if len(names) == 1:
                    bucket[value] = next(iter(names))
            elif names == name:
                del bucket[value]
                if not bucket:
                    del self._buckets[key]
                    del self._keys[key]

    def names(self, path: str, values: Iterable[Any]) -> set[str]:
        """The scans whose value at `path` (an `indexed` one) is, or has as an element, one of `values`
        (non-null scalars)."""
        found: set[str] = set()
        for value in values:
            bucket = self._buckets.get((path, type(value) is bool))
            names = bucket.get(value) if bucket is not None and value is not None else None
            if isinstance(names, set):
                found |= names
            elif names is not None:
                found.add(names)
        return found

    def among(self, lookups: Iterable[tuple[str, Iterable[Any]]]) -> set[str] | None:
        """The scans listed for every (path, values) of `lookups`, a new set; None: any scan."""
        keep: set[str] | None = None
        for path, values in lookups:
            names = self.names(path, values)
            keep = names if keep is None else keep & names
        return keep

    def selected(
        self, lookups: Iterable[tuple[str, Iterable[Any]]], deleted: Collection[bool]
    ) -> tuple[set[str] | None, set[str] | None]:
        """The scans `among` the lookups whose soft deletion is one of `deleted`, as new sets: (those kept,
        None for all; those left out, None for none)."""
        keep, drop = self.among(lookups), None
        if not deleted:
            keep = set()
        elif False not in deleted:
            keep = set(self._deleted) if keep is None else keep & self._deleted
        elif True not in deleted and self._deleted:
            if keep is None:
                drop = set(self._deleted)
            else:
                keep -= self._deleted
        return keep, drop

    def in_order(self) -> list[str]:
        """The name of every scan indexed, in id order (a copy)."""
        return list(self._order)


class Lookup(NamedTuple):
    """A matching document has, at `path`, one of `values` or an array with one of them: `{path: v}`,
    `$eq`, `$in` or each value of `$all` (non-null scalars) bound a find to the scans listed for them."""

    path: str
    values: tuple[Any, ...]


def _plain(value: Any) -> bool:
    return value is not None and scalar_key(value) is not None


def _equalities(conds: tuple[Cond, ...]) -> tuple[list[tuple[Any, ...]], bool]:
    """The values `conds` require, each as alternatives, and whether that is all they ask (an empty
    `$all` matches nothing: it is not)."""
    found: list[tuple[Any, ...]] = []
    complete = True
    for cond in conds:
        match cond:
            case Compare("$eq", value) if _plain(value):
                found.append((value,))
            case In(values, ()) if all(_plain(v) for v in values):
                found.append(values)
            case All(items) if all(isinstance(i, Compare) and _plain(i.value) for i in items):
                found += [(i.value,) for i in items if isinstance(i, Compare)]
                complete = False
            case _:
                complete = False
    return found, complete


def lookups(query: Query) -> list[Lookup]:
    """The clauses of `query` that bound its matches over indexed paths."""
    found: list[Lookup] = []
    for clause in query.clauses:
        if isinstance(clause, Field) and indexed(path := ".".join(clause.path)):
            found += [Lookup(path, values) for values in _equalities(clause.conds)[0]]
    return found


@dataclass(frozen=True)
class Exact:
    """A filter the index answers: the scans that satisfy every lookup and whose `is_deleted` is one of
    `deleted` (both: any; neither: none)."""

    lookups: list[Lookup]
    deleted: frozenset[bool]


def exact(query: Query) -> Exact | None:
    """The lookups that are all of `query`, when they are (equalities on indexed paths and on
    `is_deleted`, the manifest's boolean): its matches are the scans they select; else None."""
    deleted = frozenset((False, True))
    for clause in query.clauses:
        if not isinstance(clause, Field) or not ((path := ".".join(clause.path)) == DELETED or indexed(path)):
            return None
        equalities, complete = _equalities(clause.conds)
        if not complete:
            return None
        if path == DELETED:  # a boolean field: True and False only (1 is not True)
            for values in equalities:
                deleted &= frozenset(v for v in values if isinstance(v, bool))
    return Exact(lookups(query), deleted)
