"""What a shim keeps between finds (`api_shim.find.search`): a find asked before, by its body's bytes,
and the manifests answered to finds of a few scans, encoded once per version of their Scan; each kept
within its bounds, the least recently used dropped first."""

from __future__ import annotations

from typing import Any

import pytest

from api_shim.errors import ApiError
from api_shim.find import index
from api_shim.find import search as find
from api_shim.find.query import FindLimits, parse
from api_shim.wire_names import Names
from tests.helpers import find_filter


class _Live:
    """Where a find keeps what it asked (a shim's cache, to the find)."""


def new_live() -> Any:
    return _Live()


FIELDS = frozenset({"scan_id", "x"})


def manifest(scan_id: str, x: str = "", **more: Any) -> dict[str, Any]:
    return {"scan_id": scan_id, "x": x, **more}


def encoded_length(scan_id: str, x: str) -> int:
    return len(f'{{"scan_id": "{scan_id}", "x": "{x}"}}')


# --- finds asked before


def test_a_find_is_parsed_with_its_bounds_and_compiled_when_it_has_no_pattern() -> None:
    live = new_live()
    query = {"classifiers.i": 1, "priority": {"$gt": 2}}
    asked = find.ask(live, b"{}", query, ["scan_id", "priority"])
    assert asked.query == parse(query)
    assert asked.fields == frozenset({"scan_id", "priority"})
    assert asked.lookups == index.lookups(parse(query)) != []
    assert asked.exact is None  # priority is not indexed
    assert asked.compiled is not None and asked.compiled.cost == find_filter(query).cost
    assert asked.compiled.matches({"classifiers": {"i": 1}, "priority": 3})
    assert not asked.compiled.matches({"classifiers": {"i": 1}, "priority": 2})
    ids = find.ask(live, b"{}", {"classifiers.i": 1}, ["scan_id"])
    assert ids.exact == index.exact(parse({"classifiers.i": 1})) is not None
    manifests = find.ask(live, b"{}", {"classifiers.i": 1}, ["scan_id", "priority"])
    assert manifests.exact is None  # the index alone answers ids, not the manifests projected
    with_pattern = find.ask(live, b"{}", {"a": {"$regex": "x"}}, ["scan_id"])
    assert with_pattern.compiled is None  # compiled a slice at a time, as the find runs


def test_a_find_is_held_to_the_finds_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "LIMITS", FindLimits(max_nodes=3))
    find.ask(new_live(), b"{}", {"a": [1]}, ())  # the filter, the array and its element
    with pytest.raises(ApiError) as refused:
        find.ask(new_live(), b"{}", {"a": [1, 2]}, ())
    assert refused.value.reason == "invalid filter: the filter has more than 3 keys, values and elements"


async def test_a_find_asked_before_is_not_compiled_again() -> None:
    asked = find.ask(new_live(), b"{}", {"a": 1}, ())
    assert asked.compiled is not None
    assert await find.compile_in_slices(asked, 10) is asked.compiled


def test_a_find_is_kept_by_its_bodys_bytes_when_it_is_small_and_has_no_pattern() -> None:
    live = new_live()
    small = b" " * find.KEPT_BODY_BYTES
    asked = find.ask(live, small, {"a": 1}, ())
    assert find.asked_before(live, small) is asked
    large = b" " * (find.KEPT_BODY_BYTES + 1)
    find.ask(live, large, {"a": 1}, ())
    assert find.asked_before(live, large) is None
    find.ask(live, b"pattern", {"a": {"$regex": "x"}}, ())
    assert find.asked_before(live, b"pattern") is None
    assert find.asked_before(new_live(), small) is None  # each shim its own


def test_the_finds_kept_are_bounded_the_least_recently_asked_dropped_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(find, "KEPT_ASKS", 2)
    live = new_live()
    find.ask(live, b"1", {"a": 1}, ())
    find.ask(live, b"2", {"a": 2}, ())
    assert find.asked_before(live, b"1") is not None  # now the most recent
    find.ask(live, b"3", {"a": 3}, ())
    assert [body for body in (b"1", b"2", b"3") if find.asked_before(live, body)] == [b"1", b"3"]


