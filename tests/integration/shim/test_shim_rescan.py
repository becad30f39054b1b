"""Rescans (full scans of their own) and redirects of replaced scans."""

from __future__ import annotations

from tests.integration.shim.conftest import ShimUnderTest

REDIRECTING_GETS = [
    "", "/manifest", "/sensor-event", "/result", "/status", "/logs", "/wms/workflow-id", "/wms/workforce",
    "/wms/taskforces",
]  # fmt: skip


async def test_rescan_copies_the_request_and_lists_rescan_ids(shim: ShimUnderTest) -> None:
    root = await shim.launch(docker_tag="4.1", priority=3)
    first = await shim.call("POST", f"/scan/{root['scan_id']}/actions/rescan")
    assert first.status == 200
    rescan = first.body
    assert rescan["classifiers"] == {"origin": "test", "rescan": True, "origin_scan_id": root["scan_id"]}
    for key in ("scanner_server_args", "sensor_event_id", "priority"):
        assert rescan[key] == root[key]
    for key in ("scan_id", "timestamp", "last_updated", "classifiers"):
        assert rescan[key] != root[key]
    # A rescan of the rescan; the root request lists both, in order.
    second = await shim.call(
        "POST",
        f"/scan/{rescan['scan_id']}/actions/rescan",
        json_body={"manifest_projection": ["scan_id", "classifiers"]},
    )
    assert set(second.body) == {"scan_id", "classifiers"}
    assert second.body["classifiers"]["origin_scan_id"] == rescan["scan_id"]
    request = (await shim.call("GET", f"/scan-request/{root['scan_id']}")).body
    assert request["rescan_ids"] == [rescan["scan_id"], second.body["scan_id"]]
    own = await shim.call("GET", f"/scan-request/{rescan['scan_id']}")
    assert (
        own.status == 200 and own.body["docker_tag"] == request["docker_tag"] == "4.1.0"
    )  # reused, not re-resolved
    assert own.body["classifiers"] == {"origin": "test"}
    # The event is shared, not copied.
    event = (await shim.call("GET", f"/scan/{second.body['scan_id']}/sensor-event")).body
    assert event == (await shim.call("GET", f"/scan/{root['scan_id']}/sensor-event")).body
    assert (await shim.call("POST", "/scan/nope/actions/rescan")).status == 404


async def test_rescan_abort_first_and_replace(shim: ShimUnderTest) -> None:
    alpha = (await shim.launch())["scan_id"]
    reply = await shim.call(
        "POST", f"/scan/{alpha}/actions/rescan", json_body={"abort_first": True, "replace_scan": True}
    )
    beta = reply.body["scan_id"]
    original = (
        await shim.call(
            "GET", f"/scan/{alpha}/manifest", params={"no_redirect": "true", "include_deleted": "true"}
        )
    ).body
    assert original["is_deleted"] is True and original["replaced_by_scan_id"] == beta

    only_replaced = (await shim.launch())["scan_id"]
    await shim.call("POST", f"/scan/{only_replaced}/actions/rescan", json_body={"replace_scan": True})
    kept = (await shim.call("GET", f"/scan/{only_replaced}/manifest", params={"no_redirect": "yes"})).body
    assert kept["is_deleted"] is False and kept["replaced_by_scan_id"]


async def test_replaced_scans_redirect_users_only(shim: ShimUnderTest) -> None:
    alpha = (await shim.launch())["scan_id"]
    beta = (await shim.call("POST", f"/scan/{alpha}/actions/rescan", json_body={"replace_scan": True})).body[
        "scan_id"
    ]
    for suffix in REDIRECTING_GETS:
        reply = await shim.call("GET", f"/scan/{alpha}{suffix}", params={"projection": "scan_id|priority"})
        assert reply.status == 302, suffix
        assert reply.headers["Location"] == f"/scan/{beta}{suffix}?projection=scan_id%7Cpriority"
        direct = await shim.call("GET", f"/scan/{alpha}{suffix}", params={"no_redirect": "True"})
        assert direct.status == 200, suffix
    # Other methods keep their method: 307.
    for method, suffix in [("DELETE", ""), ("POST", "/actions/rescan"), ("POST", "/actions/add-workers")]:
        reply = await shim.call(method, f"/scan/{alpha}{suffix}", json_body={})
        assert reply.status == 307 and reply.headers["Location"] == f"/scan/{beta}{suffix}"
    # no_redirect as a JSON-body boolean.
    reply = await shim.call("DELETE", f"/scan/{alpha}", json_body={"no_redirect": True})
    assert reply.status == 200 and reply.body["manifest"]["scan_id"] == alpha
    # A Location never carries a host a client named (X-Forwarded-Host, Host): relative, as the reference.
    forged = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example", "Host": "evil.example"}
    reply = await shim.call("GET", f"/scan/{alpha}/status", headers=forged)
    assert reply.status == 302 and reply.headers["Location"] == f"/scan/{beta}/status"
    # System callers are never redirected; routes without redirects answer for the id asked.
    manifest = await shim.call(
        "GET", f"/scan/{alpha}/manifest", as_="system", params={"include_deleted": "true"}
    )
    assert manifest.body["scan_id"] == alpha
    assert (await shim.call("GET", f"/scan-request/{alpha}")).body["scan_id"] == alpha
