"""The planner (pure): each step of a scan's life, from status and observations to status and actions."""

from __future__ import annotations

from typing import Any

import pytest

from skyscan import conditions as cond
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from skyscan.scan_record import ScanRecord
from skyscan_operator.actions import (
    AddWorkers,
    CheckEvent,
    CreateJob,
    Deactivate,
    DeleteJob,
    IssueScannerCredential,
    ProvisionQueues,
    RecoverWorkflow,
    Replace,
    RequestWorkflow,
    RevokeScannerCredential,
    SetFinalizer,
)
from skyscan_operator.archiver import finished_at
from skyscan_operator.backlog import Place
from skyscan_operator.endings import replacement_body
from skyscan_operator.observed import Admission, JobView, Observed, PodView, ScanView, WorkflowView
from skyscan_operator.planner import INTERRUPTIONS, event_seen, plan
from skyscan_operator.settings import OperatorSettings
from tests.unit.test_crd import minimal_spec

NOW = 1_800_000_000.0
S = OperatorSettings(
    wms_address="http://wms", max_start_attempts=3, start_timeout_seconds=300, wms_timeout_seconds=30
)


def scan(status: dict[str, Any] | None = None, finalizers: list[str] | None = None, deleting: bool = False,
         **spec: Any) -> ScanView:  # fmt: skip
    meta = {"name": "s1", "namespace": "ns", "uid": "uid-1", "generation": 1, "resourceVersion": "5",
            "creationTimestamp": cond.iso(NOW - 100), "finalizers": finalizers or []}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = cond.iso(NOW)
    return ScanView.from_body({"metadata": meta, "spec": minimal_spec(**spec), "status": status or {}})


def admitted(**workflow: Any) -> dict[str, Any]:
    conds = cond.put([], cond.ADMITTED, True, "Admitted", "start attempt 1 of 3", NOW - 5, 1)
    return {
        "conditions": conds,
        "backlog": {"enteredAt": NOW - 100, "pendingSince": NOW - 5, "attempts": 1},
        "workflow": workflow,
    }


def started() -> dict[str, Any]:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 5), queuesActivated=True)
    status["backlog"] = None
    status["job"] = {"name": "skyscan-s1", "createdAt": cond.iso(NOW - 4), "state": "Running"}
    return status


def reason(status: dict[str, Any], type_: str) -> str | None:
    c = cond.find(status["conditions"], type_)
    return c["reason"] if c else None


STORED = Observed(event=True)  # the scan's sensor event is stored


def test_a_new_scan_enters_the_backlog() -> None:
    p = plan(scan(priority=7), STORED, NOW, S)
    assert p.status["backlog"] == {
        "enteredAt": NOW - 100,
        "pendingSince": 0.0,
        "attempts": 0,
        "interruptions": 0,
    }
    assert reason(p.status, cond.ADMITTED) == "Queued"
    assert p.status["state"] == "PENDING__PRESTARTUP" and p.status["observedGeneration"] == 1
    assert p.actions == [] and [e.reason for e in p.events] == ["Queued"]


def test_a_held_scan_shows_the_backlogs_reason() -> None:
    first = plan(scan(), STORED, NOW, S).status
    held = Observed(event=True, admission=Admission(False, "ConcurrencyLimit", "at most 2"))
    p = plan(scan(first), held, NOW, S)
    assert reason(p.status, cond.ADMITTED) == "ConcurrencyLimit" and p.actions == []


def test_a_held_scan_shows_its_place_until_admitted() -> None:
    first = plan(scan(), STORED, NOW, S).status
    placed = Admission(False, "Queued", "waiting", Place("Priority", 3, NOW + 60))
    p = plan(scan(first), Observed(event=True, admission=placed), NOW, S)
    b = p.status["backlog"]
    assert (b["waitReason"], b["position"], b["estimatedStart"]) == ("Priority", 3, NOW + 60)
    moved = Observed(event=True, admission=Admission(False, place=Place("Rate", 1)))  # a place only
    again = plan(scan(p.status), moved, NOW, S).status
    assert again["backlog"]["waitReason"] == "Rate" and "estimatedStart" not in again["backlog"]
    assert again["conditions"] == p.status["conditions"]  # the hold shown stays
    admitted = plan(scan(again), Observed(event=True, admission=Admission(True)), NOW, S).status
    assert {"waitReason", "position", "estimatedStart"}.isdisjoint(admitted["backlog"])


