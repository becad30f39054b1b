"""Every REST route on archived scans, as on live ones: the shim against the real API server and the
real PostgreSQL archive, with scans moved the way the operator moves them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from skyscan import manifest, names
from skyscan.io import payloads
from skyscan.io.archive import Archive, ArchivedScan
from skyscan.io.kube import core_path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan.scan_record import ScanRecord, compact
from skyscan_local.processes import free_port
from tests.conftest import ArchiveServer
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, ShimUnderTest, scan_body
from tests.integration.shim.test_shim_scanner_auth import mint, running

EVENT_METADATA = {"run_id": 137, "event_id": 42, "event_type": "gold", "mjd": 60000.5, "is_real_event": True}
FINISHED = {
    "workflow": {"id": "wf-old", "address": "http://wms.test", "deactivated": "FINISHED"},
    "workforce": {"statuses": {"DONE": {"x": 3}}, "nRunning": 0, "topErrors": {}},
    "taskforces": [{"taskforce_uuid": "tf1", "n_workers": 3, "cluster_location": "osg"}],
}
READS = [  # (path below /scan/{id}, query, roles that may read it)
    ("", {}, ("user", "system")),
    ("/manifest", {}, ("user", "system")),
    ("/manifest", {"projection": "scan_id|event_metadata|progress"}, ("user",)),
    ("/result", {}, ("user",)),
    ("/sensor-event", {}, ("user", "system")),
    ("/status", {}, ("user", "system")),
    ("/logs", {}, ("user",)),
    ("/wms/workflow-id", {}, ("user", "system")),
    ("/wms/workforce", {}, ("user", "system")),
    ("/wms/taskforces", {}, ("user", "system")),
]


@pytest.fixture
async def shim(archive_dsn: str, make_shim: MakeShim) -> ShimUnderTest:
    # archive_dsn first: its database is dropped only after the shim (and its pool) has stopped.
    return await make_shim(archive_dsn=archive_dsn)


async def archive_scan(shim: ShimUnderTest, archive: Archive, scan_id: str) -> None:
    """Move a scan as the operator does: read it and its payloads, store them in one put, delete the
    Scan only as it was read; then wait until the shim's cache no longer holds it and the garbage
    collector has removed the result and startup objects the Scan owned. (The Scan owns its live
    event by then: the operator makes it an owner of the event stored for it at its first look.)"""
    obj = await shim.kube_scan(scan_id)
    ns, event_id = shim.namespace, obj["spec"]["sensorEventId"]
    event = await payloads.stored(shim.api, ns, names.event_object_name(event_id))
    if event is not None:
        await payloads.add_event_owner(shim.api, ns, event_id, obj)
    event = event or await archive.event(event_id)
    assert event is not None
    result = (
        await payloads.stored(shim.api, ns, names.result_object_name(scan_id))
        if ScanRecord(obj).has_result
        else None
    )
    await archive.put(ArchivedScan(compact(obj), manifest.of(obj), event, result, time.time()))
    unchanged = {k: obj["metadata"][k] for k in ("uid", "resourceVersion")}
    await shim.api.request("DELETE", scan_path(ns, scan_id), body={"preconditions": unchanged})

    async def dropped() -> bool:
        owned = (names.result_object_name(scan_id), names.startup_object_name(scan_id))
        return shim.state.scans.live(scan_id) is None and all(
            [await payloads.stored(shim.api, ns, name) is None for name in owned]
        )

    await eventually(dropped, timeout=30)


async def finished(shim: ShimUnderTest, **changes: Any) -> str:
    """A scan that ran to its end: metadata and a final result from the scanner, the workflow finished."""
    scan_id = str((await shim.launch(**changes))["scan_id"])
    patched = await shim.call(
        "PATCH",
        f"/scan/{scan_id}/manifest",
        as_="system",
        json_body={"event_metadata": EVENT_METADATA, "scan_metadata": {"k": "v"}},
    )
    assert patched.status == 200, patched.body
    stored = await shim.call(
        "PUT",
        f"/scan/{scan_id}/result",
        as_="system",
        json_body={"scan_result": {"pixels": [1, 2, 3]}, "is_final": True},
    )
    assert stored.status == 200, stored.body
    await shim.operator_writes(scan_id, FINISHED)

    async def seen() -> bool:
        scan = shim.state.scans.live(scan_id)
        return scan is not None and ScanRecord(scan).deactivated == "FINISHED"

    await eventually(seen, timeout=30)
    return scan_id


async def event_configmap(shim: ShimUnderTest, event_id: str) -> Any | None:
    try:
        return await shim.api.request(
            "GET", core_path("configmaps", shim.namespace, names.event_object_name(event_id))
        )
    except KubeError as e:
        if e.status == 404:
            return None
        raise


async def collected(shim: ShimUnderTest, event_id: str) -> None:
    """Wait for the garbage collector to remove an event whose every owner is archived."""

    async def gone() -> bool:
        return await event_configmap(shim, event_id) is None

    await eventually(gone, timeout=60)


async def reads(shim: ShimUnderTest, scan_id: str) -> dict[tuple[str, str, str], tuple[int, Any]]:
    """Every GET of the scan, by (path, query, role): (status, body)."""
    answers = {}
    for path, query, roles in READS:
        for role in roles:
            reply = await shim.call("GET", f"/scan/{scan_id}{path}", as_=role, params=query)
            answers[(path, str(query), role)] = (reply.status, reply.body)
    request = await shim.call("GET", f"/scan-request/{scan_id}")
    answers[("/scan-request", "{}", "user")] = (request.status, request.body)
    return answers


async def test_every_read_answers_the_same_once_archived(shim: ShimUnderTest, archive: Archive) -> None:
    scan_id = await finished(shim)
    event_id = (await shim.kube_scan(scan_id))["spec"]["sensorEventId"]
    live = await reads(shim, scan_id)
    assert all(status == 200 for status, _ in live.values()), live
    await archive_scan(shim, archive, scan_id)
    await collected(shim, event_id)  # the event and the result now live in the archive only
    shim.state.scans._events.clear()

    archived = await reads(shim, scan_id)
    assert archived == live
    manifest_ = archived[("/manifest", "{}", "system")][1]
    assert manifest_["event_live_json_dict"] == archived[("/sensor-event", "{}", "user")][1]["sensor_event"]
    assert manifest_["event_metadata"] == EVENT_METADATA and manifest_["wms_workflow_id"] == "wf-old"
    assert archived[("/result", "{}", "user")][1] == {
        "scan_id": scan_id,
        "scan_result": {"pixels": [1, 2, 3]},
        "is_final": True,
    }
    assert (await shim.call("GET", "/scan/nope/manifest")).status == 404
    assert (await shim.call("GET", "/scan-request/nope")).status == 404


async def test_writes_only_a_running_scan_takes_answer_400(shim: ShimUnderTest, archive: Archive) -> None:
    scan_id = await finished(shim)
    await archive_scan(shim, archive, scan_id)
    before = await archive.get(shim.namespace, scan_id)
    for method, path, role, body, data in [
        ("PATCH", "/manifest", "system", {"scan_metadata": {"k": "v"}}, None),
        ("PUT", "/result", "system", {"scan_result": {"pixels": [9]}, "is_final": True}, None),
        ("POST", "/actions/add-workers", "user", {"cluster_location": "osg", "n_workers": 2}, None),
        (
            "POST",
            "/wms/workflow-id",
            "system",
            {"workflow_id": "wf-new", "wms_address": "http://wms.test"},
            None,
        ),
        ("PUT", "/startup.json", "system", None, b'{"a": 1}'),
    ]:
        refused = await shim.call(method, f"/scan/{scan_id}{path}", as_=role, json_body=body, data=data)
        assert refused.status == 400, (method, path, refused.body)
        assert refused.body["error"] == "Bad Request" and refused.body["reason"] == "scan is archived", (
            refused.body
        )
        assert scan_id in refused.body["message"]
    assert await archive.get(shim.namespace, scan_id) == before
    assert shim.state.scans.live(scan_id) is None  # nothing written to the cluster either
    for object_name in (names.result_object_name(scan_id), names.startup_object_name(scan_id)):
        assert await payloads.stored(shim.api, shim.namespace, object_name) is None
    kept = (await shim.call("GET", f"/scan/{scan_id}")).body
    assert kept["manifest"]["scan_metadata"] == {"k": "v"} and kept["result"]["scan_result"] == {
        "pixels": [1, 2, 3]
    }
    unknown = {"scan_result": {"x": 1}, "is_final": True}
    assert (await shim.call("PUT", "/scan/nope/result", as_="system", json_body=unknown)).body[
        "reason"
    ] == "unknown scan"


async def test_soft_delete_and_include_deleted_on_an_archived_scan(
    shim: ShimUnderTest, archive: Archive
) -> None:
    scan_id = await finished(shim)
    await archive_scan(shim, archive, scan_id)
    before = await archive.get(shim.namespace, scan_id)
    assert before is not None

    completed = await shim.call("DELETE", f"/scan/{scan_id}", json_body={})
    assert completed.status == 400 and "completed scan" in completed.body["reason"]
    deleted = await shim.call("DELETE", f"/scan/{scan_id}", json_body={"delete_completed_scan": True})
    assert deleted.status == 200, deleted.body
    assert deleted.body["manifest"]["is_deleted"] is True
    assert deleted.body["manifest"]["last_updated"] > before["status"]["lastUpdated"]
    assert deleted.body["result"]["scan_result"] == {"pixels": [1, 2, 3]}

    stored = await archive.get(shim.namespace, scan_id)
    assert stored is not None and stored["spec"]["deleted"] is True
    assert stored["status"]["archivedAt"] == before["status"]["archivedAt"]
    row = await archive.pool.fetchrow(
        "SELECT is_deleted, last_updated, manifest FROM scans WHERE scan_id = $1", scan_id
    )
    assert row["is_deleted"] is True and row["manifest"] == manifest.of(stored) == deleted.body["manifest"]

    for path in ("", "/manifest", "/result"):
        assert (await shim.call("GET", f"/scan/{scan_id}{path}")).status == 404, path
        shown = await shim.call("GET", f"/scan/{scan_id}{path}", params={"include_deleted": "true"})
        assert shown.status == 200, (path, shown.body)
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).body["is_deleted"] is True
    again = await shim.call("DELETE", f"/scan/{scan_id}", json_body={"delete_completed_scan": True})
    assert again.status == 200 and again.body["manifest"]["is_deleted"] is True


async def test_a_delete_racing_the_move_lands_in_the_archive(shim: ShimUnderTest, archive: Archive) -> None:
    scan_id = str((await shim.launch())["scan_id"])
    live = await shim.kube_scan(scan_id)  # what a request read just before the scan moved
    await archive_scan(shim, archive, scan_id)
    marked = await shim.state.writes.delete(live, delete_completed_scan=False)
    assert marked["spec"]["deleted"] is True
    stored = await archive.get(shim.namespace, scan_id)
    assert stored is not None and stored["spec"]["deleted"] is True and stored["status"]["archivedAt"]


async def test_rescan_of_an_archived_scan_is_live_with_the_same_event(
    shim: ShimUnderTest, archive: Archive
) -> None:
    a = await finished(shim)
    event_id = (await shim.kube_scan(a))["spec"]["sensorEventId"]
    event = (await shim.call("GET", f"/scan/{a}/sensor-event")).body
    await archive_scan(shim, archive, a)
    await collected(shim, event_id)

    reply = await shim.call(
        "POST", f"/scan/{a}/actions/rescan", as_="system", json_body={"replace_scan": True}
    )
    assert reply.status == 200, reply.body
    b = reply.body["scan_id"]
    assert reply.body["sensor_event_id"] == event_id and reply.body["classifiers"]["origin_scan_id"] == a
    assert shim.state.scans.live(b) is not None  # live
    stored = await event_configmap(shim, event_id)  # stored again from the archive, owned by the rescan
    assert stored is not None and [o["uid"] for o in stored["metadata"]["ownerReferences"]] == [
        (await shim.kube_scan(b))["metadata"]["uid"]
    ]
    assert (await shim.call("GET", f"/scan/{b}/sensor-event")).body == event

    # The archived original now redirects users to its replacement.
    redirected = await shim.call("GET", f"/scan/{a}/manifest")
    assert redirected.status == 302 and redirected.headers["Location"].endswith(f"/scan/{b}/manifest")
    kept = await shim.call("GET", f"/scan/{a}/manifest", params={"no_redirect": "true"})
    assert kept.status == 200 and kept.body["replaced_by_scan_id"] == b and kept.body["is_deleted"] is False
    assert (await shim.call("GET", f"/scan/{a}/manifest", as_="system")).status == 200
    moved = await shim.call("DELETE", f"/scan/{a}", json_body={})
    assert moved.status == 307 and moved.headers["Location"].endswith(f"/scan/{b}")

    # rescan_ids follow the chain across both stores: a (archived) -> b (live) -> c (archived) -> d (live).
    c = (await shim.call("POST", f"/scan/{b}/actions/rescan")).body["scan_id"]
    await archive_scan(shim, archive, c)
    d = (await shim.call("POST", f"/scan/{c}/actions/rescan", json_body={"abort_first": True})).body[
        "scan_id"
    ]
    assert (await shim.call("GET", f"/scan-request/{a}")).body["rescan_ids"] == [b, c, d]
    assert (await shim.call("GET", f"/scan-request/{c}")).body["rescan_ids"] == [d]
    aborted = await archive.get(shim.namespace, c)
    assert aborted is not None and aborted["spec"]["deleted"] is True
    assert (await shim.call("GET", f"/scan/{c}/manifest")).status == 404


async def test_an_archived_event_can_be_reused_by_id(shim: ShimUnderTest, archive: Archive) -> None:
    a = await finished(shim)
    event_id = (await shim.kube_scan(a))["spec"]["sensorEventId"]
    await archive_scan(shim, archive, a)
    await collected(shim, event_id)
    reply = await shim.call(
        "POST", "/scan", json_body=scan_body(event_live_json=None, sensor_event_id=event_id)
    )
    assert reply.status == 200, reply.body
    assert await event_configmap(shim, event_id) is not None
    assert (await shim.call("GET", f"/scan/{reply.body['scan_id']}/sensor-event")).status == 200


async def test_a_rescan_whose_event_is_in_neither_store_is_undone(
    shim: ShimUnderTest, archive: Archive
) -> None:
    a = str((await shim.launch())["scan_id"])
    event_id = (await shim.kube_scan(a))["spec"]["sensorEventId"]
    await shim.api.request(
        "DELETE", core_path("configmaps", shim.namespace, names.event_object_name(event_id))
    )
    refused = await shim.call("POST", f"/scan/{a}/actions/rescan")
    assert refused.status == 400 and refused.body["reason"] == "sensor event not found", refused.body
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert [scan["metadata"]["name"] for scan in listed["items"]] == [a]
    assert await event_configmap(shim, event_id) is None


async def test_a_scanner_credential_never_acts_on_an_archived_scan(
    shim: ShimUnderTest, archive: Archive
) -> None:
    scan_id = await running(shim)
    token = await mint(shim, scan_id)
    assert (await shim.call("GET", f"/scan/{scan_id}/status", as_=token)).status == 200
    await archive_scan(shim, archive, scan_id)
    for method, path, body in [
        ("GET", "/status", None),
        ("PATCH", "/manifest", {"scan_metadata": {"k": 1}}),
        ("PUT", "/result", {"scan_result": {"x": 1}, "is_final": True}),
    ]:
        refused = await shim.call(method, f"/scan/{scan_id}{path}", as_=token, json_body=body)
        assert refused.status == 403 and "revoked" in refused.body["message"], (method, path, refused.body)
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).status == 200  # the user still reads it


async def test_a_scan_archived_mid_read_is_never_missing(shim: ShimUnderTest, archive: Archive) -> None:
    scan_id = await finished(shim)
    expected = (await shim.call("GET", f"/scan/{scan_id}/manifest")).body
    result = (await shim.call("GET", f"/scan/{scan_id}/result")).body
    event = (await shim.call("GET", f"/scan/{scan_id}/sensor-event")).body
    moving = asyncio.create_task(archive_scan(shim, archive, scan_id))
    seen = {"live": 0, "archived": 0}
    after = 0
    while after < 20:  # reads all through the move, and on after the shim's cache dropped the Scan
        shim.state.scans._events.clear()
        seen["live" if shim.state.scans.live(scan_id) else "archived"] += 1
        for path, role, want in (
            ("/manifest", "user", expected),
            ("/result", "user", result),
            ("/sensor-event", "system", event),
        ):
            reply = await shim.call("GET", f"/scan/{scan_id}{path}", as_=role)
            assert (reply.status, reply.body) == (200, want), (path, reply.status, reply.body)
        after += moving.done()
    await moving
    assert seen["live"] > 0 and seen["archived"] > 0, seen


async def test_an_archive_outage_is_a_503_for_archived_scans_only(
    shim: ShimUnderTest, archive: Archive, archive_server: ArchiveServer
) -> None:
    gone, live = await finished(shim), str((await shim.launch())["scan_id"])
    await archive_scan(shim, archive, gone)
    database = await archive.pool.fetchval("SELECT current_database()")
    admin = await asyncpg.connect(archive_server.admin_dsn)
    try:  # the shim's connections are cut, and new ones refused
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database
        )
        for _ in range(2):  # the cut connection, then a refused new one
            down = await shim.call("GET", f"/scan/{gone}/manifest")
            assert down.status == 503 and down.body["reason"] == "archive unavailable", down.body
        assert (await shim.call("GET", f"/scan/{live}/manifest")).status == 200
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()

    async def back() -> bool:
        return (await shim.call("GET", f"/scan/{gone}/manifest")).status == 200

    await eventually(back, timeout=30)


async def test_postgresql_refusing_connections_is_an_archive_outage_not_the_api_servers(
    shim: ShimUnderTest,
) -> None:
    """A stopped PostgreSQL refuses connections (an OSError, as the API server's outages are): every
    route that reads the archive answers 503 'archive unavailable', with no driver text."""
    live = str((await shim.launch())["scan_id"])
    stopped = await asyncpg.create_pool(f"postgresql://skyscan@127.0.0.1:{free_port()}/none", min_size=0)
    assert stopped is not None
    archive = shim.state.scans._archive  # the one every reader of the archive holds: PostgreSQL stops
    assert archive is not None
    kept, archive.pool = archive.pool, stopped
    try:
        for method, path, body in [
            ("GET", f"/scan/{'0' * 11}x{'0' * 20}/manifest", None),  # not live: the archive is asked
            ("POST", "/scans/find", {"filter": {"event_metadata.run_id": 1}}),
            ("GET", f"/scan-request/{live}", None),  # its rescans: the archive holds some
        ]:
            reply = await shim.call(method, path, json_body=body)
            assert (reply.status, reply.body["reason"]) == (503, "archive unavailable"), (path, reply.body)
            assert "Error" not in reply.body["message"] and "127.0.0.1" not in reply.body["message"]
        assert (await shim.call("GET", f"/scan/{live}/manifest")).status == 200  # live scans are unaffected
    finally:
        archive.pool = kept
        await stopped.close()


async def test_a_nul_in_an_id_or_a_filter_is_a_4xx_not_an_outage(shim: ShimUnderTest) -> None:
    """PostgreSQL's text holds no NUL: one sent on to it was refused and reported as an outage (503)."""
    for path in (
        "/scan/abc%00def/manifest",
        "/scan/abc%00/status",
        "/scan/ABC/manifest",
        "/scan/a%0Ab/result",
    ):
        reply = await shim.call("GET", path)
        assert (reply.status, reply.body["reason"]) == (404, "scan not found"), (path, reply.body)
    for query in ({"scan_id": "abc\u0000"}, {"classifiers.a\u0000b": 1}, {"x": {"$in": ["\u0000"]}}):
        reply = await shim.call("POST", "/scans/find", json_body={"filter": query})
        assert (reply.status, reply.body["reason"]) == (
            400,
            "invalid filter: strings cannot contain NUL (\\u0000)",
        )
