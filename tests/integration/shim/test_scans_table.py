"""GET /scans: the dashboard's table from a real shim over real HTTP, the Scans on the real API server
and, archived, in a real PostgreSQL: pages newest first whose cursors chain without a gap or a repeat,
across live and archived scans; filters by classifier, run/event, state and time; refusals as 400s."""

from __future__ import annotations

from typing import Any

import pytest

from skyscan.io.archive import Archive
from tests.integration.shim.conftest import MakeShim, ShimUnderTest
from tests.integration.shim.test_shim_archive import archive_scan

pytestmark = pytest.mark.timeout(120)


async def table(shim: ShimUnderTest, as_: str = "user", **params: Any) -> dict[str, Any]:
    reply = await shim.call("GET", "/scans", as_=as_, params={k: str(v) for k, v in params.items()})
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def every_page(shim: ShimUnderTest, **params: Any) -> list[list[str]]:
    """Each page's scan ids, following `next` until the last."""
    pages, before = [], None
    while True:
        found = await table(shim, **params, **({"before": before} if before else {}))
        pages.append([row["scan_id"] for row in found["scans"]])
        if (before := found["next"]) is None:
            return pages
        assert before == pages[-1][-1]


async def test_pages_newest_first_chain_and_filters_choose(shim: ShimUnderTest) -> None:
    ids = [(await shim.launch(classifiers={"kind": "odd" if i % 2 else "even"}))["scan_id"] for i in range(7)]
    newest_first = sorted(ids, reverse=True)
    assert await every_page(shim, limit=3) == [newest_first[:3], newest_first[3:6], newest_first[6:]]
    assert [r for p in await every_page(shim, limit=2, classifier="kind=odd") for r in p] == sorted(
        ids[1::2], reverse=True
    )

    first = (await table(shim, limit=1))["scans"][0]
    manifest = (await shim.call("GET", f"/scan/{first['scan_id']}/manifest")).body
    assert first == {
        **{k: manifest[k] for k in ("scan_id", "timestamp", "is_deleted", "priority", "classifiers")},
        "event_metadata": None,
        "progress": None,
        "scan_state": "PENDING__PRESTARTUP",
    }

    # The scanner reports its event; the operator records a workflow for another scan.
    meta = {"run_id": 1234, "event_id": 56, "event_type": "t", "mjd": 60000.5, "is_real_event": True}
    reply = await shim.call(
        "PATCH", f"/scan/{ids[2]}/manifest", as_="system", json_body={"event_metadata": meta}
    )
    assert reply.status == 200, reply.body
    await shim.operator_writes(ids[4], {"workflow": {"id": "wf-1", "address": "http://wms.test"}})
    assert await every_page(shim, run_id=1234, event_id=56) == [[ids[2]]]
    assert await every_page(shim, run_id=1234, event_id=57) == [[]]
    assert await every_page(shim, state="WAITING_ON_SCANNER_SERVER_STARTUP") == [[ids[4]]]
    waiting = await every_page(shim, state="PENDING__PRESTARTUP", limit=10)
    assert waiting == [sorted(set(ids) - {ids[4]}, reverse=True)]

    created = [row["timestamp"] for row in (await table(shim, limit=7))["scans"]]
    since, until = sorted(created)[2], sorted(created)[5]
    windowed = (await table(shim, since=since, until=until))["scans"]
    assert windowed and all(since <= row["timestamp"] < until for row in windowed)

    deleted = await shim.call("DELETE", f"/scan/{ids[6]}", json_body={})
    assert deleted.status == 200, deleted.body
    assert ids[6] not in [r for p in await every_page(shim, limit=10) for r in p]
    assert ids[6] in [r for p in await every_page(shim, limit=10, deleted="true", as_="viewer") for r in p]


async def test_archived_scans_join_the_pages_on_demand(
    archive_dsn: str, make_shim: MakeShim, archive: Archive
) -> None:
    shim = await make_shim(archive_dsn=archive_dsn)
    ids = [(await shim.launch())["scan_id"] for _ in range(6)]
    for scan_id in ids[1::2]:  # every other one moves to the archive
        await archive_scan(shim, archive, scan_id)
    newest_first = sorted(ids, reverse=True)
    live = [i for i in newest_first if i not in ids[1::2]]
    assert await every_page(shim, limit=2) == [live[:2], live[2:]]
    assert await every_page(shim, limit=4, archived="true") == [newest_first[:4], newest_first[4:]]
    archived_row = next(r for r in (await table(shim, archived="true"))["scans"] if r["scan_id"] == ids[1])
    assert archived_row["scan_state"] == "PENDING__PRESTARTUP"


async def test_what_the_table_refuses(shim: ShimUnderTest) -> None:
    for params in (
        {"nope": "1"},
        {"limit": "0"},
        {"limit": "201"},
        {"run_id": "abc"},
        {"run_id": "9" * 20},
        {"classifier": "novalue"},
        {"classifier": "$where=1"},
        {"classifier": "a.b=1"},
        {"since": "nan"},
        {"until": "later"},
        {"state": "aborted"},
        {"archived": "yes"},
        {"before": "x" * 254},
    ):
        reply = await shim.call("GET", "/scans", params=params)
        assert reply.status == 400, params
        assert set(reply.body) == {"error", "reason", "message"}, params
    twice = await shim.call("GET", "/scans?limit=1&limit=2")
    assert (twice.status, twice.body["reason"]) == (400, "limit: give it once")
    assert (await shim.call("GET", "/scans", as_="system")).status == 403
