"""A find filter, checked and parsed once into a typed tree (pure): the MongoDB subset of `POST
/scans/find`. The matcher, the archive's SQL and the index's narrowing read this tree, never the JSON.

Supported, with MongoDB's meaning: implicit equality `{"a.b": v}` (dotted paths descend into objects
and across arrays); `$eq $ne $gt $gte $lt $lte $in $nin $exists $regex $options $all $size $elemMatch
$not`; `$and $or $nor`. Anything else, a wrong operand, a filter beyond `FindLimits`, or one field
named by both its wire names in one document is a `FilterError` before any document is read, so a bad
filter is a 400 even on an empty collection. `$and` is flattened into its document (the same meaning).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api_shim.find.regex import OPTIONS
from api_shim.wire_names import field_name


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class FindLimits:
    """What one `POST /scans/find` may ask for (docs: "Limits of /scans/find")."""

    max_nodes: int = 1_000  # keys, values and array elements in the filter
    max_depth: int = 16  # nesting of objects and arrays in the filter
    max_regex_length: int = 1_000  # characters per pattern
    max_regex_program: int = 1_000  # instructions of one compiled pattern (bounds one search)
    max_work: int = 2_000_000  # documents examined x cost per document
    max_archived: int = 100_000  # archived scans a find may examine (the candidates its SQL selects)


@dataclass(frozen=True)
class Pattern:
    pattern: str
    options: str


# The conditions on the values found at one path.
@dataclass(frozen=True)
class Compare:
    op: str  # $eq $gt $gte $lt $lte; $exists (value: a bool), $size (an int), $regex (a Pattern)
    value: Any


@dataclass(frozen=True)
class In:
    values: tuple[Any, ...]
    patterns: tuple[Pattern, ...]


@dataclass(frozen=True)
class All:
    items: tuple[Compare | ElemMatch, ...]  # $eq or $elemMatch


@dataclass(frozen=True)
class ElemMatch:
    of: Query | tuple[Cond, ...]  # each element as a document, or as a value


@dataclass(frozen=True)
class Not:
    conds: tuple[Cond, ...]  # $ne, $nin and $not: none of these holds (all of them do not)


Cond = Compare | In | All | ElemMatch | Not


@dataclass(frozen=True)
class Field:
    path: tuple[str, ...]
    conds: tuple[Cond, ...]  # all hold


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Query, ...]
    negated: bool  # $nor: none holds


@dataclass(frozen=True)
class Query:
    clauses: tuple[Field | AnyOf, ...]  # all hold

    def patterns(self) -> list[Pattern]:
        """Every pattern, each once, in the order the filter gives them."""
        return list(dict.fromkeys(_patterns(self)))


def _patterns(node: Any) -> list[Pattern]:
    if isinstance(node, Pattern):
        return [node]
    if isinstance(node, tuple):
        return [p for item in node for p in _patterns(item)]
    if hasattr(node, "__dataclass_fields__"):
        return [p for value in vars(node).values() for p in _patterns(value)]
    return []


_NUL = "strings cannot contain NUL (\\u0000)"  # no stored text holds one (PostgreSQL's cannot)
_NEEDS = {  # an operator's refusal of its operand
    "$in": "an array",
    "$nin": "an array",
    "$all": "an array",
    "$exists": "a boolean",
    "$size": "an integer",
    "$elemMatch": "an object",
    "$not": "an operator expression or a regex",
}


def check_shape(query: Any, limits: FindLimits) -> None:
    """Refuse a filter with more nodes or deeper nesting than `limits` allow, or a NUL in a string
    (iterative: this runs before anything recurses)."""
    count, todo = 0, [(query, 1)]
    while todo:
        item, depth = todo.pop()
        count += 1
        if depth > limits.max_depth:
            raise FilterError(f"the filter is nested deeper than {limits.max_depth} levels")
        if count > limits.max_nodes:
            raise FilterError(f"the filter has more than {limits.max_nodes} keys, values and elements")
        if isinstance(item, Mapping):
            if any("\x00" in str(k) for k in item):
                raise FilterError(_NUL)
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, str) and "\x00" in item:
            raise FilterError(_NUL)


def is_operator_doc(cond: Any) -> bool:
    return isinstance(cond, Mapping) and bool(cond) and all(str(k).startswith("$") for k in cond)


def parse(doc: Any, limits: FindLimits | None = None) -> Query:
    """The filter `doc` checked against `limits` and parsed, its field paths in the interface's names."""
    check_shape(doc, limits or FindLimits())
    return _query(doc, renamed=True)


