"""A parsed filter as a predicate over manifests, and its cost (pure).

Values compare as MongoDB compares them: booleans are not numbers, ordering only between numbers or
between strings, an array's elements tested as well as the array, `null` also matching a missing
field. The cost is the work of testing one document, in about equality tests (the work budget's unit).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from api_shim.find import query as q
from api_shim.find.regex import Regex

Predicate = Callable[[Any], bool]
T = TypeVar("T")
Test = Callable[[list[Any]], bool]  # of the values found at a path
Compiled = Mapping[q.Pattern, Regex]
# What a pattern not compiled yet costs: a program of no instructions, the least a pattern costs.
UNCOMPILED = Regex("", 0, lambda text: False)
KINDS = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "text"}  # JSON scalars
_ORDER = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}


@dataclass(frozen=True)
class Filter:
    matches: Predicate
    cost: int  # estimated work per document, in units of about one equality test


def regex_cost(regex: Regex) -> int:
    """A search costs a few equality tests, more for large programs (work grows with the program)."""
    return 4 + regex.program_size // 16


def size(value: Any) -> int:
    """Nodes in a JSON value."""
    if isinstance(value, Mapping):
        return 1 + sum(size(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(size(v) for v in value)
    return 1


def scalar_key(value: Any) -> tuple[str, Any] | None:
    """A hashable key that two scalars share exactly when `same` holds; None for arrays/objects."""
    kind = KINDS.get(type(value))
    return None if kind is None else (kind, value)


def cost(query: q.Query, compiled: Compiled) -> int:
    """The work of testing `query` on one document; a pattern not in `compiled` costs `UNCOMPILED`."""
    return _Tests(compiled).query(query)[1]


def compile_filter(query: q.Query, compiled: Compiled) -> Filter:
    """The predicate of `query` (each of its patterns in `compiled`), and its cost."""
    matches, work = _Tests(compiled).query(query)
    return Filter(matches, max(1, work))


def same(a: Any, b: Any) -> bool:
    """Equality where booleans are not numbers (MongoDB types them apart)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def _values(doc: Any, path: Sequence[str]) -> list[Any]:
    """Every value at `path`, expanding arrays met on the way (MongoDB's implicit traversal)."""
    if not path:
        return [doc]
    head, rest = path[0], path[1:]
    if isinstance(doc, Mapping):
        return _values(doc[head], rest) if head in doc else []
    if isinstance(doc, list):
        found: list[Any] = []
        if head.isdigit() and int(head) < len(doc):
            found += _values(doc[int(head)], rest)
        for item in doc:
            if isinstance(item, Mapping):
                found += _values(item, path)
        return found
    return []


def _some(values: list[Any], test: Callable[[Any], bool]) -> bool:
    """Whether `test` holds for a value or, for an array, one of its elements (MongoDB tests both; no list
    is built: the hot loop)."""
    for v in values:
        if test(v):
            return True
        if isinstance(v, list):
            for item in v:
                if test(item):
                    return True
    return False


def _comparable(a: Any, b: Any) -> bool:
    """Whether MongoDB orders `a` and `b`: numbers (not booleans) or strings, one kind."""
    kind = KINDS.get(type(a))
    return (kind == "number" or kind == "text") and kind == KINDS.get(type(b))


def _every(tests: list[Callable[[Any], bool]]) -> Callable[[Any], bool]:
    if len(tests) == 1:
        return tests[0]

    def every(x: Any) -> bool:  # a loop: `all` over a generator costs twice as much per call
        for test in tests:
            if not test(x):
                return False
        return True

    return every


class _Tests:
    """Each node's test and its cost (work per document), built in one walk over the tree."""

    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled

    def regex(self, pattern: q.Pattern) -> tuple[Callable[[str], Any], int]:
        found = self.compiled.get(pattern, UNCOMPILED)
        return found.search, regex_cost(found)

    def query(self, query: q.Query) -> tuple[Predicate, int]:
        tests, work = _unzip(sorted(map(self.clause, query.clauses), key=lambda tc: tc[1]))  # cheap first
        return (_every(tests) if tests else lambda doc: True), work

    def clause(self, clause: q.Field | q.AnyOf) -> tuple[Predicate, int]:
        if isinstance(clause, q.AnyOf):
            parts, work = _unzip([self.query(p) for p in clause.parts])
            if clause.negated:
                return (lambda doc: not any(p(doc) for p in parts)), work
            return (lambda doc: any(p(doc) for p in parts)), work
        (test, work), path = self.conds(clause.conds), clause.path
        if len(path) > 1:
            return (lambda doc: test(_values(doc, path))), work
        key = path[0]
        # The common case, `_values` for a one-key path inlined.
        return (
            lambda doc: test(([doc[key]] if key in doc else []) if type(doc) is dict else _values(doc, path))
        ), work

    def conds(self, conds: tuple[q.Cond, ...]) -> tuple[Test, int]:
        tests, work = _unzip([self.cond(c) for c in conds])
        return _every(tests), 1 + work

    def cond(self, cond: q.Cond) -> tuple[Test, int]:
        match cond:
            case q.Compare("$eq", target):
                return _equals(target), size(target)
            case q.Compare("$exists", present):
                return (lambda values: bool(values) == present), 1
            case q.Compare("$size", n):
                return (lambda values: any(isinstance(v, list) and len(v) == n for v in values)), 1
            case q.Compare("$regex", pattern):
                search, work = self.regex(pattern)
                return (lambda values: _some(values, lambda c: isinstance(c, str) and search(c))), 1 + work
            case q.Compare(op, arg):
                cmp = _ORDER[op]
                return (lambda values: _some(values, lambda c: _comparable(c, arg) and cmp(c, arg))), 1
            case q.Not(conds):
                inner, work = self.conds(conds)
                return (lambda values: not inner(values)), work
            case q.In():
                return self.within(cond)
            case q.All(items):
                parts, work = _unzip([self.cond(i) for i in items])
                return (lambda values: bool(parts) and all(p(values) for p in parts)), 1 + work
            case q.ElemMatch(q.Query() as query):
                test, work = self.query(query)
                work += 1
            case q.ElemMatch(tuple() as conds):
                inner, work = self.conds(conds)
                test = lambda item: inner([item])  # noqa: E731
        return (lambda values: any(isinstance(v, list) and any(test(i) for i in v) for v in values)), work

    def within(self, cond: q.In) -> tuple[Test, int]:
        """Scalars by hashing (one test whatever their number), arrays and objects by comparison,
        patterns by searching strings; a missing field is null."""
        keys = {k for v in cond.values if (k := scalar_key(v)) is not None}
        others = [v for v in cond.values if scalar_key(v) is None]
        searches = [self.regex(p) for p in cond.patterns]

        def test(c: Any) -> bool:
            key = scalar_key(c)
            if key is not None and key in keys:
                return True
            if isinstance(c, str) and any(search(c) for search, _ in searches):
                return True
            return any(same(c, a) for a in others)

        work = 2 + sum(size(v) for v in others) + sum(c for _, c in searches)
        return (lambda values: _some(values, test) if values else test(None)), work


def _equals(target: Any) -> Test:
    def equal(v: Any) -> bool:
        return v == target and same(v, target)  # `==` first: cheap, implied by `same` (bool is not int)

    return lambda values: _some(values, equal) or (target is None and not values)  # null: also missing


def _unzip(built: list[tuple[T, int]]) -> tuple[list[T], int]:
    """Built (test, cost) pairs as their tests, and their costs' sum."""
    return [test for test, _ in built], sum(work for _, work in built)
