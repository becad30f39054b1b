"""The filter -> SQL translation for finds over the archive (pure; tests/integration/test_find_archive.py
runs it against PostgreSQL)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import pytest

from api_shim.find import search as find
from api_shim.find.query import parse
from api_shim.find.sql import queries, translate
from tests.helpers import find_filter


@pytest.mark.parametrize(
    ("query", "text", "params", "exact"),
    [
        ({}, "TRUE", [], True),
        ({"event_metadata.run_id": 123}, "run_id = $2::bigint", [123], True),
        (
            {"event_metadata.run_id": 123.0, "is_deleted": False},
            "(run_id = $2::bigint) AND (NOT is_deleted)",
            [123],
            True,
        ),
        ({"event_metadata.run_id": 1.5}, "FALSE", [], True),  # an id is an integer
        ({"event_metadata.run_id": "1"}, "FALSE", [], True),
        ({"event_metadata.run_id": 10**400}, "FALSE", [], True),
        ({"event_metadata.run_id": {"$gt": 1.5}}, "run_id > $2::bigint", [1], True),
        ({"event_metadata.run_id": {"$lte": 1.5}}, "run_id < $2::bigint", [2], True),
        ({"event_metadata.run_id": {"$lt": 2**64}}, "run_id IS NOT NULL", [], True),
        ({"event_metadata.event_id": {"$ne": 7}}, "(event_id = $2::bigint) IS NOT TRUE", [7], True),
        ({"event_metadata.event_id": None}, "event_id IS NULL", [], True),
        ({"timestamp": {"$gte": 5}}, "created_at >= $2::float8", [5.0], True),
        ({"timestamp": {"$gte": 2**60}}, "TRUE", [], False),  # not one float
        ({"timestamp": float("nan")}, "TRUE", [], False),
        ({"scan_id": {"$lt": "b"}}, 'scan_id COLLATE "C" < $2::text', ["b"], True),
        (
            {"classifiers.k": "v"},
            "classifiers @> $2::jsonb OR classifiers @> $3::jsonb",
            [{"k": "v"}, {"k": ["v"]}],
            True,
        ),
        ({"classifiers.k": {"$exists": False}}, "NOT classifiers ? $2::text", ["k"], True),
        ({"classifiers.k": 10**20}, "TRUE", [], False),  # beyond 2**53: not compared as Python does
        ({"classifiers.k": {"$regex": "v"}}, "TRUE", [], False),
        ({"classifiers.k": {"$not": {"$regex": "v"}}}, "TRUE", [], False),  # never negates an inexact part
        ({"$nor": [{"priority": 1}]}, "TRUE", [], False),
        (
            {"$or": [{"scan_id": {"$regex": "x"}}, {"event_metadata.run_id": 1}]},
            "TRUE",
            [],
            False,
        ),  # no stray params
        (
            {"$or": [{"is_deleted": True}, {"event_metadata.run_id": 1}]},
            "(is_deleted) OR (run_id = $2::bigint)",
            [1],
            True,
        ),
        ({"items.0.k": 1}, "TRUE", [], False),  # an array index: jsonpath has no MongoDB's meaning
        (
            {"progress.summary": "x"},
            "jsonb_path_exists(manifest, $2::text::jsonpath, $3::jsonb, true)",
            ['lax $."progress"."summary" ? (@ == $v)', {"v": "x"}],
            False,
        ),
    ],
)
def test_translation(query: dict[str, Any], text: str, params: list[Any], exact: bool) -> None:
    find_filter(query)  # a checked filter
    where, got = translate(parse(query), first_param=2)
    assert (where.text, got, where.exact) == (text, params, exact)


def test_queries_select_one_namespace_in_code_point_order() -> None:
    count, select = queries("run_id = $2::bigint", 3)
    assert count.endswith("LIMIT $3::bigint) AS candidates")
    assert "namespace = $1 AND (run_id = $2::bigint)" in select
    assert select.endswith('ORDER BY scan_id COLLATE "C"')


def test_live_and_archived_answers_merge_in_id_order_a_scan_in_both_once_as_it_is_live() -> None:
    live = [{"scan_id": "a", "from": "live"}, {"scan_id": "c", "from": "live"}]
    archived = [{"scan_id": "b", "from": "archive"}, {"scan_id": "c", "from": "archive"}, {"scan_id": "d"}]
    merged = list(find.merge(iter(live), archived, itemgetter("scan_id")))
    assert [(m["scan_id"], m.get("from")) for m in merged] == [
        ("a", "live"), ("b", "archive"), ("c", "live"), ("d", None)
    ]  # fmt: skip
    assert list(find.merge(["a", "c"], ["b", "c", "d"], str)) == ["a", "b", "c", "d"]  # ids alike