def test_admission_writes_the_intent_marker_before_requesting_the_workflow() -> None:
    first = plan(scan(), STORED, NOW, S).status
    p = plan(scan(first), Observed(event=True, admission=Admission(True)), NOW, S)
    assert p.status["backlog"]["attempts"] == 1 and p.status["backlog"]["pendingSince"] == NOW
    assert p.status["workflow"]["requestedAt"] == cond.iso(NOW)
    assert p.status["workflow"]["address"] == "http://wms"
    assert [type(a) for a in p.actions] == [SetFinalizer, RequestWorkflow]  # the finalizer guards the request
    assert p.actions[0] == SetFinalizer(True)
    assert [e.reason for e in p.events] == ["Admitted"]


def test_a_lost_answer_is_looked_up_after_the_request_timeout() -> None:
    status = admitted(requestedAt=cond.iso(NOW - 10))
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW, S)
    assert p.actions == [] and p.requeue_after == 20  # the first request may still be in flight
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW + 25, S)
    (action,) = p.actions
    assert isinstance(action, RecoverWorkflow) and action.create_if_missing and action.marker == "uid-1"


def test_queues_then_job() -> None:
    p = plan(
        scan(admitted(id="WF-1", requestedAt=cond.iso(NOW - 3)), finalizers=[FINALIZER]), Observed(), NOW, S
    )
    assert p.actions == [ProvisionQueues("WF-1")]
    assert reason(p.status, cond.WORKFLOW_READY) == "WaitingForQueues"
    assert p.status["state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3), queuesActivated=True)
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW, S)
    issue, create = p.actions  # the scanner's own credential first: the Job reads it
    assert isinstance(issue, IssueScannerCredential)
    assert issue.lifetime_seconds > S.job_active_deadline_seconds
    assert isinstance(create, CreateJob) and create.job["metadata"]["name"] == "skyscan-s1"
    assert reason(p.status, cond.WORKFLOW_READY) == "QueuesActivated"
    status["scannerCredential"] = {"secret": "skyscan-s1-scanner", "expiresAt": NOW + 3600}
    (create,) = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW, S).actions  # a retry reuses it
    assert isinstance(create, CreateJob)


@pytest.mark.parametrize("why", ["soft-deleted", "hard-deleted", "job ended", "failed"])
def test_the_scanner_credential_is_revoked_when_the_scanner_may_no_longer_act(why: str) -> None:
    status = started()
    status["scannerCredential"] = {"secret": "skyscan-s1-scanner", "expiresAt": NOW + 3600}
    job = JobView("skyscan-s1", cond.iso(NOW - 4))
    pods: tuple[PodView, ...] = (PodView("p", "Running", started_at=NOW - 3),)
    changes: dict[str, Any] = {}
    if why == "soft-deleted":
        changes["deleted"] = True
    elif why == "job ended":
        job, pods = JobView("skyscan-s1", cond.iso(NOW - 4), complete=True), (PodView("p", "Succeeded"),)
    elif why == "failed":
        status["conditions"] = cond.put(status["conditions"], cond.FAILED, True, "ScannerFailed", "x", NOW, 1)
    record = scan(status, finalizers=[FINALIZER], deleting=why == "hard-deleted", **changes)
    p = plan(record, Observed(job=job, pods=pods), NOW, S)
    assert RevokeScannerCredential("skyscan-s1-scanner") in p.actions
    live = plan(scan(status, finalizers=[FINALIZER]), Observed(job=JobView("skyscan-s1", cond.iso(NOW - 4)),
                pods=(PodView("p", "Running", started_at=NOW - 3),)), NOW, S)  # fmt: skip
    assert why == "failed" or not any(isinstance(a, RevokeScannerCredential) for a in live.actions)
    revoked = {**status, "scannerCredential": {"secret": "skyscan-s1-scanner", "revoked": True}}
    again = plan(scan(revoked, finalizers=[FINALIZER], deleting=why == "hard-deleted", **changes),
                 Observed(job=job, pods=pods), NOW, S)  # fmt: skip
    assert not any(isinstance(a, RevokeScannerCredential) for a in again.actions)  # once