# --- manifests answered, kept encoded


async def test_a_manifest_is_encoded_as_a_find_of_many_encodes_it() -> None:
    document = manifest("s", "y", wms_task="t", priority=3)
    for fields in (FIELDS, frozenset({"wms_task", "priority"}), frozenset()):
        for names in Names:
            many = b"".join(await find.encode_manifests(iter([(1, document)]), fields, names))
            few = find._Finds().encoded((1, document), fields, names)
            assert b'{"manifests": [' + few + b"]}" == many, (fields, names)
    assert b'"ewms_task": "t"' in find._Finds().encoded(
        (1, document), frozenset({"wms_task"}), Names.REFERENCE
    )


def test_a_manifest_is_encoded_once_per_version_of_its_scan() -> None:
    finds = find._Finds()
    first = finds.encoded((1, manifest("s", "a")), FIELDS, Names.INTERFACE)
    assert first == b'{"scan_id": "s", "x": "a"}'
    assert finds.encoded((1, manifest("s", "changed")), FIELDS, Names.INTERFACE) is first  # kept
    second = finds.encoded((2, manifest("s", "bb")), FIELDS, Names.INTERFACE)
    assert second == b'{"scan_id": "s", "x": "bb"}'
    assert finds.answered == {("s", FIELDS, Names.INTERFACE): (2, second)}  # in place of the first
    assert finds.answered_bytes == len(second)
    # Another projection, or the other names, is another answer.
    finds.encoded((2, manifest("s", "bb")), frozenset({"scan_id"}), Names.INTERFACE)
    finds.encoded((2, manifest("s", "bb")), FIELDS, Names.REFERENCE)
    assert len(finds.answered) == 3
    assert finds.answered_bytes == sum(len(body) for _, body in finds.answered.values())


def test_an_archived_manifest_is_not_kept() -> None:
    finds = find._Finds()
    assert finds.encoded((0, manifest("s", "a")), FIELDS, Names.INTERFACE) == b'{"scan_id": "s", "x": "a"}'
    assert finds.answered == {} and finds.answered_bytes == 0
    assert finds.encoded((0, manifest("s", "b")), FIELDS, Names.INTERFACE) == b'{"scan_id": "s", "x": "b"}'


def test_a_manifest_is_kept_up_to_a_32nd_of_the_bytes_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "KEPT_ANSWER_BYTES", 32 * 40)
    finds = find._Finds()
    fits, beyond = "a" * 15, "a" * 16
    assert encoded_length("s", fits) == 40
    finds.encoded((1, manifest("s", fits)), FIELDS, Names.INTERFACE)
    finds.encoded((1, manifest("t", beyond)), FIELDS, Names.INTERFACE)
    assert list(finds.answered) == [("s", FIELDS, Names.INTERFACE)]
    assert finds.answered_bytes == 40


def test_the_manifests_kept_are_bounded_the_least_recently_answered_dropped_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(find, "KEPT_ANSWER_BYTES", 32 * 40)
    finds = find._Finds()
    names = [f"s{i:02d}" for i in range(32)]
    x = "a" * (40 - encoded_length("s00", ""))
    for name in names:  # exactly the bytes kept
        finds.encoded((1, manifest(name, x)), FIELDS, Names.INTERFACE)
    assert finds.answered_bytes == 32 * 40 and len(finds.answered) == 32
    kept = finds.encoded((1, manifest("s00", "other")), FIELDS, Names.INTERFACE)  # now the most recent
    finds.encoded((1, manifest("new", "a")), FIELDS, Names.INTERFACE)
    assert [key[0] for key in finds.answered] == [*names[2:], "s00", "new"]
    assert finds.answered_bytes == sum(len(body) for _, body in finds.answered.values())
    assert finds.encoded((1, manifest("s00", "other")), FIELDS, Names.INTERFACE) is kept
