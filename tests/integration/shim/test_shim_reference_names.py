"""The reference's wire names beside the interface's, through the shim (issue 29, item 1): either taken
on input, one dialect an answer (the route's, else the caller's), each kept encoded once per version."""

from __future__ import annotations

from typing import Any

from tests.integration.shim.conftest import ShimUnderTest, scan_body

EVENT = {"run": 1, "value": {"data": "x" * 50}}


def named_one_way(body: dict[str, Any], present: str, absent: str) -> None:
    """`body` names a field by `present` only."""
    assert present in body and absent not in body, sorted(body)


async def test_the_init_containers_calls_on_the_reference_paths(shim: ShimUnderTest) -> None:
    """GET then POST /scan/{id}/ewms/workflow-id, as the reference's init container calls them (its
    credential is the system's: the path alone makes the answer the reference's)."""
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/ewms/workflow-id"
    before = (await shim.call("GET", path, as_="system")).body
    assert before == {
        "workflow_id": before["workflow_id"],
        "requested_ewms_workflow": False,
        "eligible_for_ewms": True,
        "ewms_address": None,
    }
    posted = await shim.call(
        "POST", path, as_="system", json_body={"workflow_id": "wf-1", "ewms_address": "https://ewms.example"}
    )
    assert posted.status == 200, posted.body
    assert posted.body["ewms_workflow_id"] == "wf-1" and posted.body["ewms_address"] == "https://ewms.example"
    named_one_way(posted.body, "ewms_task", "wms_task")
    after = (await shim.call("GET", path)).body
    assert after["requested_ewms_workflow"] is True and after["workflow_id"] == "wf-1"
    ours = (await shim.call("GET", f"/scan/{scan_id}/wms/workflow-id")).body
    assert ours == {
        "workflow_id": "wf-1",
        "requested_wms_workflow": True,
        "eligible_for_wms": True,
        "wms_address": "https://ewms.example",
    }
    workforce = await shim.call("GET", f"/scan/{scan_id}/ewms/workforce", as_="system")
    assert workforce.body == (await shim.call("GET", f"/scan/{scan_id}/wms/workforce")).body
    taskforces = await shim.call("GET", f"/scan/{scan_id}/ewms/taskforces")
    assert taskforces.status == 200 and taskforces.body == {"taskforces": []}


async def test_each_dialect_is_kept_encoded_once_per_version(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    status = f"/scan/{scan_id}/status"
    before = shim.state.scans._encoded.builds
    ours, theirs = (await shim.call("GET", status)).body, (await shim.call("GET", status, as_="icecube")).body
    named_one_way(ours, "wms_deactivated", "ewms_deactivated")
    named_one_way(theirs, "ewms_workforce", "wms_workforce")
    assert ours["wms_workforce"] == theirs["ewms_workforce"] and ours["scan_state"] == theirs["scan_state"]
    assert shim.state.scans._encoded.builds == before + 2
    for as_ in ("user", "icecube", "user", "icecube"):
        await shim.call("GET", status, as_=as_)
    assert shim.state.scans._encoded.builds == before + 2  # each dialect's bytes, read again


async def test_a_reference_client_writes_and_reads_in_its_names_and_the_interface_reads_it_in_its_own(
    shim: ShimUnderTest,
) -> None:
    body = {k: v for k, v in scan_body().items() if k != "event_live_json"} | {"event_i3live_json": EVENT}
    launched = await shim.call("POST", "/scan", as_="icecube", json_body=body)
    assert launched.status == 200, launched.body
    scan_id, event_id = launched.body["scan_id"], launched.body["i3_event_id"]
    assert launched.body["event_i3live_json_dict"] == "use 'i3_event_id'"
    named_one_way(launched.body, "ewms_workflow_id", "wms_workflow_id")
    scan = f"/scan/{scan_id}"

    # The scanner reads its event in its names and reports in them.
    manifest = (await shim.call("GET", f"{scan}/manifest", as_="icecube-system")).body
    assert manifest["event_i3live_json_dict"] == EVENT and "event_live_json_dict" not in manifest
    result = {"nside-8": {"columns": ["index"], "metadata": {}, "data": [[0]]}}
    stored = await shim.call(
        "PUT", f"{scan}/result", as_="icecube-system", json_body={"skyscan_result": result, "is_final": True}
    )
    assert stored.body == {"scan_id": scan_id, "skyscan_result": result, "is_final": True}

    # The interface's clients read it all in theirs; the reference's in its own.
    whole = (await shim.call("GET", scan)).body
    assert whole["result"] == {"scan_id": scan_id, "scan_result": result, "is_final": True}
    assert whole["manifest"]["sensor_event_id"] == event_id
    theirs = (await shim.call("GET", scan, as_="icecube")).body
    assert theirs["result"]["skyscan_result"] == result and theirs["manifest"]["i3_event_id"] == event_id
    assert (await shim.call("GET", f"{scan}/result", as_="icecube")).body["skyscan_result"] == result
    assert (await shim.call("GET", f"{scan}/i3-event")).body == {"i3_event": EVENT}
    assert (await shim.call("GET", f"{scan}/sensor-event", as_="icecube")).body == {"i3_event": EVENT}
    assert (await shim.call("GET", f"{scan}/sensor-event")).body == {"sensor_event": EVENT}
    request = (await shim.call("GET", f"/scan-request/{scan_id}", as_="icecube")).body
    assert request["i3_event_id"] == event_id and "sensor_event_id" not in request

    # Projections and filters take either name; the answer is in the caller's.
    projected = await shim.call("GET", f"{scan}/manifest", params={"projection": "scan_id|i3_event_id"})
    assert projected.body == {"scan_id": scan_id, "sensor_event_id": event_id}
    projected = await shim.call(
        "GET", f"{scan}/manifest", as_="icecube", params={"projection": "scan_id|sensor_event_id"}
    )
    assert projected.body == {"scan_id": scan_id, "i3_event_id": event_id}
    find = {"filter": {"i3_event_id": event_id}, "manifest_projection": ["i3_event_id", "ewms_workflow_id"]}
    found = (await shim.call("POST", "/scans/find", as_="icecube", json_body=find)).body["manifests"]
    assert [set(m) for m in found] == [{"i3_event_id", "ewms_workflow_id"}] and found[0][
        "i3_event_id"
    ] == event_id
    ours = (await shim.call("POST", "/scans/find", json_body=find)).body["manifests"]
    assert [set(m) for m in ours] == [{"sensor_event_id", "wms_workflow_id"}]


async def test_one_field_named_both_ways_is_refused(shim: ShimUnderTest) -> None:
    both = scan_body(event_i3live_json=EVENT)
    refused = await shim.call("POST", "/scan", json_body=both)
    assert refused.status == 400 and "event_i3live_json" in refused.body["reason"], refused.body
    find = {"filter": {"$or": [{"i3_event_id": "a", "sensor_event_id": "b"}]}}
    refused = await shim.call("POST", "/scans/find", json_body=find)
    assert refused.status == 400
    assert (
        refused.body["reason"]
        == "invalid filter: 'i3_event_id' and 'sensor_event_id' name the same field: give one"
    )