def test_a_kubectl_scans_env_off_the_allow_list_is_left_out_with_a_warning() -> None:
    """The shim refuses such names with a 400, and the operator fails a Scan made with kubectl that has
    them before it starts (`_refuse_invalid`, here not observed); as defence in depth the Job builder
    leaves them out anyway, and `kubectl describe` says which."""
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3), queuesActivated=True)
    env = {"HTTPS_PROXY": "http://evil:3128", "SKYSCAN_LOG": "DEBUG", "OMP_NUM_THREADS": 2}
    p = plan(scan(status, finalizers=[FINALIZER], scannerServerEnvFromUser=env), Observed(), NOW, S)
    (warning,) = [e for e in p.events if e.reason == "ScannerEnvRefused"]
    assert warning.type == "Warning" and warning.message.endswith("left out: HTTPS_PROXY, OMP_NUM_THREADS")
    (create,) = [a for a in p.actions if isinstance(a, CreateJob)]
    names = {e["name"] for e in create.job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "SKYSCAN_LOG" in names and not names & {"HTTPS_PROXY", "OMP_NUM_THREADS"}
    allowed = scan(status, finalizers=[FINALIZER], scannerServerEnvFromUser={"SKYSCAN_LOG": "DEBUG"})
    assert "ScannerEnvRefused" not in [e.reason for e in plan(allowed, Observed(), NOW, S).events]


def test_a_job_found_after_a_restart_is_adopted_not_created_again() -> None:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3), queuesActivated=True)
    job = JobView("skyscan-s1", cond.iso(NOW - 1))
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(job=job), NOW, S)
    assert p.actions == [] and p.status["backlog"] is None
    assert reason(p.status, cond.ADMITTED) == "Started" and p.status["job"]["state"] == "Pending"


def test_the_status_names_the_scanners_pod_and_keeps_it_once_the_pod_is_gone() -> None:
    """Whose log the shim reads while the scanner runs (`status.job.pod`)."""
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3), queuesActivated=True)
    job = JobView("skyscan-s1", cond.iso(NOW - 4))
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(job=job), NOW, S)
    assert p.status["job"].get("pod") is None
    running = Observed(job=job, pods=(PodView("skyscan-s1-bcdfg", "Running", started_at=NOW - 3),))
    p = plan(scan(p.status, finalizers=[FINALIZER]), running, NOW, S)
    assert p.status["job"]["pod"] == "skyscan-s1-bcdfg"
    p = plan(scan(p.status, finalizers=[FINALIZER]), Observed(job=job), NOW, S)
    assert p.status["job"]["pod"] == "skyscan-s1-bcdfg"


def test_failed_attempts_are_bounded() -> None:
    status = admitted()
    status["conditions"] = cond.put([], cond.ADMITTED, False, "WMSRejected", "HTTP 400", NOW, 1)
    status["backlog"]["attempts"] = 3
    p = plan(scan(status), Observed(), NOW, S)
    assert reason(p.status, cond.FAILED) == "StartAttemptsExhausted"
    assert "HTTP 400" in cond.find(p.status["conditions"], cond.FAILED)["message"]  # type: ignore[index]
    assert p.status["backlog"] is None and p.actions == []
    assert ScanRecord({"spec": {}, "status": p.status}).is_terminal


@pytest.mark.parametrize("why", sorted(INTERRUPTIONS))
def test_an_interrupted_attempt_never_fails_the_scan(why: str) -> None:
    status = admitted()
    status["conditions"] = cond.put([], cond.ADMITTED, False, why, "outage", NOW, 1)
    status["backlog"].update(attempts=3, interruptions=40)
    p = plan(scan(status), STORED, NOW, S)
    assert cond.find(p.status["conditions"], cond.FAILED) is None
    assert p.status["backlog"]["attempts"] == 3 and reason(p.status, cond.ADMITTED) == why  # still waits
    p = plan(scan(status), Observed(event=True, admission=Admission(True)), NOW, S)
    assert reason(p.status, cond.ADMITTED) == "Admitted" and p.status["backlog"]["interruptions"] == 40


def test_the_start_timeout_runs_only_while_the_wms_and_the_api_server_answer() -> None:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 400))
    status["backlog"]["pendingSince"] = NOW - 400
    outage_ended = Observed(healthy_since=NOW - 100)  # or the operator restarted then
    p = plan(scan(status, finalizers=[FINALIZER]), outage_ended, NOW, S)
    assert reason(p.status, cond.ADMITTED) == "Admitted" and p.actions == [ProvisionQueues("WF-1")]
    assert p.requeue_after == pytest.approx(200, abs=0.1)
    p = plan(scan(status, finalizers=[FINALIZER]), outage_ended, NOW + 201, S)
    assert reason(p.status, cond.ADMITTED) == "StartTimedOut"


def test_a_scan_starts_only_once_its_sensor_event_is_seen_stored() -> None:
    p = plan(scan(), Observed(), NOW, S)  # not looked at yet
    assert p.actions == [CheckEvent("ev1")] and reason(p.status, cond.ADMITTED) == "Queued"
    p = plan(scan(p.status), Observed(event=True, admission=Admission(True)), NOW, S)
    assert reason(p.status, cond.ADMITTED) == "Admitted"


