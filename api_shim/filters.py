"""A MongoDB-style filter subset, evaluated in memory over manifests (`POST /scans/find`).

Supported, with MongoDB's meaning:
- implicit equality `{"a.b": v}`: dotted paths descend into objects and across arrays; a field
  equals v if its value equals v or, when it is an array, if v is one of its elements (or the
  whole array equals v); `{"a": {...}}` without operators compares whole objects;
- comparison `$eq $ne $gt $gte $lt $lte $in $nin` (ordering only between numbers or between
  strings; booleans are not numbers);
- `$exists`, `$regex` (+ `$options` i m s x; on a linear-time engine, see `api_shim.regex`),
  `$all`, `$size`, `$elemMatch`, `$not`;
- logical `$and $or $nor` (lists of filters).
Anything else (an unknown `$operator`, a wrong operand type, a pattern the regex engine refuses, a
filter beyond `FindLimits`) raises `FilterError` before any document is read, so a bad filter is a
400 even on an empty collection.

The filter is compiled once into a predicate; evaluating it is a pure function of the document.
Compiling also estimates the predicate's `cost`, the work of testing one document in units of about
one equality test, so a caller can refuse a find whose documents x cost exceeds its work budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api_shim.regex import Regex, RegexError, compile_regex

Predicate = Callable[[Any], bool]
Test = Callable[[list[Any]], bool]


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class FindLimits:
    """What one `POST /scans/find` may ask for (README, "Limits of /scans/find")."""

    max_nodes: int = 1_000  # keys, values and array elements in the filter
    max_depth: int = 16  # nesting of objects and arrays in the filter
    max_regex_length: int = 1_000  # characters per pattern
    max_regex_program: int = 1_000  # instructions of one compiled pattern (bounds one search)
    max_work: int = 2_000_000  # documents examined x cost per document
    max_archived: int = 100_000  # archived scans a find may examine (the candidates its SQL selects)


@dataclass(frozen=True)
class Filter:
    matches: Predicate
    cost: int  # estimated work per document, in units of about one equality test


def regex_cost(regex: Regex) -> int:
    """A search costs a few equality tests, more for large programs (work grows with the program)."""
    return 4 + regex.program_size // 16


def _same(a: Any, b: Any) -> bool:
    """Equality where booleans are not numbers (MongoDB types them apart)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def scalar_key(value: Any) -> tuple[str, Any] | None:
    """A hashable key that two scalars share exactly when `_same` holds; None for arrays/objects."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    return None


def _values(doc: Any, path: Sequence[str]) -> list[Any]:
    """Every value at `path`, expanding arrays met on the way (MongoDB's implicit traversal)."""
    if not path:
        return [doc]
    head, rest = path[0], path[1:]
    if type(doc) is dict or isinstance(doc, Mapping):
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
    """Whether `test` holds for a value or, for arrays, one of its elements (see `_candidates`)."""
    for v in values:
        if test(v):
            return True
        if isinstance(v, list):
            for item in v:
                if test(item):
                    return True
    return False


def _every(tests: list[Predicate]) -> Predicate:
    if len(tests) == 1:
        return tests[0]

    def every(doc: Any) -> bool:
        for test in tests:
            if not test(doc):
                return False
        return True

    return every


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


def is_operator_doc(cond: Any) -> bool:
    return isinstance(cond, Mapping) and bool(cond) and all(str(k).startswith("$") for k in cond)


def _size(value: Any) -> int:
    """Nodes in a JSON value (iterative: the shape check runs before anything recurses)."""
    count, todo = 0, [value]
    while todo:
        item = todo.pop()
        count += 1
        if isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count


def check_shape(query: Any, limits: FindLimits) -> None:
    """Refuse a filter with more nodes or deeper nesting than `limits` allow, or a NUL in a string."""
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


_NUL = "strings cannot contain NUL (\\u0000)"  # no stored text holds one (PostgreSQL's cannot)
RegexKey = tuple[str, str]  # a pattern and its $options


def compile_regex_for(key: RegexKey, limits: FindLimits) -> Regex:
    return compile_regex(*key, max_length=limits.max_regex_length, max_program=limits.max_regex_program)


# What a pattern stands for while a filter is planned: a program of no instructions, the least it costs.
UNCOMPILED = Regex("", 0, lambda text: False)


class _Compiler:
    """Compiles one filter, adding up the estimated cost of what it compiles. Planning, it compiles no
    pattern: it lists them in `wanted`, each costed as `UNCOMPILED`."""

    def __init__(
        self, limits: FindLimits, compiled: Mapping[RegexKey, Regex], *, planning: bool = False
    ) -> None:
        self.limits = limits
        self.compiled = compiled
        self.planning = planning
        self.wanted: dict[RegexKey, None] = {}  # an ordered set
        self.cost = 0

    def regex(self, pattern: Any, options: Any = "") -> Regex:
        if not isinstance(pattern, str) or not isinstance(options, str):
            raise FilterError("$regex takes a string pattern and string $options")
        key = (pattern, options)
        try:
            if (regex := self.compiled.get(key)) is None:
                if self.planning:
                    self.wanted[key] = None
                    regex = UNCOMPILED
                else:
                    regex = compile_regex_for(key, self.limits)
        except RegexError as e:
            if str(e).startswith("unsupported $options"):
                raise FilterError(str(e)) from None
            raise FilterError(f"invalid $regex: {e}") from None
        self.cost += regex_cost(regex)
        return regex

    def equals(self, target: Any) -> Test:
        self.cost += _size(target)

        def equal(values: list[Any]) -> bool:
            # `==` first: cheap, and implied by `_same`, which then tells booleans from numbers.
            for v in values:
                if v == target and _same(v, target):
                    return True
                if isinstance(v, list):
                    for item in v:
                        if item == target and _same(item, target):
                            return True
            return target is None and not values  # MongoDB: `null` also matches a missing field

        return equal

    def within(self, op: str, arg: Any) -> Test:
        """`$in` / `$nin`: scalars by hashing (one test whatever their number), arrays and objects by
        comparison, `{$regex, $options}` objects by searching strings."""
        if not isinstance(arg, list):
            raise FilterError(f"{op} needs an array")
        self.cost += 1
        keys: set[tuple[str, Any]] = set()
        others: list[Any] = []
        regexes: list[Regex] = []
        for a in arg:
            if is_operator_doc(a):
                if "$regex" not in a or set(a) - {"$regex", "$options"}:
                    raise FilterError(f"{op} takes values and {{$regex, $options}} objects")
                regexes.append(self.regex(a["$regex"], a.get("$options", "")))
            elif (key := scalar_key(a)) is not None:
                keys.add(key)
            else:
                self.cost += _size(a)
                others.append(a)

        def test(c: Any) -> bool:
            key = scalar_key(c)
            if key is not None and key in keys:
                return True
            if isinstance(c, str) and any(r.search(c) for r in regexes):
                return True
            return any(_same(c, a) for a in others)

        def found(values: list[Any]) -> bool:  # a missing field is null, for $nin as for $in
            return any(test(c) for c in _candidates(values) or [None])

        if op == "$in":
            return found
        return lambda values: not found(values)

    def operator(self, op: str, arg: Any, siblings: Mapping[str, Any]) -> Test:
        """One operator applied to the values found at a path."""
        self.cost += 1
        if op == "$eq":
            return self.equals(arg)
        if op == "$ne":
            eq = self.equals(arg)
            return lambda values: not eq(values)
        if op in _ORDER:
            cmp = _ORDER[op]
            return lambda values: _some(values, lambda c: _comparable(c, arg) and cmp(c, arg))
        if op in ("$in", "$nin"):
            return self.within(op, arg)
        if op == "$exists":
            if not isinstance(arg, bool | int):
                raise FilterError("$exists needs a boolean")
            return lambda values: bool(values) == bool(arg)
        if op == "$regex":
            search = self.regex(arg, siblings.get("$options", "")).search
            return lambda values: _some(values, lambda c: isinstance(c, str) and search(c))
        if op == "$options":
            if "$regex" not in siblings:
                raise FilterError("$options needs $regex")
            return lambda values: True
        if op == "$all":
            if not isinstance(arg, list):
                raise FilterError("$all needs an array")
            parts = [
                self.elem_match(a["$elemMatch"])
                if is_operator_doc(a) and "$elemMatch" in a
                else self.equals(a)
                for a in arg
            ]
            return lambda values: bool(arg) and all(p(values) for p in parts)
        if op == "$size":
            if isinstance(arg, bool) or not isinstance(arg, int):
                raise FilterError("$size needs an integer")
            return lambda values: any(isinstance(v, list) and len(v) == arg for v in values)
        if op == "$elemMatch":
            return self.elem_match(arg)
        if op == "$not":
            if isinstance(arg, str):
                inner = self.operator("$regex", arg, {})
            elif is_operator_doc(arg):
                inner = self.condition(arg)
            else:
                raise FilterError("$not needs an operator expression or a regex")
            return lambda values: not inner(values)
        raise FilterError(f"unsupported operator: {op}")

    def elem_match(self, arg: Any) -> Test:
        if not isinstance(arg, Mapping):
            raise FilterError("$elemMatch needs an object")
        test: Predicate
        if is_operator_doc(arg):
            cond = self.condition(arg)
            test = lambda item: cond([item])  # noqa: E731
        else:
            test = self.filter(arg)
        return lambda values: any(isinstance(v, list) and any(test(item) for item in v) for v in values)

    def condition(self, cond: Any) -> Test:
        if not is_operator_doc(cond):
            if isinstance(cond, Mapping) and any(str(k).startswith("$") for k in cond):
                raise FilterError("cannot mix operators and fields in one condition")
            return self.equals(cond)
        return _every([self.operator(op, arg, cond) for op, arg in cond.items()])

    def logical(self, op: str, arg: Any) -> Predicate:
        if not isinstance(arg, list) or not arg or not all(isinstance(a, Mapping) for a in arg):
            raise FilterError(f"{op} needs a non-empty array of filters")
        parts = [self.filter(a) for a in arg]
        if op == "$and":
            return _every(parts)
        if op == "$or":
            return lambda doc: any(p(doc) for p in parts)
        return lambda doc: not any(p(doc) for p in parts)

    def filter(self, query: Any) -> Predicate:
        if not isinstance(query, Mapping):
            raise FilterError("a filter must be an object")
        tests: list[tuple[int, Predicate]] = []
        for key, cond in query.items():
            before = self.cost
            if key in ("$and", "$or", "$nor"):
                test = self.logical(key, cond)
            elif key.startswith("$"):
                raise FilterError(f"unsupported operator: {key}")
            else:
                self.cost += 1
                test = _at_path(key.split("."), self.condition(cond))
            tests.append((self.cost - before, test))
        tests.sort(key=lambda cost_test: cost_test[0])  # cheap tests first: the first failing one decides
        return _every([test for _, test in tests]) if tests else lambda doc: True


def _at_path(path: list[str], test: Test) -> Predicate:
    if len(path) > 1:
        return lambda doc: test(_values(doc, path))
    key = path[0]

    def at_key(doc: Any) -> bool:  # the common case, `_values` for a one-key path inlined
        if type(doc) is dict:
            return test([doc[key]] if key in doc else [])
        return test(_values(doc, path))

    return at_key


@dataclass(frozen=True)
class Plan:
    """What compiling a valid-looking filter takes: the patterns it compiles (each once, in order) and
    its cost with each of them `UNCOMPILED`, so the cost at least. A pattern is checked when compiled."""

    patterns: list[RegexKey]
    cost: int


def plan_filter(query: Mapping[str, Any], limits: FindLimits) -> Plan:
    """Check a filter but for its patterns, without compiling any (a millisecond for a thousand nodes);
    `FilterError` names what is wrong or beyond `limits`."""
    check_shape(query, limits)
    compiler = _Compiler(limits, {}, planning=True)
    compiler.filter(query)
    return Plan(list(compiler.wanted), max(1, compiler.cost))


def parse_filter(
    query: Mapping[str, Any],
    limits: FindLimits | None = None,
    compiled: Mapping[RegexKey, Regex] | None = None,
) -> Filter:
    """Check and compile a filter, using the patterns `compiled` ahead; `FilterError` names what is
    wrong or beyond `limits`."""
    limits = limits or FindLimits()
    check_shape(query, limits)
    compiler = _Compiler(limits, compiled or {})
    matches = compiler.filter(query)
    return Filter(matches, max(1, compiler.cost))


def compile_filter(query: Mapping[str, Any]) -> Predicate:
    return parse_filter(query).matches
