"""A LIST response decoded one item at a time gives what one json.loads gives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api_shim.repository.listing import items

LISTS: list[dict[str, Any]] = [
    {"apiVersion": "skyscan.io/v1alpha1", "items": [{"metadata": {"name": "a"}}, {"spec": {"x": [1, 2]}}],
     "kind": "ScanList", "metadata": {"resourceVersion": "5", "continue": "tok"}},
    {"items": [], "metadata": {"resourceVersion": "1"}},
    {"metadata": {"resourceVersion": "2"}, "items": [{"k": "v ] , }"}], "kind": "L"},  # items not first
    {"items": None, "metadata": {}},
]  # fmt: skip


@pytest.mark.parametrize("listed", LISTS)
@pytest.mark.parametrize("indent", [None, 2])
def test_items_and_the_rest_are_decoded(listed: dict[str, Any], indent: int | None) -> None:
    rest: dict[str, Any] = {}
    assert list(items(json.dumps(listed, indent=indent), rest)) == (listed["items"] or [])
    assert rest["metadata"] == listed["metadata"]
    assert {k for k in rest if k != "items"} == set(listed) - {"items"}


@pytest.mark.parametrize("text", ['{"items": [{"a": 1},', '{"items": [1 2]}', "[]", '{"a" 1}', ""])
def test_a_truncated_or_malformed_list_raises(text: str) -> None:
    with pytest.raises(ValueError):
        list(items(text, {}))
