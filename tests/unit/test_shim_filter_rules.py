"""The find's filter rules that a one-token change would break unseen (`api_shim.find`): types kept
apart, paths through arrays and read-only mappings, the shape limits, and each refusal's own words."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from api_shim.find.match import compile_filter, cost
from api_shim.find.query import FilterError, FindLimits, Pattern, parse
from api_shim.find.regex import Regex
from tests.helpers import find_filter, matcher


@pytest.mark.parametrize(
    ("query", "document"),
    [
        ({"a": {"$gt": 0}}, {"a": True}),  # a boolean is no number to order
        ({"a": {"$lt": True}}, {"a": 0}),
        ({"a": [1, 2]}, {"a": [True, 2]}),  # nor inside an array
        ({"a": {"x": 1}}, {"a": {"x": True}}),  # nor inside an object
        ({"a": 1}, {"a": [True]}),  # nor as an array's element
        ({"a": {"$in": [["a", "b"]]}}, {"a": "ab"}),  # a string is not an array of its letters
        ({"a": {"$size": 2}}, {"a": "ab"}),  # $size counts arrays only
        ({"a": 1}, {}),  # only null matches a missing field
        ({"a.2": 1}, {"a": [1, 2]}),  # an index past the end finds nothing
    ],
)
def test_values_of_other_types_or_places_do_not_match(
    query: dict[str, Any], document: dict[str, Any]
) -> None:
    assert not matcher(query)(document)


def test_read_only_mappings_are_documents_too() -> None:
    matches = matcher({"a": 1, "b.c": 2})
    assert matches(MappingProxyType({"a": 1, "b": MappingProxyType({"c": 2})}))
    assert not matches(MappingProxyType({"a": 1, "b": MappingProxyType({"c": 3})}))
    assert not matcher({"a": 1})(["a"])  # not a document at all


def test_all_takes_elem_match_parts() -> None:
    matches = matcher({"tags": {"$all": [{"$elemMatch": {"$gt": 5}}, 1]}})
    assert matches({"tags": [1, 7]})
    assert not matches({"tags": [1, 2]})


def test_in_takes_patterns_with_their_options() -> None:
    matches = matcher({"a": {"$in": [{"$regex": "^A", "$options": "i"}]}})
    assert matches({"a": "abc"}) and not matches({"a": "cba"})


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ([], "a filter must be an object"),
        ({"a": {"$gt": 1, "b": 2}}, "cannot mix operators and fields in one condition"),
        ({"a": {"$elemMatch": 1}}, "$elemMatch needs an object"),
        ({"a": {"$all": [{"$elemMatch": 1}]}}, "$elemMatch needs an object"),
        ({"a": {"$exists": "yes"}}, "$exists needs a boolean"),
        ({"a": {"$options": "i"}}, "$options needs $regex"),
        ({"a": {"$all": 1}}, "$all needs an array"),
        ({"a": {"$size": True}}, "$size needs an integer"),
        ({"a": {"$not": 1}}, "$not needs an operator expression or a regex"),
        ({"a": {"$regex": 1}}, "$regex takes a string pattern and string $options"),
        ({"a": {"$regex": "x", "$options": "q"}}, "unsupported $options flag: 'q' (supported: i, m, s, x)"),
        ({"$and": [1]}, "$and needs a non-empty array of filters"),
        ({"a": {"$in": [{"$regex": "x", "$gt": 1}]}}, "$in takes values and {$regex, $options} objects"),
        ({"a\x00": 1}, "strings cannot contain NUL (\\u0000)"),
        ({"a": "x\x00"}, "strings cannot contain NUL (\\u0000)"),
    ],
)
def test_each_refusal_says_what_is_wrong(query: Any, message: str) -> None:
    with pytest.raises(FilterError) as refused:
        find_filter(query)
    assert str(refused.value) == message


def test_a_filter_of_exactly_the_node_limit_is_accepted_and_one_more_is_not() -> None:
    limits = FindLimits(max_nodes=10)
    exactly = {"a": {"$in": list(range(7))}}  # the filter, a, the $in document, its array's 7 elements
    parse(exactly, limits)
    over = {"a": {"$in": list(range(8))}}
    with pytest.raises(FilterError, match="more than 10 keys, values and elements"):
        parse(over, limits)


def test_a_plan_costs_at_least_one_and_an_array_value_by_its_size() -> None:
    assert compile_filter(parse({}), {}).cost == 1
    scalars = cost(parse({"a": {"$in": [1, 2]}}), {})  # scalars are one hashed test
    assert cost(parse({"a": {"$in": [1, [1, 2, 3]]}}), {}) == scalars + 4


def test_a_pattern_compiled_ahead_is_used_as_it_is() -> None:
    everything = Regex("x", 1, lambda text: True)
    matches = compile_filter(parse({"a": {"$regex": "x"}}), {Pattern("x", ""): everything}).matches
    assert matches({"a": "no x here is needed"}) and matches({"a": "y"})


def test_nin_is_the_negation_of_in_a_missing_field_being_null() -> None:
    # As MongoDB, and as the archive's SQL (NOT of the $in), so live and archived scans answer alike.
    for values, missing_matches in (([None], False), ([1], True), ([None, 1], False)):
        assert matcher({"a": {"$in": values}})({}) is not missing_matches
        assert matcher({"a": {"$nin": values}})({}) is missing_matches
    assert matcher({"a": {"$nin": [None]}})({"a": 1})
    assert not matcher({"a": {"$nin": [None]}})({"a": None})
