"""Which scans a filter can match at most, from the conditions an index answers (pure).

A document matches a filter only if it satisfies each of the filter's top-level conditions (and those
of a top-level `$and`), so a condition that requires one of a few scalar values at an indexed path
(`{path: v}`, `{path: {"$eq": v}}`, `{path: {"$in": [...]}}`, each value of `{path: {"$all": [...]}}`)
bounds the candidates: every document the filter matches is among the scans the index lists for it.
The compiled filter then tests each candidate, so the answer is exactly the matcher's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api_shim.filters import is_operator_doc, scalar_key


@dataclass(frozen=True)
class Lookup:
    """A matching document has, at `path`, one of `values` or an array with one of them."""

    path: str
    values: tuple[Any, ...]


def _plain(value: Any) -> bool:
    return value is not None and scalar_key(value) is not None


def _condition(path: str, cond: Any) -> list[Lookup]:
    if not is_operator_doc(cond):
        return [Lookup(path, (cond,))] if _plain(cond) else []
    found: list[Lookup] = []
    for op, arg in cond.items():
        if op == "$eq" and _plain(arg):
            found.append(Lookup(path, (arg,)))
        elif op == "$in" and isinstance(arg, list) and all(_plain(a) for a in arg):
            found.append(Lookup(path, tuple(arg)))
        elif op == "$all" and isinstance(arg, list) and all(_plain(a) for a in arg):
            found += [Lookup(path, (a,)) for a in arg]
    return found


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
            found += _condition(key, cond)
    return found