def _query(doc: Any, *, renamed: bool = False) -> Query:
    """A filter document; `renamed`: its paths name manifest fields (not an array element's)."""
    if not isinstance(doc, Mapping):
        raise FilterError("a filter must be an object")
    clauses: list[Field | AnyOf] = []
    given: dict[str, str] = {}  # each path as the filter gave it
    for key, cond in doc.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(cond, list) or not cond or not all(isinstance(c, Mapping) for c in cond):
                raise FilterError(f"{key} needs a non-empty array of filters")
            parts = tuple(_query(c, renamed=renamed) for c in cond)
            if key == "$and":
                clauses += [clause for part in parts for clause in part.clauses]
            else:
                clauses.append(AnyOf(parts, negated=key == "$nor"))
        elif key.startswith("$"):
            raise FilterError(f"unsupported operator: {key}")
        else:
            path = field_name(key) if renamed else key
            if path in given:
                raise FilterError(f"'{given[path]}' and '{key}' name the same field: give one")
            given[path] = key
            clauses.append(Field(tuple(path.split(".")), _condition(cond)))
    return Query(tuple(clauses))


def _condition(cond: Any) -> tuple[Cond, ...]:
    if not is_operator_doc(cond):
        if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
            raise FilterError("cannot mix operators and fields in one condition")
        return (Compare("$eq", cond),)
    if "$options" in cond and "$regex" not in cond:
        raise FilterError("$options needs $regex")
    return tuple(_operator(op, arg, cond) for op, arg in cond.items() if op != "$options")


def _pattern(pattern: Any, options: Any = "") -> Pattern:
    if not isinstance(pattern, str) or not isinstance(options, str):
        raise FilterError("$regex takes a string pattern and string $options")
    if unknown := sorted(set(options) - OPTIONS):
        raise FilterError(f"unsupported $options flag: {unknown[0]!r} (supported: i, m, s, x)")
    return Pattern(pattern, options)


def _operator(op: str, arg: Any, siblings: Mapping[str, Any]) -> Cond:
    match op, arg:
        case (("$eq" | "$gt" | "$gte" | "$lt" | "$lte"), _):
            return Compare(op, arg)
        case "$ne", _:
            return Not((Compare("$eq", arg),))
        case "$exists", bool() | int():
            return Compare(op, bool(arg))
        case "$size", int() if not isinstance(arg, bool):
            return Compare(op, arg)
        case "$regex", _:
            return Compare(op, _pattern(arg, siblings.get("$options", "")))
        case (("$in" | "$nin"), list()):
            values, patterns = [], []
            for a in arg:
                if not is_operator_doc(a):
                    values.append(a)
                elif "$regex" in a and not set(a) - {"$regex", "$options"}:
                    patterns.append(_pattern(a["$regex"], a.get("$options", "")))
                else:
                    raise FilterError(f"{op} takes values and {{$regex, $options}} objects")
            within = In(tuple(values), tuple(patterns))
            return within if op == "$in" else Not((within,))
        case "$all", list():
            return All(tuple(_elem_match(a["$elemMatch"]) if _elem(a) else Compare("$eq", a) for a in arg))
        case "$elemMatch", Mapping():
            return _elem_match(arg)
        case "$not", str():
            return Not((Compare("$regex", _pattern(arg)),))
        case "$not", _ if is_operator_doc(arg):
            return Not(_condition(arg))
    raise FilterError(f"{op} needs {_NEEDS[op]}" if op in _NEEDS else f"unsupported operator: {op}")


def _elem(item: Any) -> bool:
    return is_operator_doc(item) and "$elemMatch" in item


def _elem_match(arg: Any) -> ElemMatch:
    if not isinstance(arg, Mapping):
        raise FilterError("$elemMatch needs an object")
    return ElemMatch(_condition(arg) if is_operator_doc(arg) else _query(arg))
