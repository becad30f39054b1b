"""Which scans a filter can match at most, from the conditions an index answers (pure).

A document matches a filter only if it satisfies each of the filter's top-level conditions (and those
of a top-level `$and`), so a condition that requires one of a few scalar values at an indexed path
(`{path: v}`, `{path: {"$eq": v}}`, `{path: {"$in": [...]}}`, each value of `{path: {"$all": [...]}}`)
bounds the candidates: every document the filter matches is among the scans the index lists for it.
The compiled filter then tests each candidate, so the answer is exactly the matcher's.

A filter made only of such equalities (`{path: v}`, `$eq`, `$in` of scalars, over indexed paths), with
`is_deleted` compared to booleans and top-level `$and`s of the same, is answered by the index alone
(`exact`): its candidates are its matches, and no manifest need be read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api_shim.filters import is_operator_doc, scalar_key

DELETED = "is_deleted"


@dataclass(frozen=True)
class Lookup:
    """A matching document has, at `path`, one of `values` or an array with one of them."""

    path: str
    values: tuple[Any, ...]


def _plain(value: Any) -> bool:
    return value is not None and scalar_key(value) is not None


def _condition(cond: Any) -> tuple[list[tuple[Any, ...]], bool]:
    """The values a condition requires, each as alternatives (the value, or an element of it, is one of
    them), and whether that is all it asks (an empty `$all` matches nothing: it is not)."""
    if not is_operator_doc(cond):
        return ([(cond,)], True) if _plain(cond) else ([], False)
    found: list[tuple[Any, ...]] = []
    complete = True
    for op, arg in cond.items():
        if op == "$eq" and _plain(arg):
            found.append((arg,))
        elif op == "$in" and isinstance(arg, list) and all(_plain(a) for a in arg):
            found.append(tuple(arg))
        elif op == "$all" and isinstance(arg, list) and all(_plain(a) for a in arg):
            found += [(a,) for a in arg]
            complete = False
        else:
            complete = False
    return found, complete


def lookups(query: Mapping[str, Any], indexed: Callable[[str], bool]) -> list[Lookup]:
    """The conditions of a shape-checked filter that bound its matches over `indexed` paths. It may be
    invalid still (it is compiled after, within a budget these bounds set): a malformed part, which the
    compiler refuses, bounds nothing."""
    found: list[Lookup] = []
    for key, cond in query.items():
        if key == "$and" and isinstance(cond, list):
            for part in cond:
                found += lookups(part, indexed) if isinstance(part, Mapping) else []
        elif not key.startswith("$") and indexed(key):
            found += [Lookup(key, values) for values in _condition(cond)[0]]
    return found


@dataclass(frozen=True)
class Exact:
    """A filter the index answers: the scans that satisfy every lookup and whose `is_deleted` is one of
    `deleted` (both: any; neither: none)."""

    lookups: list[Lookup]
    deleted: frozenset[bool]


def exact(query: Mapping[str, Any], indexed: Callable[[str], bool]) -> Exact | None:
    """The lookups that are all of a compiled (valid) filter, when they are: its matches are then the
    scans they select, `is_deleted` aside (the manifest's, a boolean); None when the filter asks more."""
    found: list[Lookup] = []
    deleted = frozenset((False, True))
    parts: list[Any] = [query]
    while parts:
        part = parts.pop()
        if not isinstance(part, Mapping):
            return None
        for key, cond in part.items():
            if key == "$and" and isinstance(cond, list):
                parts += cond
                continue
            if key.startswith("$") or not (key == DELETED or indexed(key)):
                return None
            equalities, complete = _condition(cond)
            if not complete:
                return None
            if key != DELETED:
                found += [Lookup(key, values) for values in equalities]
                continue
            for values in equalities:  # a boolean field: True and False only (1 is not True)
                deleted &= frozenset(v for v in values if isinstance(v, bool))
    return Exact(found, deleted)
