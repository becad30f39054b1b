"""Watch bodies to summaries, and the store's indexes (pure, in memory)."""

from __future__ import annotations

from typing import Any

from skyscan import conditions as cond
from skyscan.model import BacklogStatus
from skyscan.packing import Packer
from skyscan.scan_record import ScanRecord
from skyscan_operator.backlog import Hold, Place
from skyscan_operator.live_scans import (
    LiveScans,
    job_view,
    kept,
    key_of,
    pod_view,
    shown_place,
    waiting_status,
)
from skyscan_operator.observed import Admission, WorkflowView
from skyscan_operator.settings import OperatorSettings

NOW = 1_800_000_000.0
S = OperatorSettings(replacement_window_seconds=3600)


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"skyscan.io/scan-id": "s1"}},
        "status": status,
    }


def terminated(reason: str, code: int) -> dict[str, Any]:
    return {"containerStatuses": [{"state": {"terminated": {"reason": reason, "exitCode": code}}}]}


def test_pod_failures_that_call_for_a_replacement() -> None:
    assert pod_view(pod({"phase": "Failed", **terminated("OOMKilled", 137)})).transient_failure
    assert pod_view(pod({"phase": "Failed", **terminated("Error", 143)})).transient_failure
    assert pod_view(pod({"phase": "Failed", "reason": "Evicted"})).transient_failure
    waiting = {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    assert pod_view(pod({"phase": "Running", **waiting})).reason == "CrashLoopBackOff"
    assert not pod_view(pod({"phase": "Failed", **terminated("Error", 1)})).transient_failure


def test_a_container_waiting_on_its_image_shows_why_sidecar_included() -> None:
    waiting = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image x"}}}
    for statuses in ("containerStatuses", "initContainerStatuses"):
        view = pod_view(pod({"phase": "Pending", statuses: [waiting]}))
        assert (view.reason, view.message) == ("ImagePullBackOff", "Back-off pulling image x")
        assert not view.transient_failure  # a new scanner would wait for the same image
    done = pod_view(
        pod({"phase": "Succeeded", "startTime": "2026-01-01T00:00:00Z", **terminated("Completed", 0)})
    )
    assert not done.transient_failure and done.started_at == cond.epoch("2026-01-01T00:00:00Z")


def test_job_view() -> None:
    body = {"metadata": {"name": "j", "creationTimestamp": "t"}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}  # fmt: skip
    view = job_view(body)
    assert view.failed and view.reason == "DeadlineExceeded" and not view.complete


def scan(name: str, status: dict[str, Any], rv: str = "1", age: float = 0.0, **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv,
            "creationTimestamp": cond.iso(NOW - age), "managedFields": [{"manager": "kubectl"}]}  # fmt: skip
    return {"metadata": meta, "spec": spec, "status": status}


def store() -> LiveScans:
    return LiveScans(S, clock=lambda: NOW)


QUEUED = {
    "backlog": {"enteredAt": NOW, "attempts": 0},
    "conditions": cond.put([], cond.ADMITTED, False, "Queued", "waiting in the backlog", NOW, 1),
}


def test_indexes_follow_the_scans() -> None:
    s = store()
    s.put_scan(scan("a", QUEUED))
    assert s.waiting == {("ns", "a")} and not s.running
    live = {"workflow": {"id": "WF-1"}, "job": {"name": "j", "state": "Running"}}
    assert s.put_scan(scan("a", live, rv="2"))
    assert not s.waiting and s.running == {("ns", "a")} and s.live_workflows == {"WF-1": ("ns", "a")}
    assert not s.put_scan(scan("a", QUEUED, rv="1"))  # an older version never replaces a newer one
    ended = {"workflow": {"id": "WF-1", "deactivated": "ABORTED"}, "job": {"name": "j", "state": "Succeeded"}}
    s.put_scan(scan("a", ended, rv="3"))
    assert not s.running and not s.live_workflows
    s.drop_scan(("ns", "a"))
    assert ("ns", "a") not in s and len(s) == 0


def test_a_scan_is_kept_compact_and_read_back_whole() -> None:
    s = store()
    s.put_scan(scan("a", QUEUED, rv="7", priority=5))
    body = s.scan(("ns", "a"))
    assert body is not None and s.version(("ns", "a")) == 7
    assert "managedFields" not in body["metadata"] and body["spec"] == {"priority": 5}
    assert body["status"] == QUEUED
    reported = {
        "progress": {"summary": "s" * 5000, "processing_stats": {"rate": {"r": 1}}},
        "eventMetadata": {"runId": 1},
        "workflow": {"id": "WF-1"},
    }
    s.put_scan(scan("a", {**QUEUED, **reported}, rv="8"))
    body = s.scan(("ns", "a"))
    assert body is not None and "eventMetadata" not in body["status"]
    assert body["status"]["progress"] == {"processing_stats": {"rate": {"r": 1}}}
    assert ScanRecord(body).scan_state == "IN_PROGRESS__PARTIAL_RESULT_GENERATED"


def test_a_waiting_scan_joins_the_line_once_its_event_is_seen() -> None:
    s = store()
    s.put_scan(scan("a", QUEUED))
    assert ("ns", "a") not in s.line  # its sensor event not seen stored yet
    s.events[("ns", "a")] = (True, NOW)  # what a reconcile's CheckEvent records
    s.refresh(("ns", "a"))
    assert ("ns", "a") in s.line
    s.admit(("ns", "a"))
    s.line.remove(("ns", "a"))  # as a tick that admits it does
    s.put_scan(scan("a", QUEUED, rv="2"))  # an event before its admission is reconciled
    assert ("ns", "a") not in s.line and s.granted == {("ns", "a")}
    assert s.take_admission(("ns", "a")) is not None and s.granted == {("ns", "a")}  # still starting
    s.refresh(("ns", "a"))  # the attempt did not happen: it waits again
    assert ("ns", "a") in s.line and not s.granted


def test_the_line_follows_the_scans_and_their_holds() -> None:
    s = store()
    s.events[("ns", "a")] = (True, NOW)
    s.put_scan(scan("a", QUEUED, priority=200))
    decision = s.line.tick(running=0, now=NOW, last_low_priority_admission=None)
    assert decision.admit == [("ns", "a")]
    s.put_scan(scan("b", QUEUED, priority=200))
    s.events[("ns", "b")] = (True, NOW)
    s.refresh(("ns", "b"))
    s.put_scan(scan("c", QUEUED, priority=200, rv="2"))
    s.events[("ns", "c")] = (True, NOW)
    s.refresh(("ns", "c"))
    decision = s.line.tick(running=0, now=NOW, last_low_priority_admission=None)
    assert decision.admit == [("ns", "b")]
    assert decision.hold == {("ns", "c"): Hold("Queued", "waiting for a backlog tick")}
    held = {**QUEUED, "conditions": cond.put([], cond.ADMITTED, False, "Queued", "waiting for a backlog tick",
                                              NOW, 1)}  # fmt: skip
    s.put_scan(scan("c", held, rv="3", priority=200))
    assert s.line.tick(running=0, now=NOW, last_low_priority_admission=None).admit == [("ns", "c")]


def test_a_scan_shows_its_place_and_is_told_a_new_one_with_its_hold() -> None:
    s = store()
    s.events[("ns", "a")] = (True, NOW)
    shown = {**QUEUED, "backlog": {**QUEUED["backlog"], "waitReason": "Priority", "position": 2}}
    s.put_scan(scan("a", shown, priority=200))
    decision = s.line.tick(running=1, now=NOW, last_low_priority_admission=None)
    assert decision.admit == [("ns", "a")]  # shown as second, it is first now
    s.put_scan(scan("b", {**QUEUED, "backlog": {**QUEUED["backlog"], "waitReason": "Priority"}}, priority=0))
    s.events[("ns", "b")] = (True, NOW)
    s.refresh(("ns", "b"))
    assert s.line.tick(running=1, now=NOW, last_low_priority_admission=NOW).place == {}  # as shown
    s.hold(("ns", "b"), Hold("Queued", "q"))
    s.hold(("ns", "b"), None, Place("Rate", 1))
    assert s.admissions[("ns", "b")] == Admission(False, "Queued", "q", Place("Rate", 1))
    s.hold(("ns", "b"), Hold("ConcurrencyLimit", "c"))
    assert s.take_admission(("ns", "b")) == Admission(False, "ConcurrencyLimit", "c", Place("Rate", 1))
    s.hold(("ns", "b"), None, Place("Quota"))
    assert s.take_admission(("ns", "b")) == Admission(False, place=Place("Quota"))


def test_the_place_a_scan_shows() -> None:
    shown = BacklogStatus(entered_at=1, wait_reason="Priority", position=2, estimated_start=5.0)
    assert shown_place(shown) == Place("Priority", 2, 5.0)
    assert shown_place(BacklogStatus(entered_at=1, position=2)) is None  # none without a reason


def test_settled_scans_are_forgotten_but_their_lineage_is_kept() -> None:
    s = store()
    s.put_scan(scan("a", QUEUED))
    s.events[("ns", "a")] = (True, NOW)
    s.settle(("ns", "a"))
    assert ("ns", "a") not in s and not s.waiting and not s.events
    assert s.lineage_recent(("ns", "a"), since=0) == 1


def test_lineage_counts_rescans_of_one_request_within_the_window() -> None:
    s = store()
    s.put_scan(scan("root", {}))
    s.put_scan(scan("r1", {}, rescanOf="root"))
    s.settle(("ns", "r1"))  # a replaced scan, finished: its place in the lineage stays
    s.put_scan(scan("r2", {}, rescanOf="r1"))
    s.put_scan(scan("other", {}))
    s.put_scan(scan("ancient", {}, age=7200))  # created before the window: never recorded
    assert s.lineage_recent(("ns", "r2"), since=0) == 3
    assert s.lineage_recent(("ns", "other"), since=0) == 1
    assert s.lineage_recent(("ns", "r2"), since=NOW + 1) == 0
    assert s.lineage_recent(("ns", "ancient"), since=0) == 0
    s.forget_lineage(before=NOW + 1)
    assert s.lineage_recent(("ns", "r2"), since=0) == 0


def test_waiting_scans_pack_small_after_a_first_scan_without_status() -> None:
    """The store's packer knows a waiting scan's status from the start: the first scan it packs is
    often one just created (no status), and the thousands after it wait in the backlog."""
    spec = {"priority": 0, "dockerTag": "4.1.0", "sensorEventId": "e" * 32, "classifiers": {"origin": "x"}}
    waiting = [scan(f"s{i:031d}", waiting_status(S, NOW + i), str(i + 2), **spec) for i in range(50)]

    def packed_sizes(packer: Packer) -> list[int]:
        packer.pack(kept(scan("fresh", {}, **spec)))
        return [len(packer.pack(kept(body))) for body in waiting]

    s = store()
    s.put_scan(scan("fresh", {}, **spec))
    for body in waiting:
        s.put_scan(body)
        assert s.scan(key_of(body)) == kept(body)  # a fresh copy of what was packed
    assert sum(packed_sizes(Packer(also=waiting_status(S, NOW)))) < 0.6 * sum(packed_sizes(Packer()))


def test_an_ended_workflow_is_read_once_more_then_forgotten() -> None:
    """A deactivation leaves every taskforce stopping: a status that shows one that is not (or none)
    predates it, and the poller reads the workflow once more before its scan settles."""
    s, key = store(), ("ns", "a")
    starting = [{"taskforce_uuid": "TF-1", "phase": "pending-starter"}]
    live = {"workflow": {"id": "WF-1"}, "job": {"name": "j", "state": "Running"}, "taskforces": starting}
    s.put_scan(scan("a", live))
    assert s.live_workflows == {"WF-1": key} and not s.final_reads
    ended = {
        **live,
        "workflow": {"id": "WF-1", "deactivated": "ABORTED"},
        "job": {"name": "j", "state": "Failed"},
    }
    s.put_scan(scan("a", ended, rv="2"))
    assert not s.live_workflows and s.final_reads == {"WF-1": key} and s.awaits_final_read(key)
    stopping = ({"taskforce_uuid": "TF-1", "phase": "pending-stopper", "workflow_id": "WF-1"},)
    assert s.read_after_end("WF-1", stopping) == key
    assert not s.final_reads and not s.awaits_final_read(key)
    assert s.workflows["WF-1"].taskforces == stopping  # kept for the reconcile, whatever comes between
    s.put_scan(scan("a", ended, rv="3"))  # another event before that reconcile: still read once only
    assert not s.final_reads and s.workflows["WF-1"].taskforces == stopping
    assert s.read_after_end("WF-1", stopping) is None  # not asked for again
    s.settle(key)
    assert not s.workflows and not s._read_after_end and not s._workflow_of


def test_an_ended_workflow_read_to_nothing_leaves_its_status() -> None:
    s, key = store(), ("ns", "a")
    s.put_scan(scan("a", {"workflow": {"id": "WF-1", "deactivated": "FINISHED"}}))
    assert s.final_reads == {"WF-1": key}  # none shown: read once
    assert s.read_after_end("WF-1", ()) == key  # to settle it
    assert "WF-1" not in s.workflows
    shown = [{"taskforce_uuid": "TF-1", "phase": "condor-complete"}]
    s.put_scan(scan("b", {"workflow": {"id": "WF-2", "deactivated": "FINISHED"}, "taskforces": shown}))
    assert "WF-2" not in s.final_reads  # what it shows is already after the end
    s.drop_scan(key)
    assert "WF-1" not in s._read_after_end


def test_a_forgotten_workflow_leaves_no_poll_behind() -> None:
    """A workflow id the scan no longer records (lost, a new one asked) is neither polled nor kept."""
    s, key = store(), ("ns", "a")
    s.put_scan(scan("a", {"workflow": {"id": "WF-1"}}))
    s.workflows["WF-1"] = WorkflowView(None)
    s.put_scan(scan("a", {"workflow": {"id": "WF-2"}}, rv="2"))
    assert s.live_workflows == {"WF-2": key} and "WF-1" not in s.workflows
    s.put_scan(scan("a", {}, rv="3"))
    assert not s.live_workflows and not s._workflow_of
