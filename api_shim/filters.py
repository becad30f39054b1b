"""A MongoDB-style filter subset, evaluated in memory over manifests (`POST /scans/find`).

Supported, with MongoDB's meaning:
- implicit equality `{"a.b": v}`: dotted paths descend into objects and across arrays; a field
  equals v if its value equals v or, when it is an array, if v is one of its elements (or the
  whole array equals v); `{"a": {...}}` without operators compares whole objects;
- comparison `$eq $ne $gt $gte $lt $lte $in $nin` (ordering only between numbers or between
  strings; booleans are not numbers);
- `$exists`, `$regex` (+ `$options` i m s x), `$all`, `$size`, `$elemMatch`, `$not`;
- logical `$and $or $nor` (lists of filters).
Anything else (an unknown `$operator`, a wrong operand type) raises `FilterError` before any
document is read, so a bad filter is a 400 even on an empty collection.

The filter is compiled once into a predicate; evaluating it is a pure function of the document.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Predicate = Callable[[Any], bool]
_MISSING = object()


class FilterError(ValueError):
    pass


def _same(a: Any, b: Any) -> bool:
    """Equality where booleans are not numbers (MongoDB types them apart)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
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


def _comparable(a: Any, b: Any) -> bool:
    number = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, number) and isinstance(b, number)) or (isinstance(a, str) and isinstance(b, str))


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}
_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


def _regex(pattern: Any, options: Any = "") -> re.Pattern[str]:
    if not isinstance(pattern, str) or not isinstance(options, str):
        raise FilterError("$regex takes a string pattern and string $options")
    flags = 0
    for letter in options:
        if letter not in _FLAGS:
            raise FilterError(f"unsupported $options flag: {letter!r}")
        flags |= _FLAGS[letter]
    try:
        return re.compile(pattern, flags)
    except re.error as e:
        raise FilterError(f"invalid $regex: {e}") from None


def _is_operator_doc(cond: Any) -> bool:
    return isinstance(cond, Mapping) and bool(cond) and all(str(k).startswith("$") for k in cond)


def _equals(target: Any) -> Callable[[list[Any]], bool]:
    # MongoDB: `null` also matches a missing field.
    return lambda values: (
        (target is None and not values) or any(_same(c, target) for c in _candidates(values))
    )


def _operator(op: str, arg: Any, siblings: Mapping[str, Any]) -> Callable[[list[Any]], bool]:
    """One operator applied to the values found at a path."""
    if op == "$eq":
        return _equals(arg)
    if op == "$ne":
        eq = _equals(arg)
        return lambda values: not eq(values)
    if op in _ORDER:
        cmp = _ORDER[op]
        return lambda values: any(_comparable(c, arg) and cmp(c, arg) for c in _candidates(values))
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise FilterError(f"{op} needs an array")
        tests = [_regex(a["$regex"], a.get("$options", "")) if _is_operator_doc(a) else None for a in arg]

        def within(values: list[Any]) -> bool:
            cands = _candidates(values) or ([None] if op == "$in" else [])
            return any(
                (t.search(c) is not None if isinstance(c, str) else False) if t else _same(c, a)
                for c in cands
                for a, t in zip(arg, tests, strict=True)
            )

        if op == "$in":
            return within
        return lambda values: not within(values)
    if op == "$exists":
        if not isinstance(arg, bool | int):
            raise FilterError("$exists needs a boolean")
        return lambda values: bool(values) == bool(arg)
    if op == "$regex":
        pattern = _regex(arg, siblings.get("$options", ""))
        return lambda values: any(
            isinstance(c, str) and pattern.search(c) is not None for c in _candidates(values)
        )
    if op == "$options":
        if "$regex" not in siblings:
            raise FilterError("$options needs $regex")
        return lambda values: True
    if op == "$all":
        if not isinstance(arg, list):
            raise FilterError("$all needs an array")
        parts = [
            _elem_match(a["$elemMatch"]) if _is_operator_doc(a) and "$elemMatch" in a else _equals(a)
            for a in arg
        ]
        return lambda values: bool(arg) and all(p(values) for p in parts)
    if op == "$size":
        if isinstance(arg, bool) or not isinstance(arg, int):
            raise FilterError("$size needs an integer")
        return lambda values: any(isinstance(v, list) and len(v) == arg for v in values)
    if op == "$elemMatch":
        return _elem_match(arg)
    if op == "$not":
        if isinstance(arg, str):
            inner = _operator("$regex", arg, {})
        elif _is_operator_doc(arg):
            inner = _condition(arg)
        else:
            raise FilterError("$not needs an operator expression or a regex")
        return lambda values: not inner(values)
    raise FilterError(f"unsupported operator: {op}")


def _elem_match(arg: Any) -> Callable[[list[Any]], bool]:
    if not isinstance(arg, Mapping):
        raise FilterError("$elemMatch needs an object")
    test: Predicate
    if _is_operator_doc(arg):
        cond = _condition(arg)
        test = lambda item: cond([item])  # noqa: E731
    else:
        test = compile_filter(arg)
    return lambda values: any(isinstance(v, list) and any(test(item) for item in v) for v in values)


def _condition(cond: Any) -> Callable[[list[Any]], bool]:
    if not _is_operator_doc(cond):
        if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
            raise FilterError("cannot mix operators and fields in one condition")
        return _equals(cond)
    tests = [_operator(op, arg, cond) for op, arg in cond.items()]
    return lambda values: all(t(values) for t in tests)


def _logical(op: str, arg: Any) -> Predicate:
    if not isinstance(arg, list) or not arg or not all(isinstance(a, Mapping) for a in arg):
        raise FilterError(f"{op} needs a non-empty array of filters")
    parts = [compile_filter(a) for a in arg]
    if op == "$and":
        return lambda doc: all(p(doc) for p in parts)
    if op == "$or":
        return lambda doc: any(p(doc) for p in parts)
    return lambda doc: not any(p(doc) for p in parts)


def _at_path(path: list[str], test: Callable[[list[Any]], bool]) -> Predicate:
    return lambda doc: test(_values(doc, path))


def compile_filter(query: Mapping[str, Any]) -> Predicate:
    if not isinstance(query, Mapping):
        raise FilterError("a filter must be an object")
    tests: list[Predicate] = []
    for key, cond in query.items():
        if key in ("$and", "$or", "$nor"):
            tests.append(_logical(key, cond))
        elif key.startswith("$"):
            raise FilterError(f"unsupported operator: {key}")
        else:
            tests.append(_at_path(key.split("."), _condition(cond)))
    return lambda doc: all(t(doc) for t in tests)