def test_a_scan_waits_for_its_missing_event_then_fails_after_the_grace_period() -> None:
    created = NOW - 100  # scan() is created 100 s before NOW
    grace = S.model_copy(update={"event_grace_seconds": 150})
    first = plan(scan(), Observed(), NOW, grace).status
    missing = Observed(event=False, admission=Admission(True))  # even if the backlog said go
    p = plan(scan(first), missing, NOW, grace)
    admitted = cond.find(p.status["conditions"], cond.ADMITTED)
    assert admitted is not None and (admitted["status"], admitted["reason"]) == ("False", "EventMissing")
    assert "skyscan-event-ev1" in admitted["message"] and p.status["backlog"]["attempts"] == 0
    assert p.actions == [] and p.requeue_after == 5.0  # looks again: a 100 s old scan, seldom
    assert plan(scan(first), missing, created + 149.5, grace).requeue_after == pytest.approx(0.5)
    # Stored meanwhile: back to the normal backlog.
    p2 = plan(scan(p.status), STORED, NOW + 1, grace)
    assert (
        reason(p2.status, cond.ADMITTED) == "Queued"
        and cond.find(p2.status["conditions"], cond.FAILED) is None
    )
    # Never stored: Failed, off the backlog, nothing held.
    p = plan(scan(p.status), missing, created + 150, grace)
    failed = cond.find(p.status["conditions"], cond.FAILED)
    assert failed is not None and (failed["status"], failed["reason"]) == ("True", "EventMissing")
    assert "within 150s" in failed["message"] and p.status["backlog"] is None and p.actions == []
    assert [e.reason for e in p.events] == ["EventMissing"]
    assert ScanRecord({"spec": {}, "status": p.status}).is_terminal
    assert plan(scan(p.status), missing, created + 200, grace).actions == []  # terminal: inert


def test_a_new_scan_whose_event_is_being_stored_looks_again_at_once_and_shows_nothing_missing() -> None:
    young = NOW - 100 + 0.1  # scan() was made 0.1 s ago
    first = plan(scan(), Observed(), young, S).status
    p = plan(scan(first), Observed(event=False), young, S)
    assert reason(p.status, cond.ADMITTED) == "Queued" and p.status == first  # nothing more to write
    assert p.actions == [] and p.requeue_after == 0.25
    p = plan(scan(first), Observed(event=False), NOW - 100 + 2, S)  # still missing, 2 s on: shown
    assert reason(p.status, cond.ADMITTED) == "EventMissing" and p.requeue_after == 1.0


@pytest.mark.parametrize(
    ("looked_after", "now_after", "seen"),
    [
        (0.1, 0.3, False),  # missed at 0.1 s: looked again 0.25 s later
        (0.1, 0.36, None),
        (4.0, 5.9, False),  # missed at 4 s: 2 s later
        (4.0, 6.01, None),
        (60.0, 64.9, False),  # missed at 60 s: 5 s later at most
        (60.0, 65.01, None),
    ],
)
def test_a_missing_event_is_looked_for_again_after_half_the_scans_age(
    looked_after: float, now_after: float, seen: bool | None
) -> None:
    created = NOW - 100
    assert event_seen((False, created + looked_after), created, created + now_after) is seen
    assert event_seen((True, created + looked_after), created, created + 1000) is True
    assert event_seen(None, created, NOW) is None


def test_an_attempt_that_takes_too_long_fails() -> None:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 400))
    status["backlog"]["pendingSince"] = NOW - 400
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW, S)
    assert reason(p.status, cond.ADMITTED) == "StartTimedOut" and p.status["backlog"]["pendingSince"] == NOW
    assert p.actions == []


@pytest.mark.parametrize("ended", ["job complete", "job failed", "pod failed"])
def test_a_replaced_scan_whose_scanner_ended_leaves_its_job_to_its_ttl(ended: str) -> None:
    """Nothing to stop, and its Pod (whose log the operator keeps) stays until the TTL."""
    job = JobView("skyscan-s1", None, complete=ended == "job complete", failed=ended == "job failed")
    pod = PodView("skyscan-s1-bcdfg", "Failed" if ended == "pod failed" else "Running", "OOMKilled", 137)
    p = plan(scan(started(), finalizers=[FINALIZER], deleted=True, replacedBy="NEWID"),
             Observed(job=job, pods=(pod,)), NOW, S)  # fmt: skip
    assert not any(isinstance(a, DeleteJob) for a in p.actions)
    assert reason(p.status, cond.DELETED) == "Replaced"
    alive = Observed(job=JobView("skyscan-s1", None), pods=(PodView("p", "Running"),))
    running = plan(scan(started(), finalizers=[FINALIZER], deleted=True, replacedBy="NEWID"), alive, NOW, S)
    assert DeleteJob("skyscan-s1") in running.actions


