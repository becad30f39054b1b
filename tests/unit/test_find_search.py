"""What a shim keeps between finds (`api_shim.find.search.Finds`): a find asked before, by its body's
bytes, kept within its bound, the least recently used dropped first; and the manifests answered to finds
of a few scans, encoded once per version of their Scan among the forms the shim's GETs keep."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api_shim.errors import ApiError
from api_shim.find import index
from api_shim.find import search as find
from api_shim.find.query import FindLimits, parse
from api_shim.repository.cache import ScanCache
from api_shim.repository.encoded import EncodedForms
from api_shim.wire_names import Names
from tests.helpers import find_filter
from tests.unit.test_shim_cache_packing import waiting_scan

FIELDS = frozenset({"scan_id", "x"})


def new_finds(*scans: dict[str, Any]) -> find.Finds:
    """A shim's finds over a cache holding `scans` (filled by hand: no API calls), no archive."""
    cache = ScanCache(None, "skyscan")  # type: ignore[arg-type]
    for scan in scans:
        cache.observe(scan)
    return find.Finds(cache, None, "skyscan", EncodedForms(cache))


def manifest(scan_id: str, x: str = "", **more: Any) -> dict[str, Any]:
    return {"scan_id": scan_id, "x": x, "is_deleted": False, **more}


# --- finds asked before


def test_a_find_is_parsed_with_its_bounds_and_compiled_when_it_has_no_pattern() -> None:
    finds = new_finds()
    query = {"classifiers.i": 1, "priority": {"$gt": 2}}
    asked = finds.ask(b"{}", query, ["scan_id", "priority"])
    assert asked.query == parse(query)
    assert asked.fields == frozenset({"scan_id", "priority"})
    assert asked.lookups == index.lookups(parse(query)) != []
    assert asked.exact is None  # priority is not indexed
    assert asked.compiled is not None and asked.compiled.cost == find_filter(query).cost
    assert asked.compiled.matches({"classifiers": {"i": 1}, "priority": 3})
    assert not asked.compiled.matches({"classifiers": {"i": 1}, "priority": 2})
    ids = finds.ask(b"{}", {"classifiers.i": 1}, ["scan_id"])
    assert ids.exact == index.exact(parse({"classifiers.i": 1})) is not None
    manifests = finds.ask(b"{}", {"classifiers.i": 1}, ["scan_id", "priority"])
    assert manifests.exact is None  # the index alone answers ids, not the manifests projected
    with_pattern = finds.ask(b"{}", {"a": {"$regex": "x"}}, ["scan_id"])
    assert with_pattern.compiled is None  # compiled a slice at a time, as the find runs


def test_a_find_is_held_to_the_finds_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "LIMITS", FindLimits(max_nodes=3))
    new_finds().ask(b"{}", {"a": [1]}, ())  # the filter, the array and its element
    with pytest.raises(ApiError) as refused:
        new_finds().ask(b"{}", {"a": [1, 2]}, ())
    assert refused.value.reason == "invalid filter: the filter has more than 3 keys, values and elements"


async def test_a_find_asked_before_is_not_compiled_again() -> None:
    asked = new_finds().ask(b"{}", {"a": 1}, ())
    assert asked.compiled is not None
    assert await find.compile_in_slices(asked, 10) is asked.compiled


def test_a_find_is_kept_by_its_bodys_bytes_when_it_is_small_and_has_no_pattern() -> None:
    finds = new_finds()
    small = b" " * find.KEPT_BODY_BYTES
    asked = finds.ask(small, {"a": 1}, ())
    assert finds.asked_before(small) is asked
    large = b" " * (find.KEPT_BODY_BYTES + 1)
    finds.ask(large, {"a": 1}, ())
    assert finds.asked_before(large) is None
    finds.ask(b"pattern", {"a": {"$regex": "x"}}, ())
    assert finds.asked_before(b"pattern") is None
    assert new_finds().asked_before(small) is None  # each shim its own


def test_the_finds_kept_are_bounded_the_least_recently_asked_dropped_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(find, "KEPT_ASKS", 2)
    finds = new_finds()
    finds.ask(b"1", {"a": 1}, ())
    finds.ask(b"2", {"a": 2}, ())
    assert finds.asked_before(b"1") is not None  # now the most recent
    finds.ask(b"3", {"a": 3}, ())
    assert [body for body in (b"1", b"2", b"3") if finds.asked_before(body)] == [b"1", b"3"]


# --- manifests answered, kept encoded


async def test_a_manifest_is_encoded_as_a_find_of_many_encodes_it() -> None:
    document = manifest("s", "y", wms_task="t", priority=3)
    for fields in (FIELDS, frozenset({"wms_task", "priority"}), frozenset()):
        for names in Names:
            many = b"".join(await find.encode_manifests(iter([(1, document)]), fields, names))
            few = new_finds().encoded((1, document), fields, names)
            assert b'{"manifests": [' + few + b"]}" == many, (fields, names)
    assert b'"ewms_task": "t"' in new_finds().encoded((1, document), frozenset({"wms_task"}), Names.REFERENCE)


def test_a_live_manifest_is_encoded_once_per_version_of_its_scan_among_the_shims_forms() -> None:
    scan = waiting_scan(1)
    finds = new_finds(scan)
    first = finds.encoded((101, manifest("scan-00001", "a")), FIELDS, Names.INTERFACE)
    assert first == b'{"scan_id": "scan-00001", "x": "a"}'
    assert finds.encoded((101, manifest("scan-00001", "changed")), FIELDS, Names.INTERFACE) is first  # kept
    form = ("find", FIELDS, Names.INTERFACE)
    assert finds.forms.get("scan-00001", form) == (first, False)  # among the forms a GET reads
    # Another projection, or the other names, is another form.
    assert finds.encoded((101, manifest("scan-00001", "b")), FIELDS, Names.REFERENCE) != first
    changed = copy.deepcopy(scan)
    changed["metadata"]["resourceVersion"] = "102"
    finds.live.observe(changed)  # type: ignore[attr-defined]  # the cache holds a new version
    second = finds.encoded((102, manifest("scan-00001", "bb")), FIELDS, Names.INTERFACE)
    assert second == b'{"scan_id": "scan-00001", "x": "bb"}'
    assert finds.forms.get("scan-00001", form) == (second, False)


def test_only_the_version_the_cache_holds_is_kept_never_an_archived_one() -> None:
    finds = new_finds(waiting_scan(1))
    form = ("find", FIELDS, Names.INTERFACE)
    # An archived manifest (version 0), and a version the cache has moved past: encoded, not kept.
    for version, x in ((0, "archived"), (100, "older"), (0, "archived again"), (100, "older again")):
        body = finds.encoded((version, manifest("scan-00001", x)), FIELDS, Names.INTERFACE)
        assert body == f'{{"scan_id": "scan-00001", "x": "{x}"}}'.encode()
    assert finds.forms.get("scan-00001", form) is None
    # The current version kept is not answered for a find that read an older one.
    finds.encoded((101, manifest("scan-00001", "now")), FIELDS, Names.INTERFACE)
    older = finds.encoded((100, manifest("scan-00001", "then")), FIELDS, Names.INTERFACE)
    assert older == b'{"scan_id": "scan-00001", "x": "then"}'
