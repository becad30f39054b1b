"""GET /scan/{id}/events: Server-Sent Events from a real shim over real HTTP, the Scans changed on the real
API server (as the operator and the scanner change them)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from skyscan.io.archive import Archive
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, ShimUnderTest
from tests.integration.shim.test_shim_archive import archive_scan

pytestmark = pytest.mark.timeout(60)
PROGRESS = {
    "summary": "s",
    "epilogue": "",
    "tallies": {"done": 3},
    "processing_stats": {"start": {}, "runtime": {}, "rate": {"pixels/s": 1.5}},
    "predictive_scanning_threshold": 1.0,
    "last_updated": "2026-11-23 18:00:00",
}


@dataclass
class Event:
    kind: str  # the `event:` field; "comment" for a comment line
    id: str | None
    data: Any


class Stream:
    """A client's reading of an event stream, message by message."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = 10.0) -> Event | None:
        """The next message or comment; None once the server closed the stream."""
        fields: dict[str, str] = {}
        async with asyncio.timeout(timeout):
            while True:
                line = (await self.response.content.readline()).decode()
                if not line:
                    return None
                line = line.rstrip("\n")
                if line.startswith(":"):
                    return Event("comment", None, line[1:].strip())
                if line:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                elif fields:
                    return Event(fields.get("event", "message"), fields.get("id"), json.loads(fields["data"]))

    async def message(self, timeout: float = 10.0) -> Event | None:
        """The next message (comments skipped)."""
        while (event := await self.next(timeout)) is not None and event.kind == "comment":
            pass
        return event


async def follow(shim: ShimUnderTest, scan_id: str, as_: str | None = "user", **params: str) -> Stream:
    headers = {"Authorization": f"Bearer {shim.tokens[as_]}"} if as_ else {}
    response = await shim.session.get(
        f"{shim.url}/scan/{scan_id}/events", headers=headers, params=params, allow_redirects=False
    )
    assert response.status == 200, await response.text()
    assert response.content_type == "text/event-stream"
    return Stream(response)


async def streams_gauge(shim: ShimUnderTest) -> float:
    reply = await shim.call("GET", "/metrics", as_=None)
    line = next(x for x in reply.body.decode().splitlines() if x.startswith("skyscan_shim_event_streams "))
    return float(line.split()[1])


async def test_the_current_state_then_each_change_then_end(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id, Last_Event_ID="1")  # accepted, and the current state comes first
    first = await stream.message()
    assert first is not None and first.kind == "scan"
    assert first.id == (await shim.kube_scan(scan_id))["metadata"]["resourceVersion"]
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    assert first.data == {"scan_id": scan_id, "status": status, "progress": None, "result": None}

    # The operator records a workflow: a PATCH of the Scan's status on the API server.
    await shim.operator_writes(scan_id, {"workflow": {"id": "wf-1", "address": "http://wms.test"}})
    second = await stream.message()
    assert second is not None and int(second.id or 0) > int(first.id or 0)
    assert second.data["status"]["scan_state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"
    assert second.data["status"]["wms_workforce"]["workflow_id"] == "wf-1"

    # The scanner reports progress, then a partial and a final result, through the shim.
    progress = {"progress": PROGRESS}
    reply = await shim.call("PATCH", f"/scan/{scan_id}/manifest", as_="system", json_body=progress)
    assert reply.status == 200, reply.body
    third = await stream.message()
    assert third is not None and third.data["progress"]["tallies"] == {"done": 3}
    assert third.data["status"]["scan_state"] == "IN_PROGRESS__PARTIAL_RESULT_GENERATED"
    for is_final in (False, True):
        body = {"scan_result": {"x": 1}, "is_final": is_final}
        assert (await shim.call("PUT", f"/scan/{scan_id}/result", as_="system", json_body=body)).status == 200
        event = await stream.message()
        assert event is not None and event.kind == "scan" and event.data["result"] == {"is_final": is_final}
        assert event.data["status"]["scan_complete"] is is_final
    end = await stream.message()
    assert end is not None and end.kind == "end" and end.data == {}
    assert await stream.next() is None  # closed


async def test_a_follower_gets_the_latest_state_never_a_backlog(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id)
    assert await stream.message() is not None
    obj = await shim.kube_scan(scan_id)
    base = int(obj["metadata"]["resourceVersion"]) + 1000  # ahead of anything the watch brings meanwhile
    for i in range(50):  # fifty versions reach the cache within one turn of the event loop
        shim.state.scans._cache.observe(
            {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(base + i)},
             "status": {"workflow": {"id": f"wf-{i}", "address": "http://wms.test"}}}
        )  # fmt: skip
    latest = await stream.message()
    assert latest is not None and latest.id == str(base + 49)
    assert latest.data["status"]["wms_workforce"]["workflow_id"] == "wf-49"
    with pytest.raises(TimeoutError):  # one message for the fifty: nothing else is owed
        await stream.next(timeout=1)


