"""A find's matcher and its cost (`api_shim.find.match`) where a one-token change would go unseen by
the matcher's answers: what `$all`, `$in` patterns and nested values cost, and conditions tested
cheapest first."""

from __future__ import annotations

from api_shim.find.match import compile_filter, cost
from api_shim.find.query import Pattern, parse
from api_shim.find.regex import Regex
from tests.helpers import find_filter

LARGE = "(.*a){20}"  # a pattern whose program costs more than an uncompiled one


def test_all_costs_one_and_each_of_its_items() -> None:
    # The field, $all, the array [1, 2] (3 nodes) and 3.
    assert cost(parse({"a": {"$all": [[1, 2], 3]}}), {}) == 1 + 1 + 3 + 1


def test_all_costs_a_pattern_inside_it_as_compiled() -> None:
    inside = find_filter({"a": {"$all": [{"$elemMatch": {"$regex": LARGE}}]}}).cost
    assert inside == find_filter({"a": {"$elemMatch": {"$regex": LARGE}}}).cost + 1


def test_exists_size_and_ordering_cost_one_test() -> None:
    # The field and the one test.
    for condition in ({"$exists": True}, {"$size": 2}, {"$gt": 1}):
        assert cost(parse({"a": condition}), {}) == 1 + 1, condition


def test_elem_match_of_documents_costs_one_and_its_query() -> None:
    # The field, $elemMatch, and each of the element's two fields with its equality.
    assert cost(parse({"a": {"$elemMatch": {"k": 1, "v": 2}}}), {}) == 1 + 1 + 2 + 2


def test_in_costs_its_patterns_as_compiled() -> None:
    # $in is two tests and its pattern's search; $regex one test and the same search.
    assert (
        find_filter({"a": {"$in": [{"$regex": LARGE}]}}).cost
        == find_filter({"a": {"$regex": LARGE}}).cost + 1
    )
    assert (
        find_filter({"a": {"$in": [{"$regex": LARGE}]}}).cost
        > find_filter({"a": {"$in": [{"$regex": "b"}]}}).cost
    )


def test_a_value_costs_every_node_however_deep() -> None:
    # The field; the object, its array, the inner array and its two numbers.
    assert cost(parse({"a": {"x": [[1, 2]]}}), {}) == 1 + 5
    assert cost(parse({"a": [[1, {"y": 2}]]}), {}) == 1 + 5


def test_the_cheaper_conditions_are_tested_first() -> None:
    searched: list[str] = []

    def search(text: str) -> bool:
        searched.append(text)
        return True

    # The pattern comes first in the filter, but costs more than the equality after it.
    query = parse({"a": {"$regex": "x"}, "b": 1})
    matches = compile_filter(query, {Pattern("x", ""): Regex("x", 0, search)}).matches
    assert not matches({"a": "text", "b": 2})
    assert searched == []  # the equality failed first: no search was needed
    assert matches({"a": "text", "b": 1})
    assert searched == ["text"]
