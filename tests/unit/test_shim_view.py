"""The REST views of a Scan: manifest, projections, status, backlog entry, request object."""
# ruff: noqa: E501  - tables of expected texts read best unwrapped

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from api_shim import view
from skyscan import manifest, names
from skyscan.patch import merge_patch
from skyscan.scan_record import ScanRecord

SCAN: dict[str, Any] = {
    "metadata": {
        "name": "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0",
        "annotations": {names.TIMESTAMP_ANNOTATION: "1700000000.25"},
        "creationTimestamp": "2023-11-14T22:13:20Z",
    },
    "spec": {
        "dockerTag": "4.1.0",
        "recoAlgo": "dummy",
        "sensorEventId": "ev1",
        "nsides": {"64": 12, "8": 0, "512": 24},
        "realOrSimulatedEvent": "sim",
        "maxPixelRecoTime": 60,
        "requestClusters": [{"location": "osg", "nWorkers": 3}],
        "scannerServerMemoryBytes": 1,
        "workerMemoryBytes": 2,
        "workerDiskBytes": 3,
        "predictiveScanningThreshold": 1,
        "priority": 4,
        "debugMode": [],
        "classifiers": {"a": 1},
        "scannerServerEnvFromUser": {},
        "deleted": False,
    },
}


def with_status(**status: Any) -> dict[str, Any]:
    scan = copy.deepcopy(SCAN)
    scan["status"] = status
    return scan


def test_new_scan_manifest() -> None:
    m = manifest.of(SCAN)
    assert m["timestamp"] == m["last_updated"] == 1700000000.25
    assert m["wms_workflow_id"] == "not-yet-requested" and m["wms_address"] is None
    assert m["scanner_server_args"].split("--nsides ")[1].startswith("8:0 64:12 512:24 ")
    assert "--simulated-event" in m["scanner_server_args"]
    assert m["scanner_server_args"].endswith("--predictive-scanning-threshold 1.0 ")
    assert tuple(m) == manifest.MANIFEST_FIELDS  # every field of the model, computed
    assert manifest.Manifest.model_validate(m).model_dump() == m  # of the model's types


def test_timestamp_falls_back_to_creation_time() -> None:
    scan = copy.deepcopy(SCAN)
    del scan["metadata"]["annotations"]
    assert ScanRecord(scan).created_at == 1700000000.0


def test_status_fields_and_rescan_classifiers() -> None:
    scan = with_status(
        workflow={"id": "wf1", "address": "https://wms", "deactivated": "ABORTED"},
        progress={"summary": "s", "processing_stats": {"rate": {"x": 1}}},
        eventMetadata={"runId": 1, "eventId": 2, "eventType": "t", "mjd": 3.5, "isRealEvent": True},
        scanMetadata={"k": "v"},
        lastUpdated=1700000001.0,
    )
    scan["spec"].update(rescanOf="origin", replacedBy="next", deleted=True)
    m = manifest.of(scan)
    assert m["wms_workflow_id"] == "wf1" and m["wms_address"] == "https://wms"
    assert m["event_metadata"] == {
        "run_id": 1,
        "event_id": 2,
        "event_type": "t",
        "mjd": 3.5,
        "is_real_event": True,
    }
    assert m["progress"] == {
        "summary": "s",
        "processing_stats": {"rate": {"x": 1}},
        "start": None,
        "end": None,
    }
    assert m["classifiers"] == {"a": 1, "rescan": True, "origin_scan_id": "origin"}
    assert (m["is_deleted"], m["replaced_by_scan_id"], m["last_updated"]) == (True, "next", 1700000001.0)
    status = view.scan_status(scan, None)
    assert status["scan_state"] == "ABORTED__PARTIAL_RESULT_GENERATED"
    assert status["wms_deactivated"] == "ABORTED" and status["scan_complete"] is False
    assert status["scanner_server_logs"] == {"url": None}
    assert view.scan_request(scan, [])["classifiers"] == {"a": 1}  # the user's classifiers only


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ({}, "PENDING__PRESTARTUP"),
        ({"workflow": {"id": "wf"}}, "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"),
        ({"workflow": {"id": "wf"}, "progress": {"processing_stats": {}}}, "IN_PROGRESS__WAITING_ON_FIRST_PIXEL_RECO"),
        ({"workflow": {"id": "wf", "deactivated": "FINISHED"}}, "FINISHED__WAITING_ON_SCANNER_SERVER_STARTUP"),
        ({"result": {"isFinal": True, "updatedAt": 1.0}}, "SCAN_HAS_FINAL_RESULT"),
        ({"result": {"isFinal": False, "updatedAt": 1.0}}, "PENDING__PRESTARTUP"),
    ],
)  # fmt: skip
def test_state(status: dict[str, Any], state: str) -> None:
    assert view.state(with_status(**status)) == state


