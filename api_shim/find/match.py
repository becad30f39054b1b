"""A parsed filter as a predicate over manifests, and its cost (pure).

Values compare as MongoDB compares them: booleans are not numbers, ordering only between numbers or
between strings, an array's elements tested as well as the array, `null` also matching a missing
field. The cost estimates the work of testing one document, in units of about one equality test, so
a find whose documents x cost exceeds its work budget is refused before it runs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api_shim.find.query import (
    All,
    AnyOf,
    Cond,
    ElemMatch,
    Eq,
    Exists,
    Field,
    In,
    Matches,
    Not,
    Order,
    Pattern,
    Query,
    Size,
)
from api_shim.find.regex import Regex

Predicate = Callable[[Any], bool]
Test = Callable[[list[Any]], bool]  # of the values found at a path
Compiled = Mapping[Pattern, Regex]
# What a pattern not compiled yet costs: a program of no instructions, the least a pattern costs.
UNCOMPILED = Regex("", 0, lambda text: False)
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


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
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return None


def cost(node: Query | Field | AnyOf | Cond, compiled: Compiled) -> int:
    """The work of testing `node` on one document; a pattern not in `compiled` costs `UNCOMPILED`."""

    def regex(pattern: Pattern) -> int:
        return regex_cost(compiled.get(pattern, UNCOMPILED))

    match node:
        case Query(clauses):
            return sum(cost(c, compiled) for c in clauses)
        case AnyOf(parts):
            return sum(cost(p, compiled) for p in parts)
        case Field(_, conds) | Not(conds) | ElemMatch(tuple() as conds):
            return 1 + sum(cost(c, compiled) for c in conds)
        case ElemMatch(Query() as query):
            return 1 + cost(query, compiled)
        case Eq(value):
            return size(value)
        case In(values, patterns):
            others = sum(size(v) for v in values if scalar_key(v) is None)
            return 2 + others + sum(regex(p) for p in patterns)
        case Matches(pattern):
            return 1 + regex(pattern)
        case All(items):
            return 1 + sum(cost(i, compiled) for i in items)
    return 1  # Order, Exists, Size


def compile_filter(query: Query, compiled: Compiled) -> Filter:
    """The predicate of `query` (each of its patterns in `compiled`), and its cost."""
    return Filter(_Tests(compiled).query(query), max(1, cost(query, compiled)))


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


def _candidates(values: list[Any]) -> list[Any]:
    """A value and, for arrays, each of its elements: what operators like $eq/$gt test against."""
    out: list[Any] = []
    for v in values:
        out.append(v)
        if isinstance(v, list):
            out.extend(v)
    return out


def _some(values: list[Any], test: Callable[[Any], bool]) -> bool:
    """Whether `test` holds for one of `_candidates(values)` (without building them: the hot loop)."""
    for v in values:
        if test(v):
            return True
        if isinstance(v, list):
            for item in v:
                if test(item):
                    return True
    return False


def _comparable(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, int | float) and isinstance(b, int | float)) or (
        isinstance(a, str) and isinstance(b, str)
    )


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
    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled

    def query(self, query: Query) -> Predicate:
        costed = sorted(
            ((cost(c, self.compiled), self.clause(c)) for c in query.clauses), key=lambda ct: ct[0]
        )
        return _every([test for _, test in costed]) if costed else lambda doc: True  # cheap tests first

    def clause(self, clause: Field | AnyOf) -> Predicate:
        if isinstance(clause, AnyOf):
            parts = [self.query(p) for p in clause.parts]
            if clause.negated:
                return lambda doc: not any(p(doc) for p in parts)
            return lambda doc: any(p(doc) for p in parts)
        test, path = self.conds(clause.conds), clause.path
        if len(path) > 1:
            return lambda doc: test(_values(doc, path))
        key = path[0]
        # The common case, `_values` for a one-key path inlined.
        return lambda doc: test(
            ([doc[key]] if key in doc else []) if type(doc) is dict else _values(doc, path)
        )

    def conds(self, conds: tuple[Cond, ...]) -> Test:
        return _every([self.cond(c) for c in conds])

    def cond(self, cond: Cond) -> Test:
        match cond:
            case Eq(target):
                return _equals(target)
            case Not(conds):
                inner = self.conds(conds)
                return lambda values: not inner(values)
            case Order(op, arg):
                cmp = _ORDER[op]
                return lambda values: _some(values, lambda c: _comparable(c, arg) and cmp(c, arg))
            case In():
                return self.within(cond)
            case Exists(present):
                return lambda values: bool(values) == present
            case Matches(pattern):
                search = self.compiled[pattern].search
                return lambda values: _some(values, lambda c: isinstance(c, str) and search(c))
            case All(items):
                parts = [self.cond(i) for i in items]
                return lambda values: bool(parts) and all(p(values) for p in parts)
            case Size(n):
                return lambda values: any(isinstance(v, list) and len(v) == n for v in values)
            case ElemMatch(of):
                if isinstance(of, Query):
                    test = self.query(of)
                else:
                    inner = self.conds(of)
                    test = lambda item: inner([item])  # noqa: E731
                return lambda values: any(isinstance(v, list) and any(test(i) for i in v) for v in values)
        raise AssertionError(cond)  # pragma: no cover - the parser makes no other

    def within(self, cond: In) -> Test:
        """Scalars by hashing (one test whatever their number), arrays and objects by comparison,
        patterns by searching strings; a missing field is null."""
        keys = {k for v in cond.values if (k := scalar_key(v)) is not None}
        others = [v for v in cond.values if scalar_key(v) is None]
        searches = [self.compiled[p].search for p in cond.patterns]

        def test(c: Any) -> bool:
            key = scalar_key(c)
            if key is not None and key in keys:
                return True
            if isinstance(c, str) and any(search(c) for search in searches):
                return True
            return any(same(c, a) for a in others)

        return lambda values: any(test(c) for c in _candidates(values) or [None])


def _equals(target: Any) -> Test:
    def equal(values: list[Any]) -> bool:
        # `==` first: cheap, and implied by `same`, which then tells booleans from numbers.
        for v in values:
            if v == target and same(v, target):
                return True
            if isinstance(v, list):
                for item in v:
                    if item == target and same(item, target):
                        return True
        return target is None and not values  # MongoDB: `null` also matches a missing field

    return equal
