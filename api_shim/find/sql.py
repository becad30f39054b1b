"""The archive's part of `POST /scans/find`: a parsed filter as a SQL condition over the archive's `scans`
table (`skyscan.io.archive`, schema v1), which selects the candidates the compiled filter then tests (pure).

The condition is SOUND: it never excludes a row whose manifest the matcher accepts. Exact, on indexed
columns: the run and event ids, `timestamp` (`created_at`), `last_updated`, `is_deleted` and `scan_id`
with the matcher's types (booleans are not numbers, no ordering across types, strings in code point
order); `classifiers.<key>` equality as containment (`@>`, the GIN index: a value or an array holding
it) and `$exists`; `classifiers` as a whole; `$and $or $nor $ne $nin $not` over exact parts. Other
paths get a lax jsonpath over `manifest` for equality with a scalar, number ranges and `$exists: true`:
a superset of the matches, never negated. Anything else (`$regex`, `$size`, `$elemMatch`, array
indexes in paths, numbers beyond 2**53 in jsonb, ...) is TRUE: every row stays a candidate.

It relies on the columns holding the manifest's values (`skyscan.io.archive.columns`): an id is an
integer or NULL, timestamps are numbers, `is_deleted` a boolean.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api_shim.find.index import CLASSIFIER, EVENT_ID, RUN_ID
from api_shim.find.match import KINDS, scalar_key
from api_shim.find.query import All, AnyOf, Compare, Cond, Field, In, Not, Query

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
SAFE_NUMBER = 2**53  # below it a number's JSON text orders and equals as the number does (see `_safe`)
_SQL_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
P = "\x00"  # a parameter's place in a condition's text, numbered once the final text is known


@dataclass(frozen=True)
class Sql:
    """A condition; `exact` when it holds for a row exactly when the matcher accepts its manifest
    (otherwise it holds at least then). It may evaluate to NULL where it does not hold. `params`: the
    values of its `P` marks, in order (a part that folds to TRUE or FALSE drops its own with its text)."""

    text: str
    exact: bool
    params: tuple[Any, ...] = ()


TRUE = Sql("TRUE", True)
FALSE = Sql("FALSE", True)
UNTRANSLATED = Sql("TRUE", False)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "bigint", "float8", "boolean" or "text": the manifest's type at the path
    nullable: bool  # the manifest may lack the value


COLUMNS = {
    RUN_ID: Column("run_id", "bigint", True),
    EVENT_ID: Column("event_id", "bigint", True),
    "timestamp": Column("created_at", "float8", False),
    "last_updated": Column("last_updated", "float8", False),
    "is_deleted": Column("is_deleted", "boolean", False),
    "scan_id": Column("scan_id", "text", False),
}


def _infinite(value: Any) -> bool:
    """NaN or an infinity (JSON bodies may spell them): SQL orders and equals them otherwise."""
    return isinstance(value, float) and not math.isfinite(value)


def _safe(value: Any) -> bool:
    """Whether jsonb compares `value` as the matcher does. jsonb holds a float as its shortest decimal
    text; below 2**53 no other float or integer lies between a float and that text, above it one can."""
    if KINDS.get(type(value)) == "number":
        return not _infinite(value) and abs(value) < SAFE_NUMBER
    if isinstance(value, list):
        return all(_safe(v) for v in value)
    if isinstance(value, Mapping):
        return all(_safe(v) for v in value.values())
    return True


def _join(op: Literal["AND", "OR"], parts: Sequence[Sql]) -> Sql:
    """`parts` joined by AND or OR, constants folded: a part equal to the operator's absorbing constant
    (FALSE for AND, TRUE for OR) decides the whole, one equal to its identity drops out."""
    identity, absorbing = ("TRUE", "FALSE") if op == "AND" else ("FALSE", "TRUE")
    kept = [p for p in parts if p.text != identity]
    exact = all(p.exact for p in parts)
    if any(p.text == absorbing for p in kept):
        return Sql(absorbing, exact)
    if not kept:
        return Sql(identity, exact)
    text = kept[0].text if len(kept) == 1 else f" {op} ".join(f"({p.text})" for p in kept)
    return Sql(text, exact, tuple(itertools.chain.from_iterable(p.params for p in kept)))


def _not(part: Sql) -> Sql:
    if not part.exact:
        return UNTRANSLATED
    if part.text in ("TRUE", "FALSE"):
        return FALSE if part.text == "TRUE" else TRUE
    return Sql(f"({part.text}) IS NOT TRUE", True, part.params)  # NULL (no value) counts as not holding


def _filter(query: Query) -> Sql:
    return _join("AND", [_clause(c) for c in query.clauses])


def _clause(clause: Field | AnyOf) -> Sql:
    if isinstance(clause, AnyOf):
        any_of = _join("OR", [_filter(p) for p in clause.parts])
        return _not(any_of) if clause.negated else any_of
    return _conds(".".join(clause.path), clause.conds)


def _conds(path: str, conds: tuple[Cond, ...]) -> Sql:
    return _join("AND", [_cond(path, c) for c in conds])


def _cond(path: str, cond: Cond) -> Sql:
    match cond:
        case Compare(op, value) if op == "$eq" or op == "$exists" or op in _SQL_ORDER:
            return _test(path, op, value)
        case Not(conds):
            return _not(_conds(path, conds))
        case In(values, patterns):
            return _join("OR", [*(_test(path, "$eq", v) for v in values), *(UNTRANSLATED for _ in patterns)])
        case All(()):
            return FALSE  # an empty $all matches nothing
        case All(items) if all(isinstance(i, Compare) for i in items):
            return _join("AND", [_test(path, "$eq", i.value) for i in items if isinstance(i, Compare)])
    return UNTRANSLATED  # $regex, $size, $elemMatch, $all of $elemMatch


def _test(path: str, op: str, value: Any) -> Sql:
    """`op` ($eq, $exists or an order) with `value` on `path`, by the kind of path."""
    if path in COLUMNS:
        return _column(COLUMNS[path], op, value)
    if path == "classifiers":  # always an object
        if op == "$exists":
            return TRUE if value else FALSE
        if op != "$eq" or not _safe(value):
            return UNTRANSLATED
        return Sql(f"classifiers = {P}::jsonb", True, (dict(value),)) if isinstance(value, Mapping) else FALSE
    key = path.removeprefix(CLASSIFIER)
    if path.startswith(CLASSIFIER) and "." not in key:  # any JSON value under a key of `classifiers`
        if op == "$exists":
            return Sql(f"{'' if value else 'NOT '}classifiers ? {P}::text", True, (key,))
        if op == "$eq":
            return _contains(key, value)
    return _manifest(tuple(path.split(".")), op, value)


def _column(col: Column, op: str, value: Any) -> Sql:
    name, kind = col.name, KINDS.get(type(value))
    if op == "$exists":
        if col.nullable:
            return Sql(f"{name} IS {'NOT ' if value else ''}NULL", True)
        return TRUE if value else FALSE
    if op == "$eq" and value is None:
        return Sql(f"{name} IS NULL", True) if col.nullable else FALSE
    if op == "$eq" and kind == col.kind == "boolean":
        return Sql(name if value else f"NOT {name}", True)
    if kind == col.kind == "text":
        text = f"{name} = {P}::text" if op == "$eq" else f'{name} COLLATE "C" {_SQL_ORDER[op]} {P}::text'
        return Sql(text, True, (value,))
    if kind != "number" or col.kind not in ("bigint", "float8"):
        return FALSE  # another type, an array or an object: never equal to this column's scalar, nor ordered
    if _infinite(value) or (col.kind == "float8" and isinstance(value, int) and abs(value) >= SAFE_NUMBER):
        return UNTRANSLATED  # not one float: compared exactly by Python, rounded by SQL
    if col.kind == "float8":
        return Sql(f"{name} {_SQL_ORDER.get(op, '=')} {P}::float8", True, (float(value),))
    if op == "$eq" and not (value == int(value) and BIGINT_MIN <= value <= BIGINT_MAX):
        return FALSE  # an id is an integer
    if value != int(value):  # a fraction: the integer bound it implies
        op, value = ("$gt", math.floor(value)) if op in ("$gt", "$gte") else ("$lt", math.ceil(value))
    bound = int(value)
    if not BIGINT_MIN <= bound <= BIGINT_MAX:  # every id is on one side of it
        above = bound < BIGINT_MIN  # (an $eq is in range here)
        return Sql(f"{name} IS NOT NULL", True) if above == (op in ("$gt", "$gte")) else FALSE
    return Sql(f"{name} {_SQL_ORDER.get(op, '=')} {P}::bigint", True, (bound,))


def _contains(key: str, value: Any) -> Sql:
    """`classifiers.<key>` equal to `value`: the value itself or an array holding it, by containment
    (which does not look into nested arrays, nor does the matcher)."""
    if not _safe(value) or scalar_key(value) is None:
        return UNTRANSLATED  # an array or object: containment is not equality
    equal = f"classifiers @> {P}::jsonb OR classifiers @> {P}::jsonb"
    params: tuple[Any, ...] = ({key: value}, {key: [value]})
    if value is None:  # null also matches a missing key
        equal, params = f"{equal} OR NOT classifiers ? {P}::text", (*params, key)
    return Sql(equal, True, params)


def _manifest(path: tuple[str, ...], op: str, value: Any) -> Sql:
    """Any other path: a lax jsonpath over the manifest (arrays on the way and at the end unwrapped, as
    the matcher does, and nested ones too), so a superset of the matches; an array index: untranslated."""
    if any(key.isdigit() for key in path):
        return UNTRANSLATED
    if op == "$exists":
        predicate, value = ("" if value else None), None
    elif op == "$eq":
        predicate = " ? (@ == $v)" if value is not None and scalar_key(value) is not None else None
    else:  # jsonpath orders strings by another rule than code points
        predicate = f" ? (@ {_SQL_ORDER[op]} $v)" if KINDS.get(type(value)) == "number" else None
    if predicate is None or not _safe(value):
        return UNTRANSLATED
    jsonpath = "lax $" + "".join("." + json.dumps(key) for key in path) + predicate
    return Sql(
        f"jsonb_path_exists(manifest, {P}::text::jsonpath, {P}::jsonb, true)", False, (jsonpath, {"v": value})
    )


def translate(query: Query, first_param: int = 1) -> tuple[Sql, list[Any]]:
    """The condition for a (checked) filter, and its parameters numbered from `first_param`."""
    where, numbers = _filter(query), itertools.count(first_param)
    return Sql(re.sub(P, lambda _: f"${next(numbers)}", where.text), where.exact), list(where.params)


def queries(where: str, first_param: int) -> tuple[str, str]:
    """(how many candidates, at most a limit given as parameter `first_param`; the candidates'
    manifests in scan id order), for the candidates of namespace $1."""
    rows = f"FROM scans WHERE namespace = $1 AND ({where})"
    count = f"SELECT count(*) FROM (SELECT 1 {rows} LIMIT ${first_param}::bigint) AS candidates"
    return count, f'SELECT manifest {rows} ORDER BY scan_id COLLATE "C"'