def test_soft_delete_aborts_and_deletes_the_job() -> None:
    p = plan(
        scan(started(), finalizers=[FINALIZER], deleted=True),
        Observed(job=JobView("skyscan-s1", None)),
        NOW,
        S,
    )
    assert set(p.actions) == {DeleteJob("skyscan-s1"), Deactivate("WF-1", "abort")}
    assert reason(p.status, cond.DELETED) == "SoftDeleted"
    aborted = {**started(), "workflow": {**started()["workflow"], "deactivated": "ABORTED"}}
    p = plan(scan(aborted, finalizers=[FINALIZER], deleted=True), Observed(), NOW, S)
    assert p.actions == [SetFinalizer(False)]
    assert p.status["state"] == "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP"
    assert ScanRecord({"spec": {"deleted": True}, "status": p.status}).is_terminal


def test_hard_delete_releases_then_lets_go() -> None:
    p = plan(scan(started(), finalizers=[FINALIZER], deleting=True), Observed(), NOW, S)
    assert p.actions == [Deactivate("WF-1", "abort")]
    intent_only = scan({"workflow": {"requestedAt": cond.iso(NOW)}}, finalizers=[FINALIZER], deleting=True)
    p = plan(intent_only, Observed(), NOW, S)
    assert p.actions == [RecoverWorkflow({}, "uid-1", create_if_missing=False)]
    p = plan(scan({}, finalizers=[FINALIZER], deleting=True), Observed(), NOW, S)
    assert p.actions == [SetFinalizer(False)]


def test_final_result_finishes_the_workflow_after_the_teardown_delay() -> None:
    status = {**started(), "result": {"isFinal": True, "updatedAt": NOW - 10}}
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW, S)
    assert p.actions == [] and p.requeue_after == 50
    assert p.status["state"] == "SCAN_HAS_FINAL_RESULT" and reason(p.status, cond.COMPLETE) == "FinalResult"
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(), NOW + 51, S)
    assert p.actions == [Deactivate("WF-1", "finished")]


def test_a_transient_pod_failure_gets_one_replacement() -> None:
    dead = PodView("skyscan-s1-x", "Failed", "OOMKilled", 137, NOW - 2)
    obs = Observed(job=JobView("skyscan-s1", None, failed=True), pods=(dead,), fresh_id="NEWID")
    p = plan(scan(started(), finalizers=[FINALIZER], classifiers={"k": "v"}), obs, NOW, S)
    (action,) = p.actions
    assert isinstance(action, Replace) and action.new_id == "NEWID"
    assert action.body["spec"]["rescanOf"] == "s1" and action.body["spec"]["classifiers"] == {"k": "v"}
    assert "deleted" not in action.body["spec"]
    assert p.status["job"]["replacement"] == "NEWID"  # the intent, written before the replacement exists
    assert p.status["job"]["state"] == "Failed" and reason(p.status, cond.SCANNER_RUNNING) == "OOMKilled"
    assert reason(p.status, cond.FAILED) is None
    # After a restart the same replacement is completed, never a second one chosen.
    again = plan(scan(p.status, finalizers=[FINALIZER], classifiers={"k": "v"}),
                 Observed(job=obs.job, pods=(dead,), fresh_id="OTHER"), NOW, S)  # fmt: skip
    assert again.actions == [Replace("NEWID", action.body)]
    # Once marked replaced (spec.deleted), it is soft-deleted like any other.
    done = plan(scan(p.status, finalizers=[FINALIZER], deleted=True, replacedBy="NEWID"),
                Observed(job=obs.job, pods=(dead,), replacement_exists=True), NOW, S)  # fmt: skip
    assert Deactivate("WF-1", "abort") in done.actions and not any(
        isinstance(a, Replace) for a in done.actions
    )
    assert reason(done.status, cond.DELETED) == "Replaced"


def test_replacement_is_throttled() -> None:
    dead = PodView("p", "Failed", "Error", 143)
    p = plan(
        scan(started(), finalizers=[FINALIZER]),
        Observed(pods=(dead,), lineage_recent=4, fresh_id="N"),
        NOW,
        S,
    )
    assert reason(p.status, cond.FAILED) == "ReplacementThrottled"
    assert p.actions == [Deactivate("WF-1", "abort")]


def test_a_non_transient_failure_fails_the_scan() -> None:
    dead = PodView("p", "Failed", "Error", 1)
    job = JobView("skyscan-s1", None, failed=True, reason="BackoffLimitExceeded")
    p = plan(scan(started(), finalizers=[FINALIZER]), Observed(job=job, pods=(dead,), fresh_id="N"), NOW, S)
    assert reason(p.status, cond.FAILED) == "ScannerFailed"
    assert p.actions == [Deactivate("WF-1", "abort")]


