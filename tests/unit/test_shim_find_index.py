"""The find index (run/event ids and classifiers -> scans) and the conditions that narrow a find to it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api_shim.find.index import EVENT_ID, RUN_ID, FindIndex, Lookup, entries, indexed, lookups
from api_shim.find.query import FilterError, parse
from skyscan import manifest
from tests.unit.test_shim_view import SCAN

EVENT = {"runId": 123, "eventId": 45, "eventType": "gold", "mjd": 60000.5, "isRealEvent": True}


def scan(
    name: str, event: dict[str, Any] | None = EVENT, rescan_of: str | None = None, **classifiers: Any
) -> Any:
    obj = copy.deepcopy(SCAN)
    obj["metadata"]["name"] = name
    obj["spec"]["classifiers"] = classifiers
    if rescan_of:
        obj["spec"]["rescanOf"] = rescan_of
    if event is not None:
        obj["status"] = {"eventMetadata": event}
    return obj


VARIANTS = [
    scan("plain", origin="alert", n=3, f=2.5, yes=True, none=None),
    scan("rescan", rescan_of="plain", origin="alert"),
    scan("no-event", event=None, n=3.0),
    scan("stored-loosely", event={**EVENT, "runId": "91", "eventId": 46.0}),  # the manifest converts these
]


@pytest.mark.parametrize("obj", VARIANTS, ids=lambda o: o["metadata"]["name"])
def test_a_scan_is_indexed_by_its_manifests_values(obj: dict[str, Any]) -> None:
    document = manifest.of(obj)
    index = FindIndex()
    index.put("x", obj)
    at = {RUN_ID: (document["event_metadata"] or {}).get("run_id"), EVENT_ID: None}
    at[EVENT_ID] = (document["event_metadata"] or {}).get("event_id")
    at.update({f"classifiers.{k}": v for k, v in document["classifiers"].items()})
    for path, value in at.items():
        assert indexed(path)
        assert index.names(path, [value]) == ({"x"} if value is not None else set()), path
    assert len(entries(obj)) == sum(v is not None for v in at.values())


def test_keys_are_the_matchers_equality() -> None:
    index = FindIndex()
    index.put("a", scan("a", n=1, b=True, s="1"))
    index.put("b", scan("b", n=1.0))
    assert index.names("classifiers.n", [1]) == {"a", "b"}  # 1 and 1.0 are one key
    assert index.names("classifiers.n", [True, "1"]) == set()  # True is not 1, nor "1"
    assert index.names("classifiers.b", [True]) == {"a"}
    assert index.names("classifiers.b", [1]) == set()
    assert index.names("classifiers.s", ["1", 2]) == {"a"}
    assert index.names(RUN_ID, [123, 124]) == {"a", "b"}


def test_a_new_version_replaces_the_old_and_a_discard_removes_it() -> None:
    index = FindIndex()
    index.put("a", scan("a", origin="alert"))
    index.put("a", scan("a", event={**EVENT, "runId": 7}, origin="gfu"))
    assert index.names("classifiers.origin", ["alert"]) == set()
    assert index.names("classifiers.origin", ["gfu"]) == {"a"}
    assert index.names(RUN_ID, [123]) == set()
    assert index.names(RUN_ID, [7]) == {"a"}
    index.discard("a")
    index.discard("a")  # twice is harmless
    assert index.names("classifiers.origin", ["gfu"]) == set()
    assert index._buckets == {} and index._held == {}


def test_indexed_paths() -> None:
    assert indexed(RUN_ID) and indexed(EVENT_ID) and indexed("classifiers.origin")
    assert not indexed("classifiers") and not indexed("classifiers.") and not indexed("classifiers.a.b")
    assert not indexed("event_metadata.mjd") and not indexed("priority")


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ({RUN_ID: 123}, [Lookup(RUN_ID, (123,))]),
        ({RUN_ID: {"$eq": 123, "$gt": 5}}, [Lookup(RUN_ID, (123,))]),
        ({RUN_ID: {"$in": [1, 2.0]}, "is_deleted": False}, [Lookup(RUN_ID, (1, 2.0))]),
        ({RUN_ID: {"$in": []}}, [Lookup(RUN_ID, ())]),  # matches nothing: no candidates
        (
            {"classifiers.tag": {"$all": ["a", "b"]}},
            [Lookup("classifiers.tag", ("a",)), Lookup("classifiers.tag", ("b",))],
        ),
        ({"$and": [{RUN_ID: 1}, {"$and": [{EVENT_ID: 2}]}]}, [Lookup(RUN_ID, (1,)), Lookup(EVENT_ID, (2,))]),
        (
            {RUN_ID: {"$eq": 1, "$all": [2, 3]}},
            [Lookup(RUN_ID, (1,)), Lookup(RUN_ID, (2,)), Lookup(RUN_ID, (3,))],
        ),
        # Not bounding: null also matches a missing field; arrays, objects, patterns, negations, $or
        ({RUN_ID: None}, []),
        ({RUN_ID: {"$in": [1, None]}}, []),
        ({RUN_ID: {"$in": [1, {"$regex": "1"}]}}, []),
        ({RUN_ID: {"$all": [1, None]}}, []),
        ({RUN_ID: {"$all": [1, [1]]}}, []),
        ({RUN_ID: {"$all": [1, {"$elemMatch": {"$gt": 0}}]}}, []),
        ({RUN_ID: [1]}, []),
        ({"classifiers.a": {"x": 1}}, []),
        ({RUN_ID: {"$ne": 1}}, []),
        ({RUN_ID: {"$nin": [1]}}, []),
        ({RUN_ID: {"$not": {"$eq": 1}}}, []),
        ({"$or": [{RUN_ID: 1}]}, []),
        ({"$nor": [{RUN_ID: 1}]}, []),
        ({"event_metadata": {"run_id": 1}}, []),
        ({"classifiers.a.b": 1}, []),
    ],
)
def test_the_conditions_that_bound_a_find(query: dict[str, Any], found: list[Lookup]) -> None:
    assert lookups(parse(query)) == found


@pytest.mark.parametrize(
    "query",
    [
        {"$and": 5},
        {"$and": [5, "x", None]},
        {"$and": {"a": 1}},
        {RUN_ID: {"$in": "123"}},  # a string is no list of values (its characters are not ids)
        {RUN_ID: {"$all": {"1": 2}}},
        {RUN_ID: {"$in": 7}},
    ],
)
def test_a_malformed_filter_is_refused_before_it_bounds_anything(query: dict[str, Any]) -> None:
    """The find reads its bounds from the parsed filter, so a malformed one never reaches them."""
    with pytest.raises(FilterError):
        parse(query)
