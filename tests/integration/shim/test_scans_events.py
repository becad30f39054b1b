"""GET /scans/events: the dashboard table's one stream, from a real shim over real HTTP, the Scans
changed on the real API server: the followed scans' rows as they change (a burst sent as its latest),
`new` when scans arrive, refusals, and a stopping shim closing it at once."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.shim.conftest import ShimUnderTest
from tests.integration.shim.test_events import Stream, streams_gauge

pytestmark = pytest.mark.timeout(60)


async def table(shim: ShimUnderTest, *scan_ids: str, as_: str = "user") -> Stream:
    response = await shim.session.get(
        f"{shim.url}/scans/events",
        headers={"Authorization": f"Bearer {shim.tokens[as_]}"},
        params=[("scan_id", scan_id) for scan_id in scan_ids],
    )
    assert response.status == 200, await response.text()
    assert response.content_type == "text/event-stream"
    return Stream(response)


async def test_the_followed_rows_then_each_change_and_a_note_when_scans_arrive(shim: ShimUnderTest) -> None:
    first, second = (await shim.launch(classifiers={"k": "<b>"}))["scan_id"], (await shim.launch())["scan_id"]
    stream = await table(shim, second, first, "not-a-scan", as_="viewer")
    opening = [
        await stream.message(),
        await stream.message(),
    ]  # the live ones' rows, by id; none for the unknown
    assert [e.kind for e in opening if e] == ["scan", "scan"]
    rows = {e.data["scan_id"]: e.data for e in opening if e}
    assert sorted(rows) == sorted([first, second])
    manifest = (await shim.call("GET", f"/scan/{first}/manifest")).body
    status = (await shim.call("GET", f"/scan/{first}/status")).body
    assert rows[first] == {
        **{k: manifest[k] for k in ("scan_id", "timestamp", "is_deleted", "priority", "classifiers")},
        "event_metadata": manifest["event_metadata"],
        "progress": manifest["progress"],
        "scan_state": status["scan_state"],
    }

    await shim.operator_writes(first, {"workflow": {"id": "wf-1", "address": "http://wms.test"}})
    changed = await stream.message()
    assert changed is not None and changed.kind == "scan" and changed.data["scan_id"] == first
    assert changed.data["scan_state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"

    obj = await shim.kube_scan(second)
    base = int(obj["metadata"]["resourceVersion"]) + 1000  # ahead of anything the watch brings meanwhile
    for i in range(50):  # a burst: fifty versions within one turn of the event loop
        shim.state.scans._cache.observe(
            {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(base + i)},
             "spec": {**obj["spec"], "priority": i}}
        )  # fmt: skip
    sent = []  # a version the watch brought before the burst may still be on its way: then one more
    while not sent or sent[-1] != (second, 49):
        got = await stream.message()
        assert got is not None and len(sent) < 3, sent
        sent.append((got.data["scan_id"], got.data["priority"]))
    assert len(sent) <= 2  # the fifty as one message (the latest), not fifty
    with pytest.raises(TimeoutError):  # nothing more is owed
        await stream.message(timeout=1.5)

    await shim.launch()
    arrived = await stream.message()
    assert arrived is not None and (arrived.kind, arrived.data) == ("new", {"count": 1})


async def test_who_may_follow_and_how_many(shim: ShimUnderTest) -> None:
    too_many = [("scan_id", f"s{i}") for i in range(201)]
    for params, as_, status in (
        (too_many, "user", 400),
        ([("scan_id", "")], "user", 400),
        ([("scan_id", "x" * 254)], "user", 400),
        ([], "system", 403),
        ([], "nobody", 401),
    ):
        reply = await shim.session.get(
            f"{shim.url}/scans/events",
            headers={"Authorization": f"Bearer {shim.tokens.get(as_, as_)}"},
            params=params,
        )
        assert reply.status == status, (as_, await reply.text())
        assert set(await reply.json()) == {"error", "reason", "message"}
        reply.close()


async def test_a_stopping_shim_closes_table_streams_at_once(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await table(shim, scan_id)
    assert await stream.message() is not None
    assert await streams_gauge(shim) == 1
    await asyncio.wait_for(shim.app.shutdown(), 5)
    assert await stream.next(timeout=5) is None
    assert await streams_gauge(shim) == 0