def test_a_scanner_image_that_cannot_be_pulled_fails_the_scan_after_the_grace_not_never() -> None:
    def pulling(reason_: str, since: float) -> Observed:
        waiting = PodView("skyscan-s1-x", "Pending", reason_, None, since, "pull access denied for x")
        return Observed(job=JobView("skyscan-s1", None), pods=(waiting,))

    grace = S.image_pull_grace_seconds
    p = plan(scan(started(), finalizers=[FINALIZER]), pulling("ImagePullBackOff", NOW - 10), NOW, S)
    assert reason(p.status, cond.FAILED) is None and p.requeue_after == grace - 10  # a registry blip may pass
    assert reason(p.status, cond.SCANNER_RUNNING) == "ImagePullBackOff"
    p = plan(scan(started(), finalizers=[FINALIZER]), pulling("ImagePullBackOff", NOW - grace), NOW, S)
    assert reason(p.status, cond.FAILED) == "ImageUnavailable"
    assert "pull access denied for x" in next(
        c["message"] for c in p.status["conditions"] if c["type"] == "Failed"
    )
    assert DeleteJob("skyscan-s1") in p.actions and Deactivate("WF-1", "abort") in p.actions
    # A name the runtime can never pull fails at once.
    p = plan(scan(started(), finalizers=[FINALIZER]), pulling("InvalidImageName", NOW), NOW, S)
    assert reason(p.status, cond.FAILED) == "ImageUnavailable"
    # A container the kubelet refuses to create (a root image under runAsNonRoot) fails after the grace.
    p = plan(
        scan(started(), finalizers=[FINALIZER]), pulling("CreateContainerConfigError", NOW - grace), NOW, S
    )
    assert reason(p.status, cond.FAILED) == "ContainerConfigInvalid"


def test_worker_requests() -> None:
    requests = [{"id": "r1", "location": "osg", "nWorkers": 5}]
    p = plan(scan(started(), finalizers=[FINALIZER], workerRequests=requests), Observed(), NOW, S)
    assert p.actions == [AddWorkers("r1", "WF-1", "osg", 5, "osg")]
    # Asked by the name launch aliases for the WMS (SKYSCAN_WMS_CLUSTERS_ALIAS), told as asked.
    aliased = S.model_copy(update={"wms_clusters_alias": {"local": "test-alpha"}})
    asked = [{"id": "r1", "location": "local", "nWorkers": 5}]
    p = plan(scan(started(), finalizers=[FINALIZER], workerRequests=asked), Observed(), NOW, aliased)
    assert p.actions == [AddWorkers("r1", "WF-1", "test-alpha", 5, "local")]
    p = plan(scan({}, workerRequests=requests), Observed(), NOW, S)
    assert p.status["workerRequests"] == [
        {"id": "r1", "state": "Refused", "reason": "a WMS workflow has not been assigned--cannot add workers"}
    ]
    # A workflow whose queues wait takes workers at once; an ended one, or a scan being deleted, none.
    waiting = started()
    waiting["workflow"]["queuesActivated"] = False
    p = plan(scan(waiting, finalizers=[FINALIZER], workerRequests=requests), Observed(), NOW, S)
    assert AddWorkers("r1", "WF-1", "osg", 5, "osg") in p.actions
    ended = started()
    ended["workflow"]["deactivated"] = "ABORTED"
    p = plan(scan(ended, finalizers=[FINALIZER], workerRequests=requests), Observed(), NOW, S)
    assert not any(isinstance(a, AddWorkers) for a in p.actions)
    assert p.status["workerRequests"][0]["reason"] == "its WMS workflow is aborted--cannot add workers"
    p = plan(
        scan(started(), finalizers=[FINALIZER], workerRequests=requests, deleting=True), Observed(), NOW, S
    )
    assert not any(isinstance(a, AddWorkers) for a in p.actions)
    assert p.status["workerRequests"][0]["state"] == "Refused"


