"""Reads served as bytes: a GET of an unchanged live scan answers the bytes kept for its version, built
once; any change to the Scan (a write through this shim, the operator's, a rescan) is read at once."""

from __future__ import annotations

import json
from typing import Any

from api_shim.repository.versions import MIN_VERSION_HEADER
from skyscan.io.kube import scan_path
from skyscan.manifest import of
from tests.integration.shim.conftest import ShimUnderTest
from tests.integration.shim.test_shim_writes import EVENT_METADATA, PROGRESS

READS = ("", "/manifest", "/status", "/logs", "/wms/workflow-id", "/wms/workforce", "/wms/taskforces")


async def raw(shim: ShimUnderTest, path: str, **params: str) -> tuple[int, bytes]:
    """A user's GET, its status and the bytes answered."""
    headers = {"Authorization": f"Bearer {shim.tokens['user']}"}
    async with shim.session.get(shim.url + path, params=params, headers=headers, allow_redirects=False) as r:
        return r.status, await r.read()


def builds(shim: ShimUnderTest) -> int:
    return shim.state.scans._encoded.builds


async def test_unchanged_scans_are_answered_from_their_kept_bytes(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    paths = [f"/scan/{scan_id}{suffix}" for suffix in READS] + [f"/scan-request/{scan_id}"]
    before = builds(shim)
    first = [await raw(shim, p) for p in paths]
    assert all(status == 200 for status, _ in first), first
    assert builds(shim) == before + len(paths)  # each form built once
    again = [await raw(shim, p) for p in paths]
    assert again == first and builds(shim) == before + len(paths)  # the same bytes, nothing built
    # Each projection is a form of its own, kept too; `*` is the whole manifest.
    manifest = f"/scan/{scan_id}/manifest"
    projected = await raw(shim, manifest, projection="scan_id|priority")
    assert (
        projected[0] == 200 and projected[1] == (await raw(shim, manifest, projection="priority|scan_id"))[1]
    )
    assert await raw(shim, manifest, projection="*") == first[1]
    assert builds(shim) == before + len(paths) + 1
    # The JSON answered is the one built from the Scan, as before it was kept.
    reply = await shim.call("GET", manifest)
    assert reply.headers["Content-Type"] == "application/json; charset=utf-8"
    assert reply.body == json.loads(json.dumps(of(await shim.kube_scan(scan_id))))


async def test_writes_through_this_shim_are_read_at_once(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    manifest, status = f"/scan/{scan_id}/manifest", f"/scan/{scan_id}/status"
    old_manifest, old_status = (await raw(shim, manifest))[1], (await raw(shim, status))[1]

    # The scanner's progress (a status write).
    patched = await shim.call(
        "PATCH", manifest, as_="system", json_body={"progress": PROGRESS, "event_metadata": EVENT_METADATA}
    )
    assert patched.status == 200, patched.body
    read = await shim.call("GET", manifest)
    assert read.body == patched.body and read.body["progress"]["summary"] == "half way"
    assert (await raw(shim, manifest))[1] != old_manifest
    assert (await shim.call("GET", status)).body["scan_state"] == "PENDING__PRESTARTUP"

    # A soft delete (a spec mark): gone without include_deleted, marked with it, at once.
    assert (await shim.call("DELETE", f"/scan/{scan_id}")).status == 200
    assert (await raw(shim, manifest))[0] == 404 and (await raw(shim, f"/scan/{scan_id}"))[0] == 404
    assert (await shim.call("GET", manifest, params={"include_deleted": "true"})).body["is_deleted"] is True
    deleted_status = await raw(shim, status)
    assert deleted_status[1] != old_status and b'"is_deleted": true' in deleted_status[1]


async def test_a_rescan_is_read_at_once_in_the_original(shim: ShimUnderTest) -> None:
    alpha = (await shim.launch())["scan_id"]
    request = f"/scan-request/{alpha}"
    assert (await shim.call("GET", request)).body["rescan_ids"] == []
    assert (await raw(shim, f"/scan/{alpha}/manifest"))[0] == 200  # kept, then replaced:
    beta = (await shim.call("POST", f"/scan/{alpha}/actions/rescan", json_body={"replace_scan": True})).body[
        "scan_id"
    ]
    assert (await shim.call("GET", request)).body["rescan_ids"] == [beta]  # another Scan: in the key
    redirected = await shim.call("GET", f"/scan/{alpha}/manifest")
    assert (redirected.status, redirected.headers["Location"]) == (302, f"/scan/{beta}/manifest")
    direct = await shim.call("GET", f"/scan/{alpha}/manifest", params={"no_redirect": "true"})
    assert direct.body["replaced_by_scan_id"] == beta


async def test_the_operators_writes_are_read_once_the_cache_has_them(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    workforce = f"/scan/{scan_id}/wms/workforce"
    assert (await shim.call("GET", workforce)).body["workflow_id"] == "not-yet-requested"
    written: dict[str, Any] = await shim.api.request(
        "PATCH",
        scan_path(shim.namespace, scan_id, "status"),
        body={"status": {"workflow": {"id": "wf-1", "address": "https://wms.test"}}},
        content_type="application/merge-patch+json",
    )
    # Another writer's version, asked for as a client of another replica would (read-your-writes).
    version = {MIN_VERSION_HEADER: written["metadata"]["resourceVersion"]}
    read = await shim.call("GET", workforce, headers=version)
    assert read.body["workflow_id"] == "wf-1"
    ids = await shim.call("GET", f"/scan/{scan_id}/wms/workflow-id", headers=version)
    assert ids.body["workflow_id"] == "wf-1" and ids.body["wms_address"] == "https://wms.test"
