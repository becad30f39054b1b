"""The MongoDB-style filter subset used by POST /scans/find."""

from __future__ import annotations

from typing import Any

import pytest

from api_shim.find.match import UNCOMPILED, cost, regex_cost
from api_shim.find.query import FilterError, FindLimits, Pattern, parse
from api_shim.find.search import compile_regex_for
from tests.helpers import find_filter, matcher

DOC = {
    "scan_id": "abc",
    "priority": 5,
    "is_deleted": False,
    "classifiers": {"origin": "alert", "tags": ["a", "b"], "n": 3},
    "event_metadata": {"run_id": 123, "event_id": 987, "is_real_event": True},
    "progress": None,
    "items": [{"k": 1, "v": "x"}, {"k": 2, "v": "y"}],
}


# (filter, whether it matches DOC); also run over the archive (tests/integration/test_find_archive.py)
MATCH_CASES: list[tuple[dict[str, Any], bool]] = [
    ({}, True),
    ({"scan_id": "abc"}, True),
    ({"scan_id": "abd"}, False),
    ({"event_metadata.run_id": 123, "event_metadata.is_real_event": True}, True),
    ({"event_metadata.is_real_event": 1}, False),  # booleans are not numbers
    ({"classifiers.tags": "a"}, True),  # array membership
    ({"classifiers.tags": ["a", "b"]}, True),  # whole array
    ({"classifiers.tags": ["b", "a"]}, False),
    ({"items.k": 2}, True),  # across arrays of objects
    ({"items.1.v": "y"}, True),  # array index
    ({"classifiers": {"origin": "alert", "tags": ["a", "b"], "n": 3}}, True),
    ({"classifiers": {"origin": "alert"}}, False),  # whole-object equality
    ({"progress": None}, True),
    ({"missing": None}, True),  # null matches a missing field
    ({"priority": {"$eq": 5}}, True),
    ({"priority": {"$ne": 5}}, False),
    ({"priority": {"$gt": 4, "$lt": 6}}, True),
    ({"priority": {"$gte": 5, "$lte": 5}}, True),
    ({"priority": {"$gt": "4"}}, False),  # no ordering across types
    ({"scan_id": {"$lt": "abd"}}, True),
    ({"priority": {"$in": [1, 5]}}, True),
    ({"priority": {"$nin": [1, 5]}}, False),
    ({"classifiers.tags": {"$in": ["z", "b"]}}, True),
    ({"scan_id": {"$in": [{"$regex": "^a"}]}}, True),
    ({"progress": {"$exists": True}}, True),
    ({"missing": {"$exists": False}}, True),
    ({"classifiers.origin": {"$regex": "^AL", "$options": "i"}}, True),
    ({"classifiers.origin": {"$regex": "^AL"}}, False),
    ({"classifiers.origin": {"$not": {"$regex": "^al"}}}, False),
    ({"priority": {"$not": {"$gt": 9}}}, True),
    ({"classifiers.tags": {"$all": ["b", "a"]}}, True),
    ({"classifiers.tags": {"$all": ["a", "c"]}}, False),
    ({"classifiers.tags": {"$size": 2}}, True),
    ({"items": {"$elemMatch": {"k": 2, "v": "y"}}}, True),
    ({"items": {"$elemMatch": {"k": 2, "v": "x"}}}, False),
    ({"classifiers.tags": {"$elemMatch": {"$in": ["b"]}}}, True),
    ({"$and": [{"priority": 5}, {"scan_id": "abc"}]}, True),
    ({"$or": [{"priority": 1}, {"scan_id": "abc"}]}, True),
    ({"$nor": [{"priority": 1}, {"scan_id": "abc"}]}, False),
    ({"$or": [{"priority": 1}], "scan_id": "abc"}, False),
    # $in by hashing keeps `_same`'s types apart: booleans are not numbers, 5 == 5.0
    ({"priority": {"$in": [True, "5"]}}, False),
    ({"priority": {"$in": [5.0]}}, True),
    ({"event_metadata.is_real_event": {"$in": [1]}}, False),
    ({"event_metadata.is_real_event": {"$in": [True]}}, True),
    ({"missing": {"$in": [None]}}, True),
    ({"progress": {"$in": [None]}}, True),
    ({"classifiers.tags": {"$in": [["a", "b"]]}}, True),  # a whole array
    ({"items": {"$in": [{"k": 1, "v": "x"}]}}, True),  # an element, by whole-object equality
    ({"classifiers.tags": {"$nin": ["z", {"$regex": "^b"}]}}, False),
    ({"classifiers.n": {"$in": [{"$regex": "3"}]}}, False),  # patterns test strings only
    ({"scan_id": {"$regex": "^ABC$", "$options": "i"}}, True),
    ({"scan_id": {"$regex": "^ a b c $", "$options": "x"}}, True),
    ({"classifiers.tags": {"$regex": "^b$"}}, True),  # on array elements
    ({"scan_id": {"$not": "^x"}}, True),
]


