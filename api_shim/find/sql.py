"""The archive's part of `POST /scans/find`: a parsed filter as a SQL condition over the archive's `scans`
table (`skyscan.io.archive`, schema v1), which selects the candidates the compiled filter then tests (pure).

The condition is SOUND: it never excludes a row whose manifest the in-memory matcher accepts. What maps
exactly is translated exactly, on the indexed columns where there is one:
- `event_metadata.run_id` / `event_id` (bigint columns), `timestamp` (`created_at`), `last_updated`,
  `is_deleted`, `scan_id`: equality, `$in`, `$nin`, `$ne`, ranges, `$exists`, with the matcher's
  types (booleans are not numbers, no ordering across types; strings in code point order);
- `classifiers.<key>`: equality and `$in` of scalars as containment (`@>`, the GIN index), a value or
  an array holding it, as MongoDB does; `$exists`; `classifiers` as a whole object;
- `$and`, `$or`, and `$nor`, `$ne`, `$nin`, `$not` over exact parts.
Other paths get a lax jsonpath over `manifest` (which unwraps arrays as MongoDB's paths do) for equality
with a scalar, number ranges and `$exists: true`: a superset of the matches, never negated. Anything else
(`$regex`, `$size`, `$elemMatch`, null equality off the columns, array indexes in paths, numbers
beyond 2**53 in jsonb, a negation of an inexact part) becomes TRUE: every row stays a candidate.

The translation relies on the columns holding the manifest's values (`skyscan.io.archive.columns`): a
run or event id is an integer or absent (NULL), timestamps are numbers, `is_deleted` a boolean.
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
from api_shim.find.match import scalar_key
from api_shim.find.query import All, AnyOf, Compare, Cond, Field, In, Not, Query

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
SAFE_NUMBER = 2**53  # below it a number's JSON text orders and equals as the number does (see `_safe`)
_SQL_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_KINDS = {bool: "boolean", int: "number", float: "number", str: "text"}  # the column kind a JSON value meets
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


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _infinite(value: Any) -> bool:
    """NaN or an infinity (JSON bodies may spell them): SQL orders and equals them otherwise."""
    return isinstance(value, float) and not math.isfinite(value)


def _safe(value: Any) -> bool:
    """Whether jsonb compares `value` as the matcher does. jsonb holds a float as its shortest decimal
    text; below 2**53 no other float or integer lies between a float and that text, above it one can."""
    if _number(value):
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
    return _conds(_tests(".".join(clause.path)), clause.conds)


def _conds(tests: _Tests, conds: tuple[Cond, ...]) -> Sql:
    return _join("AND", [_cond(tests, c) for c in conds])


def _cond(tests: _Tests, cond: Cond) -> Sql:
    match cond:
        case Compare("$eq", value):
            return tests.equals(value)
        case Compare("$exists", present):
            return tests.exists(present)
        case Compare(op, value) if op in _SQL_ORDER:
            return tests.order(op, value)
        case Not(conds):
            return _not(_conds(tests, conds))
        case In(values, patterns):
            return _join("OR", [*(tests.equals(v) for v in values), *(UNTRANSLATED for _ in patterns)])
        case All(()):
            return FALSE  # an empty $all matches nothing
        case All(items) if all(isinstance(i, Compare) for i in items):
            return _join("AND", [tests.equals(i.value) for i in items if isinstance(i, Compare)])
    return UNTRANSLATED  # $regex, $size, $elemMatch, $all of $elemMatch


def _tests(path: str) -> _Tests:
    """The translations of the tests on `path`, by the kind of path."""
    if path in COLUMNS:
        return _ColumnTests(COLUMNS[path])
    if path == "classifiers":
        return _ClassifiersTests()
    if path.startswith(CLASSIFIER) and "." not in path[len(CLASSIFIER) :]:
        return _ClassifierTests(path[len(CLASSIFIER) :])
    return _ManifestTests(tuple(path.split(".")))


@dataclass(frozen=True)
class _ColumnTests:
    column: Column

    def equals(self, value: Any) -> Sql:
        col = self.column
        if _infinite(value):
            return UNTRANSLATED
        if value is None:
            return Sql(f"{col.name} IS NULL", True) if col.nullable else FALSE
        kind = _KINDS.get(type(value))
        if kind == "number" and col.kind == "bigint":
            if not (value == int(value) and BIGINT_MIN <= value <= BIGINT_MAX):
                return FALSE
            return Sql(f"{col.name} = {P}::bigint", True, (int(value),))
        if kind == "number" and col.kind == "float8":
            if isinstance(value, int) and abs(value) >= SAFE_NUMBER:
                return UNTRANSLATED  # not one float: compared exactly by Python, rounded by SQL
            return Sql(f"{col.name} = {P}::float8", True, (float(value),))
        if kind == col.kind == "boolean":
            return Sql(col.name if value else f"NOT {col.name}", True)
        if kind == col.kind == "text":
            return Sql(f"{col.name} = {P}::text", True, (value,))
        return FALSE  # another type, an array or an object: never equal to this column's scalar

    def order(self, op: str, value: Any) -> Sql:
        col, kind = self.column, _KINDS.get(type(value))
        if kind == "text" and col.kind == "text":
            return Sql(f'{col.name} COLLATE "C" {_SQL_ORDER[op]} {P}::text', True, (value,))
        if kind != "number" or col.kind not in ("bigint", "float8"):
            return FALSE  # no ordering across types
        if _infinite(value):
            return UNTRANSLATED
        if col.kind == "float8":
            if isinstance(value, int) and abs(value) >= SAFE_NUMBER:
                return UNTRANSLATED
            return Sql(f"{col.name} {_SQL_ORDER[op]} {P}::float8", True, (float(value),))
        return self._integer_order(op, value)

    def _integer_order(self, op: str, value: float) -> Sql:
        """An integer column against any number: a fraction becomes the integer bound it implies."""
        col = self.column
        if value != int(value):
            op, value = ("$gt", math.floor(value)) if op in ("$gt", "$gte") else ("$lt", math.ceil(value))
        bound = int(value)
        below, above = bound < BIGINT_MIN, bound > BIGINT_MAX
        if below or above:  # every id is on one side of it
            every = (below and op in ("$gt", "$gte")) or (above and op in ("$lt", "$lte"))
            return Sql(f"{col.name} IS NOT NULL", True) if every else FALSE
        return Sql(f"{col.name} {_SQL_ORDER[op]} {P}::bigint", True, (bound,))

    def exists(self, present: bool) -> Sql:
        if self.column.nullable:
            return Sql(f"{self.column.name} IS {'NOT ' if present else ''}NULL", True)
        return TRUE if present else FALSE


@dataclass(frozen=True)
class _ClassifierTests:
    """`classifiers.<key>`: any JSON value under a key of the `classifiers` object."""

    key: str

    def equals(self, value: Any) -> Sql:
        if not _safe(value) or scalar_key(value) is None:
            return UNTRANSLATED  # an array or object: containment is not equality
        # The value itself or an array holding it (containment does not look into nested arrays,
        # and neither does the matcher).
        equal = f"classifiers @> {P}::jsonb OR classifiers @> {P}::jsonb"
        params: tuple[Any, ...] = ({self.key: value}, {self.key: [value]})
        if value is None:  # null also matches a missing key
            equal, params = f"{equal} OR NOT classifiers ? {P}::text", (*params, self.key)
        return Sql(equal, True, params)

    def order(self, op: str, value: Any) -> Sql:
        return _ManifestTests(("classifiers", self.key)).order(op, value)

    def exists(self, present: bool) -> Sql:
        return Sql(f"{'' if present else 'NOT '}classifiers ? {P}::text", True, (self.key,))


class _ClassifiersTests:
    """`classifiers` itself: always an object."""

    def equals(self, value: Any) -> Sql:
        if not isinstance(value, Mapping) or not _safe(value):
            return FALSE if _safe(value) else UNTRANSLATED
        return Sql(f"classifiers = {P}::jsonb", True, (dict(value),))

    def order(self, op: str, value: Any) -> Sql:
        return UNTRANSLATED

    def exists(self, present: bool) -> Sql:
        return TRUE if present else FALSE


@dataclass(frozen=True)
class _ManifestTests:
    """Any other path: a lax jsonpath over the manifest (arrays on the way and at the end unwrapped,
    as the matcher does, and more: nested arrays too), so only a superset of the matches."""

    path: tuple[str, ...]

    @property
    def indexes(self) -> bool:
        return any(key.isdigit() for key in self.path)  # an array index, or a key: not translated

    def _exists(self, predicate: str, value: Any = None) -> Sql:
        jsonpath = "lax $" + "".join("." + json.dumps(key) for key in self.path) + predicate
        return Sql(
            f"jsonb_path_exists(manifest, {P}::text::jsonpath, {P}::jsonb, true)",
            False,
            (jsonpath, {"v": value}),
        )

    def equals(self, value: Any) -> Sql:
        if self.indexes or value is None or scalar_key(value) is None or not _safe(value):
            return UNTRANSLATED
        return self._exists(" ? (@ == $v)", value)

    def order(self, op: str, value: Any) -> Sql:
        if self.indexes or not _number(value) or not _safe(value):
            return UNTRANSLATED  # jsonpath orders strings by another rule than code points
        return self._exists(f" ? (@ {_SQL_ORDER[op]} $v)", value)

    def exists(self, present: bool) -> Sql:
        return self._exists("") if present and not self.indexes else UNTRANSLATED


_Tests = _ColumnTests | _ClassifierTests | _ClassifiersTests | _ManifestTests


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