def test_projections() -> None:
    m = manifest.of(SCAN)
    assert view.project(m, view.pipe_projection("scan_id|priority|nope")) == {
        "scan_id": m["scan_id"],
        "priority": 4,
    }
    assert view.project(m, view.pipe_projection("*")) == m
    assert view.project(m, view.pipe_projection("scan_id|*")) == {"scan_id": m["scan_id"]}
    assert view.body_projection("*") is None and view.body_projection(["*", "x"]) is None
    assert view.find_projection(["*"]) == view.find_projection("*")
    assert not view.find_projection("*") & view.FIND_DISALLOWED
    assert view.find_projection(["scan_id", "wms_task"]) & view.FIND_DISALLOWED == {"wms_task"}


def test_backlog_and_workflow_views() -> None:
    assert view.backlog_entry(SCAN) is None
    # The entry's priority is the spec's (4); a stale copy some older operator kept in status is ignored.
    scan = with_status(backlog={"enteredAt": 5.0, "priority": 2, "pendingSince": 6.0, "attempts": 1})
    assert view.backlog_entry(scan) == {
        "scan_id": SCAN["metadata"]["name"], "timestamp": 5.0, "pickled_k8s_job": None, "priority": 4,
        "pending_timestamp": 6.0, "next_attempt": 1, "position": None,
    }  # fmt: skip
    assert view.workflow_id_view(SCAN) == {
        "workflow_id": "not-yet-requested", "requested_wms_workflow": False, "eligible_for_wms": True,
        "wms_address": None,
    }  # fmt: skip
    assert view.workforce(SCAN) == {
        "workflow_id": "not-yet-requested",
        "statuses": {},
        "n_running": 0,
        "top_errors": {},
    }
    assert view.logs_url(SCAN, "https://g/?c=skyscan-server-{scan_id}&n={namespace}", "ns") == (
        f"https://g/?c=skyscan-server-{SCAN['metadata']['name']}&n=ns"
    )


def waiting(
    name: str, priority: int, entered: float, admitted: bool = False, **backlog: Any
) -> dict[str, Any]:
    scan = with_status(backlog={"enteredAt": entered, **backlog})
    scan["metadata"] = {**scan["metadata"], "name": name}
    scan["spec"] = {**scan["spec"], "priority": priority}
    if admitted:
        scan["status"]["conditions"] = [{"type": "Admitted", "status": "True", "reason": "Admitted"}]
    return scan


def test_the_backlog_in_admission_order_with_positions() -> None:
    scans = [waiting("old-low", 0, 1), waiting("new-high", 200, 5), waiting("b-high", 200, 2),
             waiting("a-high", 200, 2), waiting("starting", 0, 9, admitted=True), waiting("mid", 100, 0),
             SCAN]  # fmt: skip
    entries = view.backlog_entries(scans)
    assert [(e["scan_id"], e["position"]) for e in entries] == [
        ("starting", None), ("a-high", 1), ("b-high", 2), ("new-high", 3), ("mid", 4), ("old-low", 5)]  # fmt: skip
    assert entries[1] == {**view.backlog_entry(scans[3]), "position": 1}  # type: ignore[dict-item]


def test_a_waiting_scans_place_and_estimated_wait() -> None:
    status = view.scan_status(SCAN, None)
    assert status["backlog"] is None and status["is_deleted"] is False
    assert status["wms_workforce"] == view.workforce(SCAN)
    assert view.scan_status(waiting("w", 0, 1), None)["backlog"] is None  # no place written yet
    placed = waiting("w", 0, 1, waitReason="Priority", position=3, estimatedStart=1090.0)
    assert view.scan_status(placed, None, now=1000.0)["backlog"] == {
        "position": 3, "wait_reason": "Priority", "estimated_start": 1090.0, "estimated_wait_seconds": 90.0}  # fmt: skip
    assert view.backlog_place(placed, 1100.0)["estimated_wait_seconds"] == 0.0  # type: ignore[index]
    far = waiting("w", 0, 1, waitReason="Quota")
    assert view.backlog_place(far, 1000.0) == {
        "position": None, "wait_reason": "Quota", "estimated_start": None, "estimated_wait_seconds": None}  # fmt: skip
    soon = waiting("w", 0, 1, waitReason="Rate", position=1, estimatedStart=time.time() + 1000)
    assert 990 < view.scan_status(soon, None)["backlog"]["estimated_wait_seconds"] <= 1000  # from now


def test_merge_patch_turns_old_into_new() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2, "w": 0}, "c": [1], "e": 5}
    new = {"b": {"x": 3, "w": 0}, "c": [2], "d": {"z": 1}, "e": 5}
    assert merge_patch(old, new) == {"a": None, "b": {"x": 3, "y": None}, "c": [2], "d": {"z": 1}}
    assert merge_patch({}, new) == new