def test_the_workforce_comes_from_the_batched_poll() -> None:
    tfs = (
        {"taskforce_uuid": "TF-1", "cluster_location": "osg", "n_workers": 5, "phase": "condor-submit",
         "compound_statuses": {"RUNNING": {"Tasking": 3, "Done": 1}, "IDLE": {"null": 1}},
         "top_task_errors": {"boom": 2}, "timestamp": 1},
        {"taskforce_uuid": "TF-2", "cluster_location": "sub-2", "n_workers": 2, "phase": "pre-launch",
         "compound_statuses": {"RUNNING": {"Tasking": 2, "FatalError": 4}}, "top_task_errors": {"boom": 1},
         "timestamp": 2},
    )  # fmt: skip
    p = plan(scan(started(), finalizers=[FINALIZER]), Observed(workflow=WorkflowView(None, tfs)), NOW, S)
    assert p.status["workforce"] == {
        "statuses": {"RUNNING": {"Tasking": 5, "Done": 1, "FatalError": 4}, "IDLE": {"null": 1}},
        "nRunning": 5,
        "topErrors": {"boom": 3},
    }
    assert [t["taskforce_uuid"] for t in p.status["taskforces"]] == ["TF-1", "TF-2"]
    p = plan(scan(started(), finalizers=[FINALIZER]), Observed(workflow=WorkflowView("ABORTED", tfs)), NOW, S)
    assert p.status["workflow"]["deactivated"] == "ABORTED" and SetFinalizer(False) in p.actions


def test_planning_is_idempotent() -> None:
    """Applying a plan's status and planning again changes nothing and repeats no event."""
    obs = Observed(
        job=JobView("skyscan-s1", cond.iso(NOW - 4)), pods=(PodView("p", "Running", None, None, NOW),)
    )
    first = plan(scan(started(), finalizers=[FINALIZER]), obs, NOW, S)
    second = plan(scan(first.status, finalizers=[FINALIZER]), obs, NOW + 30, S)
    assert second.status == first.status and second.actions == [] and second.events == []
    record = ScanRecord({"spec": {}, "status": second.status})
    assert record.is_running and not record.is_terminal


def test_a_replacement_does_not_carry_gitops_ownership_labels() -> None:
    labels = {
        "team": "realtime",
        "app.kubernetes.io/instance": "alerts",
        "argocd.argoproj.io/instance": "alerts",
        "kustomize.toolkit.fluxcd.io/name": "k",
    }
    meta = {"name": "s1", "namespace": "ns", "uid": "uid-1", "generation": 1, "labels": labels}
    original = ScanView.from_body({"metadata": meta, "spec": minimal_spec(deleted=True), "status": {}})
    body = replacement_body(original, "s2")
    assert body["metadata"]["labels"] == {"team": "realtime"}
    assert body["spec"]["rescanOf"] == "s1" and "deleted" not in body["spec"]


def test_a_failing_wms_poll_is_visible_until_it_recovers() -> None:
    tfs = ({"taskforce_uuid": "TF-1", "compound_statuses": {"RUNNING": {"Tasking": 2}}, "timestamp": 1},)
    down = Observed(wms_poll_error="HTTP 503 from the WMS")
    p = plan(scan(started(), finalizers=[FINALIZER]), down, NOW, S)
    wms = cond.find(p.status["conditions"], cond.WMS_AVAILABLE)
    assert wms is not None and (wms["status"], wms["reason"]) == ("False", "PollFailed")
    assert "HTTP 503" in wms["message"]
    assert p.actions == []  # nothing else changes while the WMS is away
    up = Observed(workflow=WorkflowView(None, tfs))
    p = plan(scan(p.status, finalizers=[FINALIZER]), up, NOW + 5, S)
    wms = cond.find(p.status["conditions"], cond.WMS_AVAILABLE)
    assert wms is not None and (wms["status"], wms["reason"]) == ("True", "Reachable")
    assert p.status["workforce"]["nRunning"] == 2
    queued = plan(scan(admitted()), down, NOW, S)  # no workflow yet: the poll is not this scan's concern
    assert cond.find(queued.status["conditions"], cond.WMS_AVAILABLE) is None


# --- the summary conditions (kstatus: Ready, Reconciling, Stalled) ---

RUNNING = Observed(
    job=JobView("skyscan-s1", cond.iso(NOW - 4)), pods=(PodView("p", "Running", started_at=NOW - 3),)
)


def planned(state: str) -> dict[str, Any]:
    """A Scan object (generation 1) as the planner leaves it in `state`."""
    status, obs, deleting = started(), RUNNING, False
    changes: dict[str, Any] = {}
    released = {**status, "workflow": {**status["workflow"], "deactivated": "ABORTED"}, "job": None}
    if state == "waiting":
        status, obs = {}, STORED
    elif state == "held":
        status = plan(scan(), STORED, NOW, S).status
        obs = Observed(event=True, admission=Admission(False, "ConcurrencyLimit", "at most 2"))
    elif state == "starting":
        status, obs = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3)), Observed()
    elif state == "final result":
        status["result"] = {"isFinal": True, "updatedAt": NOW - 1}
    elif state == "failed":
        pod = PodView("p", "Failed", "Error", exit_code=1)
        obs = Observed(job=JobView("skyscan-s1", None, failed=True), pods=(pod,))
    elif state == "soft-deleting":
        changes = {"deleted": True}
    elif state in ("soft-deleted", "replaced"):
        status, obs, changes = released, Observed(), {"deleted": True}
        if state == "replaced":
            changes["replacedBy"] = "s2"
    elif state == "hard-deleting":
        deleting = True
    record = scan(status, finalizers=[FINALIZER], deleting=deleting, **changes)
    meta: dict[str, Any] = {"name": "s1", "generation": 1}
    if deleting:
        meta["deletionTimestamp"] = cond.iso(NOW)
    return {"metadata": meta, "spec": record.raw_spec, "status": plan(record, obs, NOW, S).status}


