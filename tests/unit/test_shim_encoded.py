"""REST forms of live Scans kept encoded: only for the version the cache holds, bounded in bytes."""

from __future__ import annotations

import copy
from typing import Any

from api_shim.repository.cache import ScanCache
from api_shim.repository.encoded import FORM_OVERHEAD, FORMS_PER_SCAN, EncodedForms
from tests.unit.test_shim_cache_packing import waiting_scan

MANIFEST = ("manifest", None)


def version(obj: dict[str, Any], rv: int, **spec: Any) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    changed["metadata"]["resourceVersion"] = str(rv)
    changed["spec"].update(spec)
    return changed


def cache_of(*objs: dict[str, Any]) -> ScanCache:
    cache = ScanCache(None, "skyscan")  # type: ignore[arg-type]  # filled by hand: no API calls
    for obj in objs:
        cache.observe(obj)
    return cache


async def test_a_form_is_answered_for_the_version_it_was_built_from_only() -> None:
    obj = waiting_scan(1)
    cache = cache_of(obj)
    forms = EncodedForms(cache)
    assert forms.get("scan-00001", MANIFEST) is None
    forms.put(cache.get("scan-00001") or {}, MANIFEST, b"v1")
    assert forms.get("scan-00001", MANIFEST) == (b"v1", False)
    assert forms.get("scan-00001", ("status",)) is None  # another form of it: not built yet
    assert forms.builds == 1
    cache.observe(version(obj, 500, deleted=True))  # a write (or the watch) brings a new version
    assert forms.get("scan-00001", MANIFEST) is None
    forms.put(cache.get("scan-00001") or {}, MANIFEST, b"v2")
    assert forms.get("scan-00001", MANIFEST) == (b"v2", True)  # and it tells that version is deleted
    cache.forget(version(obj, 501))
    assert forms.get("scan-00001", MANIFEST) is None  # gone from the cache: never answered


async def test_copies_that_are_not_the_cache_version_are_never_kept() -> None:
    obj = waiting_scan(2)
    cache = cache_of(obj)
    forms = EncodedForms(cache)
    older = version(obj, 50)
    forms.put(older, MANIFEST, b"old")  # a copy the cache has moved past
    archived = copy.deepcopy(cache.get("scan-00002") or {})
    archived["status"]["archivedAt"] = 1700000000.0  # an archived copy: marked without a new version
    forms.put(archived, MANIFEST, b"archived")
    forms.put(waiting_scan(3), MANIFEST, b"not held")
    assert forms.get("scan-00002", MANIFEST) is None and forms.get("scan-00003", MANIFEST) is None
    assert forms.builds == 0 and forms.size == 0


async def test_forms_are_bounded_by_bytes_least_recently_read_dropped_first() -> None:
    objs = [waiting_scan(i) for i in range(10)]
    cache = cache_of(*objs)
    forms = EncodedForms(cache, budget=8 * (1000 + FORM_OVERHEAD))  # eight bodies of 1,000 bytes
    for i in range(8):
        forms.put(objs[i], MANIFEST, b"x" * 1000)
    assert forms.get("scan-00000", MANIFEST) is not None  # read again: the most recent now
    forms.put(objs[8], MANIFEST, b"x" * 1000)
    assert forms.size <= 8 * (1000 + FORM_OVERHEAD)
    assert forms.get("scan-00001", MANIFEST) is None  # the least recently read went first
    assert forms.get("scan-00000", MANIFEST) is not None and forms.get("scan-00008", MANIFEST) is not None
    forms.put(
        objs[9], MANIFEST, b"x" * (1000 + FORM_OVERHEAD + 1)
    )  # larger than an eighth of the budget: built each time
    assert forms.get("scan-00009", MANIFEST) is None


async def test_projections_of_one_scan_are_kept_up_to_a_bound() -> None:
    obj = waiting_scan(7)
    forms = EncodedForms(cache_of(obj))
    for i in range(FORMS_PER_SCAN + 5):
        forms.put(obj, ("manifest", frozenset({f"field{i}"})), b"{}")
    assert forms.builds == FORMS_PER_SCAN
    assert forms.get("scan-00007", ("manifest", frozenset({"field0"}))) is not None
    assert forms.get("scan-00007", ("manifest", frozenset({f"field{FORMS_PER_SCAN}"}))) is None
