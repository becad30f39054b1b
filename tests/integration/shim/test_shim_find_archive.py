"""`POST /scans/find` over live and archived scans together: the real shim, API server and PostgreSQL."""

from __future__ import annotations

import time

import pytest

from api_shim.find import search as find
from api_shim.find.query import FindLimits
from skyscan import manifest
from skyscan.io import payloads
from skyscan.io.archive import ArchivedScan
from skyscan.scan_record import compact
from tests.integration.shim.conftest import MakeShim, ShimUnderTest
from tests.integration.shim.test_shim_archive import EVENT_METADATA, archive_scan, finished
from tests.integration.shim.test_shim_find_wms import find as find_ids


@pytest.fixture
async def shim(archive_dsn: str, make_shim: MakeShim) -> ShimUnderTest:
    return await make_shim(archive_dsn=archive_dsn)


async def found(shim: ShimUnderTest, query: dict[str, object], **body: object) -> list[str]:
    return await find_ids(shim, filter=query, **body)


async def test_find_answers_over_both_stores_in_id_order_each_scan_once(
    shim: ShimUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = shim.state.scans._archive
    assert archive is not None
    ids = [await finished(shim, classifiers={"origin": "both", "k": k}) for k in range(4)]
    for scan_id in ids[:2]:
        await archive_scan(shim, archive, scan_id)
    # A scan archived while still live (a move not finished): its live copy wins, and counts once.
    live = await shim.kube_scan(ids[2])
    stale = {**manifest.of(live), "classifiers": {"origin": "both", "k": 99}}
    await archive.put(ArchivedScan(compact(live), stale, payloads.encode({}, "event"), None, time.time()))
    deleted = await shim.call("DELETE", f"/scan/{ids[3]}", json_body={"delete_completed_scan": True})
    assert deleted.status == 200, deleted.body  # soft-deleted: left out unless asked for

    assert await found(shim, {"classifiers.origin": "both"}) == ids[:3]
    assert await found(shim, {"classifiers.origin": "both"}, include_deleted=True) == ids
    assert await found(shim, {"classifiers.k": {"$in": [1, 2, 99]}}) == ids[1:3]
    assert (
        await found(shim, {"event_metadata.run_id": EVENT_METADATA["run_id"], "classifiers.k": 0}) == ids[:1]
    )
    assert await found(shim, {"scan_id": {"$gte": ids[1]}, "classifiers.origin": "both"}) == ids[1:3]
    projected = await shim.call(
        "POST", "/scans/find", json_body={"filter": {"classifiers.k": 0}, "manifest_projection": ["scan_id"]}
    )
    assert projected.body == {"manifests": [{"scan_id": ids[0]}]}

    monkeypatch.setattr(find, "LIMITS", FindLimits(max_archived=1))
    refused = await shim.call("POST", "/scans/find", json_body={"filter": {"classifiers.origin": "both"}})
    assert refused.status == 400
    assert refused.body["error"] == "Bad Request"
    assert "more than 1 archived scans" in refused.body["reason"]
    assert await found(shim, {"classifiers.k": 1}) == ids[1:2]  # a narrow one still answers
