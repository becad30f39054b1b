"""The MongoDB-style filter subset used by POST /scans/find."""

from __future__ import annotations

from typing import Any

import pytest

from api_shim.filters import FilterError, compile_filter

DOC = {
    "scan_id": "abc",
    "priority": 5,
    "is_deleted": False,
    "classifiers": {"origin": "alert", "tags": ["a", "b"], "n": 3},
    "event_metadata": {"run_id": 123, "event_id": 987, "is_real_event": True},
    "progress": None,
    "items": [{"k": 1, "v": "x"}, {"k": 2, "v": "y"}],
}


@pytest.mark.parametrize(
    ("query", "matches"),
    [
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
    ],
)
def test_matches(query: dict[str, Any], matches: bool) -> None:
    assert compile_filter(query)(DOC) is matches


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
    ],
)
def test_refused(query: dict[str, Any], text: str) -> None:
    with pytest.raises(FilterError, match=text):
        compile_filter(query)