@pytest.mark.parametrize(("query", "matches"), MATCH_CASES)
def test_matches(query: dict[str, Any], matches: bool) -> None:
    assert matcher(query)(DOC) is matches


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ({"priority": {"$where": "1"}}, "unsupported operator: \\$where"),
        ({"$text": {"$search": "x"}}, "unsupported operator: \\$text"),
        ({"priority": {"$in": 5}}, "\\$in needs an array"),
        ({"$or": {"a": 1}}, "\\$or needs a non-empty array"),
        ({"a": {"$regex": "("}}, "invalid \\$regex"),
        ({"a": {"$size": "2"}}, "\\$size needs an integer"),
        ({"a": {"$gt": 1, "b": 2}}, "cannot mix operators and fields"),
        ({"a": {"$options": "i"}}, "\\$options needs \\$regex"),
        ({"a": {"$regex": "x", "$options": "q"}}, "unsupported \\$options flag"),
        ({"a": {"$regex": "(a)\\1"}}, "invalid \\$regex: invalid escape sequence: \\\\1 \\(the linear-time"),
        ({"a": {"$regex": "(?=a)"}}, "invalid \\$regex: invalid perl operator"),
        ({"a": {"$in": [{"$regex": "(?<=a)"}]}}, "invalid \\$regex: invalid perl operator"),
        ({"a": {"$not": "(?>a)"}}, "invalid \\$regex: invalid perl operator"),
        ({"a": {"$regex": 5}}, "\\$regex takes a string pattern"),
        ({"a": {"$in": [{"$gt": 1}]}}, "\\$in takes values and \\{\\$regex, \\$options\\} objects"),
        ({"a": {"$in": [{"$regex": "a", "$size": 1}]}}, "\\$in takes values"),
    ],
)
def test_refused(query: dict[str, Any], text: str) -> None:
    with pytest.raises(FilterError, match=text):
        find_filter(query)


def nested(depth: int) -> dict[str, Any]:
    query: dict[str, Any] = {"a": 1}
    for _ in range(depth):
        query = {"$and": [query]}
    return query


@pytest.mark.parametrize(
    ("query", "text"),
    [
        (nested(10_000), "nested deeper than 16 levels"),  # refused before anything recurses
        ({"a": {"$in": list(range(1_000))}}, "more than 1000 keys, values and elements"),
        ({"a": {"$regex": "a" * 1_001}}, "invalid \\$regex: pattern longer than 1000 characters"),
        ({"a": {"$regex": "(.*a){200}"}}, "invalid \\$regex: pattern too complex"),
    ],
)
def test_beyond_the_limits(query: dict[str, Any], text: str) -> None:
    with pytest.raises(FilterError, match=text):
        find_filter(query)


def test_limits_are_the_callers() -> None:
    assert find_filter(nested(7)).cost == 2
    with pytest.raises(FilterError, match="nested deeper than 4 levels"):
        find_filter(nested(3), FindLimits(max_depth=4))


@pytest.mark.parametrize(
    ("query", "cost"),
    [
        ({}, 1),
        ({"scan_id": "abc"}, 2),  # a path, an equality
        ({"classifiers": {"origin": "alert", "n": 3}}, 4),  # comparing an object costs its size
        ({"priority": {"$gt": 4, "$lt": 6}}, 3),
        ({"scan_id": {"$in": [f"id{i}" for i in range(900)]}}, 3),  # values are hashed: one test
        ({"scan_id": {"$regex": "^abc"}}, 6),  # a search costs more
        ({"scan_id": {"$regex": "(.*a){20}"}}, 17),  # a large program more still
        ({"$or": [{"priority": 1}, {"scan_id": "abc"}]}, 4),
    ],
)
def test_cost(query: dict[str, Any], cost: int) -> None:
    assert find_filter(query).cost == cost


@pytest.mark.parametrize(
    ("query", "patterns"),
    [
        ({"scan_id": "abc"}, []),
        ({"scan_id": {"$regex": "^a", "$options": "i"}, "x": {"$not": "b"}}, [("^a", "i"), ("b", "")]),
        ({"$or": [{"a": {"$regex": "c"}}, {"b": {"$regex": "c"}}]}, [("c", "")]),  # each pattern once
        (
            {"a": {"$in": [1, {"$regex": "d"}]}, "b": {"$elemMatch": {"k": {"$regex": "e"}}}},
            [("d", ""), ("e", "")],
        ),
        # A $regex inside a value is compared, not compiled: it costs its size, not a search.
        ({"a": {"$eq": {"$regex": "f"}}, "b": [{"$regex": "g"}], "c": {"k": {"$regex": "h"}}}, []),
    ],
)
def test_a_plan_lists_the_patterns_compiled_and_costs_at_most_the_compiled_filter(
    query: dict[str, Any], patterns: list[tuple[str, str]]
) -> None:
    """The find compiles a filter's patterns a slice at a time, refusing it once its cost with the others
    uncompiled is beyond the budget: that must never exceed the filter's own cost."""
    parsed = parse(query)
    assert parsed.patterns() == [Pattern(*p) for p in patterns]
    programs = sum(
        regex_cost(compile_regex_for(Pattern(*p), FindLimits())) - regex_cost(UNCOMPILED) for p in patterns
    )
    assert cost(parsed, {}) + programs <= find_filter(query).cost


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ({"a": {"$bogus": 1}, "b": {"$regex": "x"}}, "unsupported operator: $bogus"),
        ({"a": {"$regex": 5}}, "$regex takes a string pattern"),
        ({"$and": 5}, "$and needs a non-empty array of filters"),
    ],
)
def test_parsing_refuses_what_the_filter_refuses_but_its_patterns(query: dict[str, Any], text: str) -> None:
    with pytest.raises(FilterError) as refused:
        parse(query)
    assert text in str(refused.value)
    assert parse({"a": {"$regex": "(a)\\1"}}).patterns() == [Pattern("(a)\\1", "")]  # checked later
