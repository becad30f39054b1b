"""PATCH manifest, PUT/GET result, DELETE and what stays readable afterwards."""
# ruff: noqa: E501  - request tables read best unwrapped

from __future__ import annotations

import time
from typing import Any

import pytest

from skyscan import names
from skyscan.io.kube import core_path
from tests.integration.shim.conftest import ShimUnderTest

PROGRESS = {
    "summary": "half way",
    "epilogue": "",
    "tallies": {"done": 3},
    "processing_stats": {"start": {"scanner start": 1.0}, "runtime": {"total": 2.0}},
    "predictive_scanning_threshold": 1.0,
    "last_updated": "2026-11-22 09:00:00",
}
EVENT_METADATA = {"run_id": 1, "event_id": 2, "event_type": "HESE", "mjd": 60000.5, "is_real_event": True}


async def test_patch_manifest_progress_and_set_once_metadata(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/manifest"
    before = time.time()
    reply = await shim.call(
        "PATCH", path, as_="system",
        json_body={"progress": PROGRESS, "event_metadata": EVENT_METADATA, "scan_metadata": {"a": {"b": 1}}},
    )  # fmt: skip
    assert reply.status == 200, reply.body
    manifest = reply.body
    assert manifest["progress"]["processing_stats"] == {
        "start": {"scanner start": 1.0}, "runtime": {"total": 2.0}, "rate": {}, "end": "", "finished": False,
        "predictions": {},
    }  # fmt: skip
    assert manifest["progress"]["start"] is None and manifest["progress"]["end"] is None
    assert manifest["event_metadata"] == EVENT_METADATA and manifest["scan_metadata"] == {"a": {"b": 1}}
    assert manifest["timestamp"] < before <= manifest["last_updated"]
    assert (await shim.call("GET", path)).body == manifest  # read-your-write, from the cache

    # progress is replaced whole: keys and nested keys not sent are gone.
    newer = {**PROGRESS, "tallies": {"other": 1}, "start": 5}
    newer["processing_stats"] = {"start": {}, "runtime": {}, "rate": {"r": 1.5}}
    reply = await shim.call(
        "PATCH", path, as_="system", json_body={"progress": newer, "event_metadata": EVENT_METADATA}
    )
    assert reply.body["progress"]["tallies"] == {"other": 1} and reply.body["progress"]["start"] == 5
    assert reply.body["progress"]["processing_stats"]["start"] == {}
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    assert status["scan_state"] == "PENDING__PRESTARTUP"  # progress alone does not clear the backlog

    # Set once: an equal resend is fine, a different one is refused and changes nothing.
    for field, changed in (("event_metadata", {**EVENT_METADATA, "run_id": 9}), ("scan_metadata", {"a": 2})):
        reply = await shim.call("PATCH", path, as_="system", json_body={field: changed})
        assert reply.status == 400 and reply.body["reason"] == f"Cannot change an existing {field}"
    assert (await shim.call("GET", path)).body["event_metadata"] == EVENT_METADATA

    # An empty patch returns the current manifest without writing.
    current = (await shim.call("GET", path)).body
    assert (await shim.call("PATCH", path, as_="system", json_body={})).body == current
    bad = await shim.call("PATCH", path, as_="system", json_body={"progress": {"summary": 1}})
    assert bad.status == 400 and bad.body["reason"].startswith("'progress.summary': must be type 'string'")


async def test_results(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/result"
    assert (await shim.call("GET", path)).body == {}
    # An empty result is answered {} and stores nothing.
    reply = await shim.call("PUT", path, as_="system", json_body={"scan_result": {}, "is_final": True})
    assert (reply.status, reply.body) == (200, {})
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).body["scan_complete"] is False

    partial = {"nside-8": {"columns": ["index", "llh"], "data": [[0, 1.5]] * 50}}
    reply = await shim.call("PUT", path, as_="system", json_body={"scan_result": partial, "is_final": False})
    assert reply.body == {"scan_id": scan_id, "scan_result": partial, "is_final": False}
    assert (await shim.call("GET", path)).body == reply.body
    final = {"nside-8": {"columns": ["index", "llh"], "data": [[0, 0.5]] * 80}}
    reply = await shim.call("PUT", path, as_="system", json_body={"scan_result": final, "is_final": True})
    got = await shim.call("GET", f"/scan/{scan_id}")
    assert got.body["result"] == {"scan_id": scan_id, "scan_result": final, "is_final": True}
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    assert status["scan_state"] == "SCAN_HAS_FINAL_RESULT" and status["scan_complete"] is True
    scan = await shim.kube_scan(scan_id)
    assert scan["status"]["result"]["isFinal"] is True  # for the operator to finish the workflow
    cm = await shim.api.request(
        "GET", core_path("configmaps", shim.namespace, names.result_object_name(scan_id))
    )
    assert [o["uid"] for o in cm["metadata"]["ownerReferences"]] == [scan["metadata"]["uid"]]

    for body, reason in [
        ({}, "'scan_result' is a required property; 'is_final' is a required property"),
        ({"scan_result": [1], "is_final": True}, "'scan_result': must be type 'object' (dict)"),
    ]:
        reply = await shim.call("PUT", path, as_="system", json_body=body)
        assert (reply.status, reply.body["reason"]) == (400, reason)
    reply = await shim.call(
        "PUT", "/scan/unknown1/result", as_="system", json_body={"scan_result": final, "is_final": True}
    )
    assert (reply.status, reply.body["reason"]) == (400, "unknown scan")


async def test_delete_and_deleted_reads(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    done_id = (await shim.launch())["scan_id"]
    await shim.call(
        "PUT", f"/scan/{done_id}/result", as_="system", json_body={"scan_result": {"a": 1}, "is_final": True}
    )

    refused = await shim.call("DELETE", f"/scan/{done_id}")
    assert refused.status == 400
    assert (
        refused.body["reason"]
        == "Attempted to delete a completed scan (must use `delete_completed_scan=True`)"
    )
    refused = await shim.call("DELETE", f"/scan/{done_id}", json_body={"delete_completed_scan": False})
    assert refused.status == 400
    done = await shim.call("DELETE", f"/scan/{done_id}", json_body={"delete_completed_scan": True})
    assert done.status == 200 and done.body["result"]["is_final"] is True

    deleted = await shim.call(
        "DELETE", f"/scan/{scan_id}", json_body={"manifest_projection": ["scan_id", "is_deleted"]}
    )
    assert deleted.body == {"manifest": {"scan_id": scan_id, "is_deleted": True}, "result": {}}
    again = await shim.call("DELETE", f"/scan/{scan_id}")
    assert again.status == 200 and again.body["manifest"]["is_deleted"] is True
    assert (await shim.kube_scan(scan_id))["spec"]["deleted"] is True

    for path in (f"/scan/{scan_id}", f"/scan/{scan_id}/manifest", f"/scan/{scan_id}/result"):
        for params in (None, {"include_deleted": "false"}, {"include_deleted": "No"}):
            reply = await shim.call("GET", path, params=params)
            assert reply.status == 404 and reply.body["error"] == "Not Found", (path, params)
        assert (await shim.call("GET", path, params={"include_deleted": "TRUE"})).status == 200
    full = await shim.call("GET", f"/scan/{scan_id}", params={"include_deleted": "1"})
    assert full.body == {"manifest": again.body["manifest"], "result": {}}
    for path in ("status", "logs", "sensor-event", "wms/workflow-id", "wms/workforce", "wms/taskforces"):
        assert (await shim.call("GET", f"/scan/{scan_id}/{path}")).status == 200, path
    assert (await shim.call("GET", f"/scan-request/{scan_id}")).status == 200
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    assert status["is_deleted"] is True and status["scan_state"] == "PENDING__PRESTARTUP"
    # Deleted scans can still be patched (the scanner may report after an abort).
    reply = await shim.call(
        "PATCH", f"/scan/{scan_id}/manifest", as_="system", json_body={"scan_metadata": {"x": 1}}
    )
    assert reply.status == 200 and reply.body["scan_metadata"] == {"x": 1}
    bad = await shim.call("GET", f"/scan/{scan_id}", params={"include_deleted": "maybe"})
    assert bad.status == 400


async def test_status_and_logs(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    url = f"https://grafana.test/d?var-namespace={shim.namespace}&var-container=skyscan-server-{scan_id}"
    assert status == {
        "scan_state": "PENDING__PRESTARTUP",
        "is_deleted": False,
        "wms_deactivated": None,
        "scan_complete": False,
        "scanner_server_logs": {"url": url},
        "wms_workforce": {
            "workflow_id": "not-yet-requested",
            "statuses": {},
            "n_running": 0,
            "top_errors": {},
        },
        "backlog": None,  # the operator (not running here) has not placed it in the backlog's line
    }
    assert (await shim.call("GET", f"/scan/{scan_id}/logs")).body == {"scanner_server": {"url": url}}


async def test_logs_url_is_null_without_a_template(make_shim: Any) -> None:
    shim = await make_shim(logs_url_template=None)
    scan_id = (await shim.launch())["scan_id"]
    assert (await shim.call("GET", f"/scan/{scan_id}/logs")).body == {"scanner_server": {"url": None}}


async def test_payload_limits(make_shim: Any) -> None:
    import base64
    import os

    shim = await make_shim(max_body_bytes=3_000_000)
    scan_id = (await shim.launch())["scan_id"]
    noise = base64.b64encode(os.urandom(1_100_000)).decode()
    reply = await shim.call(
        "PUT",
        f"/scan/{scan_id}/result",
        as_="system",
        json_body={"scan_result": {"d": noise}, "is_final": True},
    )
    assert reply.status == 413 and reply.body["reason"] == "scan result too large"
    assert (await shim.call("GET", f"/scan/{scan_id}/result")).body == {}  # nothing stored
    assert (await shim.call("GET", f"/scan/{scan_id}/status")).body["scan_complete"] is False
    huge = await shim.call(
        "PUT",
        f"/scan/{scan_id}/result",
        as_="system",
        json_body={"scan_result": {"d": noise * 3}, "is_final": True},
    )
    assert huge.status == 413 and huge.body["error"] == "Request Entity Too Large"


async def test_a_missing_event_object_is_404(shim: ShimUnderTest) -> None:
    manifest = await shim.launch()
    await shim.api.request(
        "DELETE",
        core_path("configmaps", shim.namespace, names.event_object_name(manifest["sensor_event_id"])),
    )
    reply = await shim.call("GET", f"/scan/{manifest['scan_id']}/sensor-event")
    assert reply.status == 404 and reply.body["reason"] == "sensor event not found"


MAX = 2**63 - 1024
STATS = PROGRESS["processing_stats"]
INVALID_PATCHES: list[tuple[dict[str, Any], str]] = [
    # The reference's Progress schema: a threshold in [0, 1], start/end integers, typed processing stats.
    ({"progress": {**PROGRESS, "predictive_scanning_threshold": 1.5}}, "'progress.predictive_scanning_threshold': must be no more than 1.0"),
    ({"progress": {**PROGRESS, "predictive_scanning_threshold": -0.1}}, "'progress.predictive_scanning_threshold': must be at least 0.0"),
    ({"progress": {**PROGRESS, "predictive_scanning_threshold": float("nan")}}, "'progress.predictive_scanning_threshold': must be a finite number"),
    ({"progress": {**PROGRESS, "start": 2**70}}, f"'progress.start': must be no more than {MAX}"),
    ({"progress": {**PROGRESS, "end": 1.5}}, "'progress.end': must be type 'integer' (int)"),
    ({"progress": {**PROGRESS, "processing_stats": {**STATS, "finished": "yes"}}}, "'progress.processing_stats.finished': must be type 'boolean' (bool)"),
    ({"progress": {**PROGRESS, "processing_stats": {**STATS, "end": 3}}}, "'progress.processing_stats.end': must be type 'string' (str)"),
    ({"progress": {**PROGRESS, "processing_stats": {"start": {}}}}, "'progress.processing_stats': 'runtime' is a required property"),
    ({"progress": {**PROGRESS, "tallies": {"x": float("inf")}}}, "'progress.tallies': must not contain NaN or an infinite number (JSON has neither)"),
    ({"event_metadata": {**EVENT_METADATA, "run_id": 2**70}}, f"'event_metadata.run_id': must be no more than {MAX}"),
    ({"event_metadata": {**EVENT_METADATA, "event_id": -(2**70)}}, "'event_metadata.event_id': must be at least -9223372036854775808"),
    ({"event_metadata": {**EVENT_METADATA, "mjd": float("inf")}}, "'event_metadata.mjd': must be a finite number"),
    ({"scan_metadata": {"a": [float("nan")]}}, "'scan_metadata': must not contain NaN or an infinite number (JSON has neither)"),
    # The Scan holds these: an integer beyond int64 would be rounded to a float by the API server.
    ({"scan_metadata": {"nside_progression": {"8": 2**70}}}, f"'scan_metadata': integers are at most {MAX} and at least {-(2**63)} (at 'nside_progression.8')"),
    ({"progress": {**PROGRESS, "tallies": {"n": [1, -(2**64)]}}}, f"'progress.tallies': integers are at most {MAX} and at least {-(2**63)} (at 'n.1')"),
    ({"progress": {**PROGRESS, "processing_stats": {**STATS, "rate": {"r": 10**30}}}}, f"'progress.processing_stats.rate': integers are at most {MAX} and at least {-(2**63)} (at 'r')"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "reason"), INVALID_PATCHES)
async def test_invalid_manifest_patches_are_refused(
    shim: ShimUnderTest, body: dict[str, Any], reason: str
) -> None:
    scan_id = (await shim.launch())["scan_id"]
    reply = await shim.call("PATCH", f"/scan/{scan_id}/manifest", as_="system", json_body=body)
    assert (reply.status, reply.body["error"], reply.body["reason"]) == (400, "Bad Request", reason), (
        reply.body
    )
    assert "status" not in await shim.kube_scan(scan_id)  # nothing written


async def test_manifest_patch_integers_and_size_limits(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/manifest"
    # Integral numbers are integers (as in JSON Schema), stored as such.
    body = {"progress": {**PROGRESS, "start": 5.0}, "event_metadata": {**EVENT_METADATA, "run_id": 1.0}}
    reply = await shim.call("PATCH", path, as_="system", json_body=body)
    assert reply.status == 200, reply.body
    assert reply.body["progress"]["start"] == 5 and reply.body["event_metadata"] == EVENT_METADATA
    status = (await shim.kube_scan(scan_id))["status"]
    assert type(status["progress"]["start"]) is int and type(status["eventMetadata"]["runId"]) is int

    # Each of progress, event_metadata, scan_metadata is at most 64 KiB as JSON: 413, nothing written,
    # and not a retryable 5xx (a 1.6 MB progress used to reach etcd and come back as 503).
    before = (await shim.call("GET", path)).body
    limit = 64 * 1024
    for field, value in [
        ("progress", {**PROGRESS, "summary": "x" * 1_600_000}),
        ("progress", {**PROGRESS, "tallies": {"t": "x" * limit}}),
        ("scan_metadata", {"blob": "y" * limit}),
        ("event_metadata", {**EVENT_METADATA, "event_type": "z" * limit}),
    ]:
        reply = await shim.call("PATCH", path, as_="system", json_body={field: value})
        assert (reply.status, reply.body["error"], reply.body["reason"]) == (
            413, "Request Entity Too Large", f"'{field}' too large",
        ), reply.body  # fmt: skip
        assert str(limit) in reply.body["message"]
    assert (await shim.call("GET", path)).body == before
    # Just under the limit is stored.
    fits = {**PROGRESS, "tallies": {"t": "x" * (limit - 1000)}}
    assert (await shim.call("PATCH", path, as_="system", json_body={"progress": fits})).status == 200