async def test_a_soft_deleted_scan_with_nothing_running_ends_the_stream(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id, as_="system")
    assert (await stream.message()) is not None
    assert (await shim.call("DELETE", f"/scan/{scan_id}", json_body={})).status == 200
    deleted = await stream.message()
    assert deleted is not None and deleted.data["status"]["is_deleted"] is True
    end = await stream.message()
    assert end is not None and end.kind == "end"
    assert await stream.next() is None


@pytest.mark.parametrize(
    "ending",
    [
        {"workflow": {"id": "wf-1", "address": "http://wms.test", "deactivated": "ABORTED"}},
        {"conditions": [{"type": "Failed", "status": "True", "reason": "StartFailed", "message": "m",
                         "lastTransitionTime": "2026-11-23T18:00:00Z"}]},
    ],
    ids=["aborted", "failed"],
)  # fmt: skip
async def test_an_aborted_or_failed_scan_ends_the_stream(shim: ShimUnderTest, ending: dict[str, Any]) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id)
    assert await stream.message() is not None
    await shim.operator_writes(scan_id, ending)
    last = await stream.message()
    assert last is not None and last.kind == "scan" and last.data["status"]["scan_complete"] is False
    end = await stream.message()
    assert end is not None and end.kind == "end"
    assert await stream.next() is None


async def test_roles_unknown_ids_and_redirects(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    for role in ("user", "system"):
        event = await (await follow(shim, scan_id, as_=role)).message()
        assert event is not None and event.data["scan_id"] == scan_id
    for token in (None, "wrong"):
        reply = await shim.call("GET", f"/scan/{scan_id}/events", as_=token)
        assert reply.status == 401 and reply.body["reason"] == "authentication failed"
    reply = await shim.call("GET", "/scan/0000000000ax4000000000000000000/events")
    assert reply.status == 404 and set(reply.body) == {"error", "reason", "message"}

    rescan = await shim.call("POST", f"/scan/{scan_id}/actions/rescan", json_body={"replace_scan": True})
    assert rescan.status == 200, rescan.body
    new = rescan.body["scan_id"]
    moved = await shim.call("GET", f"/scan/{scan_id}/events")
    assert moved.status == 302 and moved.headers["Location"].endswith(f"/scan/{new}/events")
    kept = await (await follow(shim, scan_id, no_redirect="true")).message()
    assert kept is not None and kept.data["scan_id"] == scan_id


async def test_keepalives_and_a_client_that_leaves_frees_its_stream(make_shim: MakeShim) -> None:
    shim = await make_shim(event_keepalive_seconds=0.2)
    scan_id = (await shim.launch())["scan_id"]
    stream, other = await follow(shim, scan_id), await follow(shim, scan_id)
    assert (await stream.message()) is not None and (await other.message()) is not None
    comment = await stream.next(timeout=2)
    assert comment is not None and comment.kind == "comment" and comment.data == "keepalive"
    assert await streams_gauge(shim) == 2
    assert scan_id in shim.state.scans._cache._followers  # one channel for both streams

    stream.response.close()  # the client goes away without a word
    assert await eventually(lambda: _equals(streams_gauge(shim), 1), timeout=10, interval=0.1)
    assert scan_id in shim.state.scans._cache._followers  # the other still follows
    other.response.close()
    assert await eventually(lambda: _equals(streams_gauge(shim), 0), timeout=10, interval=0.1)
    assert scan_id not in shim.state.scans._cache._followers


async def _equals(value: Any, expected: float) -> bool:
    return bool(await value == expected)


async def test_the_cap_answers_503_beyond_it(make_shim: MakeShim) -> None:
    shim = await make_shim(max_event_streams=1)
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id)
    assert await stream.message() is not None
    reply = await shim.call("GET", f"/scan/{scan_id}/events")
    assert reply.status == 503 and reply.body["reason"] == "too many event streams"
    assert "GET /scan/{id}/status" in reply.body["message"]


async def test_a_stopping_shim_closes_its_streams_at_once(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id)
    assert await stream.message() is not None
    await asyncio.wait_for(shim.app.shutdown(), 5)  # what the server runs first when it stops
    assert await stream.next(timeout=5) is None  # closed, with no `end`: its client follows anew
    assert await streams_gauge(shim) == 0


async def test_a_scan_that_moves_to_the_archive_ends_its_streams(
    archive_dsn: str, make_shim: MakeShim, archive: Archive
) -> None:
    shim = await make_shim(archive_dsn=archive_dsn)  # archive_dsn first: its database outlives the shim
    scan_id = (await shim.launch())["scan_id"]
    stream = await follow(shim, scan_id)
    assert await stream.message() is not None
    await archive_scan(shim, archive, scan_id)  # as the operator moves a scan, unchanged since it was sent
    end = await stream.message()
    assert end is not None and end.kind == "end"

    archived = await follow(shim, scan_id)  # an archived scan: its last state, then the end
    last = await archived.message()
    assert last is not None and last.kind == "scan"
    assert last.data["status"] == (await shim.call("GET", f"/scan/{scan_id}/status")).body
    end = await archived.message()
    assert end is not None and end.kind == "end"
