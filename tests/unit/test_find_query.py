"""How a find's filter is parsed (`api_shim.find.query`) where a one-token change would go unseen by the
matcher tests: `$and` merged into the clauses beside it, and an `$elemMatch` document's keys read as
the element's own (never renamed as a manifest's fields)."""

from __future__ import annotations

from api_shim.find.query import Compare, ElemMatch, Field, Query, parse
from tests.helpers import matcher


def test_and_adds_its_clauses_to_those_before_it() -> None:
    query = {"a": 1, "b": 2, "$and": [{"c": 3}, {"d": 4}]}
    assert [clause.path for clause in parse(query).clauses if isinstance(clause, Field)] == [
        ("a",),
        ("b",),
        ("c",),
        ("d",),
    ]
    matches = matcher(query)
    assert matches({"a": 1, "b": 2, "c": 3, "d": 4})
    assert not matches({"a": 0, "b": 2, "c": 3, "d": 4})  # the clause before $and still holds


def test_an_elem_match_documents_keys_are_the_elements_not_renamed() -> None:
    # `i3_event_id` is a manifest field's other name (sensor_event_id): inside $elemMatch it names a key
    # of the array's elements, which is read as given.
    query = {"items": {"$elemMatch": {"i3_event_id": 1}}, "i3_event_id": 2}
    (items, renamed) = parse(query).clauses
    assert items == Field(("items",), (ElemMatch(Query((Field(("i3_event_id",), (Compare("$eq", 1),)),))),))
    assert renamed == Field(("sensor_event_id",), (Compare("$eq", 2),))
    matches = matcher(query)
    assert matches({"items": [{"i3_event_id": 1}], "sensor_event_id": 2})
    assert not matches({"items": [{"sensor_event_id": 1}], "sensor_event_id": 2})