# state -> (the summary condition that is True, its reason)
SUMMARIES = {
    "waiting": (cond.RECONCILING, "Waiting"),
    "held": (cond.RECONCILING, "Waiting"),
    "starting": (cond.RECONCILING, "Starting"),
    "running": (cond.RECONCILING, "Running"),
    "final result": (cond.READY, "FinalResult"),
    "failed": (cond.STALLED, "ScannerFailed"),
    "soft-deleting": (cond.RECONCILING, "SoftDeleted"),
    "soft-deleted": (cond.READY, "SoftDeleted"),
    "replaced": (cond.READY, "Replaced"),
    "hard-deleting": (cond.RECONCILING, "Deleting"),
}


@pytest.mark.parametrize("state", SUMMARIES)
def test_exactly_one_summary_condition_holds_in_each_state(state: str) -> None:
    status = planned(state)["status"]
    holds, why = SUMMARIES[state]
    summary = {t: cond.find(status["conditions"], t) for t in cond.SUMMARY}
    assert {t for t, c in summary.items() if c and c["status"] == "True"} == {holds}
    assert all(c and c["reason"] == why and c["observedGeneration"] == 1 for c in summary.values())
    assert status["observedGeneration"] == 1


def test_summary_messages_say_what_the_scan_waits_for() -> None:
    assert cond.message(planned("held")["status"]["conditions"], cond.RECONCILING) == "at most 2"
    assert "message queues" in cond.message(planned("starting")["status"]["conditions"], cond.RECONCILING)
    assert cond.message(planned("running")["status"]["conditions"], cond.RECONCILING) == "pod p is Running"
    assert (
        cond.message(planned("failed")["status"]["conditions"], cond.STALLED) == "the scanner failed: Error"
    )
    assert cond.message(planned("replaced")["status"]["conditions"], cond.READY) == "replaced by scan s2"


def test_the_summary_moves_only_when_its_verdict_does() -> None:
    running = planned("running")["status"]
    again = plan(scan(running, finalizers=[FINALIZER]), RUNNING, NOW + 60, S).status
    assert again["conditions"] == running["conditions"]  # nothing changed, nothing rewritten
    done = {**running, "result": {"isFinal": True, "updatedAt": NOW + 59}}
    ready = cond.find(
        plan(scan(done, finalizers=[FINALIZER]), RUNNING, NOW + 60, S).status["conditions"], cond.READY
    )
    assert ready is not None and ready["lastTransitionTime"] == cond.iso(NOW + 60)


def test_the_executor_keeps_the_summary_in_line_as_actions_succeed() -> None:
    p = plan(
        scan(admitted(id="WF-1", requestedAt=cond.iso(NOW - 3)), finalizers=[FINALIZER]), Observed(), NOW, S
    )
    p.draft.set(cond.FAILED, True, "StartFailed", "the Job was refused")  # as an applier records an outcome
    stalled = cond.find(p.draft.wire()["conditions"], cond.STALLED)
    assert stalled is not None and (stalled["status"], stalled["reason"]) == ("True", "StartFailed")


def test_a_scan_that_ended_under_an_older_operator_keeps_its_end_time() -> None:
    status = started()  # no summary conditions: written before they existed
    status["conditions"] = cond.put(
        status["conditions"], cond.COMPLETE, True, "FinalResult", "x", NOW - 900, 1
    )
    status["result"] = {"isFinal": True, "updatedAt": NOW - 900}
    status["workflow"]["deactivated"] = "FINISHED"
    status["job"]["state"] = "Succeeded"
    before = ScanRecord({"metadata": {"name": "s1"}, "spec": {}, "status": status})
    after = plan(scan(status), Observed(), NOW, S).status
    ready = cond.find(after["conditions"], cond.READY)
    assert (
        ready is not None and ready["status"] == "True" and ready["lastTransitionTime"] == cond.iso(NOW - 900)
    )
    assert finished_at(ScanRecord({"metadata": {"name": "s1"}, "spec": {}, "status": after})) == finished_at(
        before
    )
