"""A WMS that loses a scan's workflow (restarted without its data): the planner retries or ends the scan
by the start-attempt and replacement rules, so no scan waits for workers that will never come."""

from __future__ import annotations

from typing import Any

from skyscan import conditions as cond
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from skyscan_operator.actions import (
    Deactivate,
    DeleteJob,
    ProvisionQueues,
    Replace,
    RequestWorkflow,
    SetFinalizer,
)
from skyscan_operator.controller import LOST_AFTER_POLLS, absences, poll_backoff
from skyscan_operator.observed import Admission, JobView, Observed, PodView, WorkflowView
from skyscan_operator.planner import plan
from tests.unit.test_planner import NOW, S, admitted, reason, scan, started

LOST = WorkflowView(None, (), lost=True, lost_since=NOW - S.start_timeout_seconds - 1)
JUST_LOST = WorkflowView(None, (), lost=True, lost_since=NOW - 5)
RUNNING_JOB = JobView("skyscan-s1", cond.iso(NOW - 4))
RUNNING_POD = PodView("skyscan-s1-x", "Running", started_at=NOW - 3)


def started_long_ago() -> dict[str, Any]:
    """A scan whose Job was created long before its workflow was lost."""
    status = started()
    status["job"]["createdAt"] = cond.iso(NOW - 1000)
    return status


def test_a_workflow_lost_before_the_job_ends_the_attempt_and_the_next_requests_a_new_one() -> None:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3))
    p = plan(scan(status, finalizers=[FINALIZER]), Observed(event=True, workflow=LOST), NOW, S)
    assert p.status["workflow"] is None  # forgotten: no ProvisionQueues polling a workflow that is gone
    assert not any(isinstance(a, ProvisionQueues) for a in p.actions)
    assert SetFinalizer(False) in p.actions  # nothing held any more
    assert reason(p.status, cond.ADMITTED) == "WorkflowLost"
    assert "no longer knows workflow WF-1" in cond.message(p.status["conditions"], cond.ADMITTED)
    assert p.status["backlog"]["attempts"] == 1 and p.status["backlog"]["pendingSince"] == NOW
    assert reason(p.status, cond.FAILED) is None and p.status["state"] == "PENDING__PRESTARTUP"
    assert [e.reason for e in p.events] == ["WorkflowLost"]
    # Admitted again, the next attempt requests a fresh workflow.
    again = plan(scan(p.status), Observed(event=True, admission=Admission(True)), NOW + 10, S)
    assert any(isinstance(a, RequestWorkflow) for a in again.actions)
    assert again.status["backlog"]["attempts"] == 2


def test_a_workflow_lost_on_every_attempt_fails_the_scan_once_attempts_are_used_up() -> None:
    status = admitted(id="WF-3", requestedAt=cond.iso(NOW - 3))
    status["backlog"]["attempts"] = S.max_start_attempts
    lost = plan(scan(status, finalizers=[FINALIZER]), Observed(event=True, workflow=LOST), NOW, S).status
    p = plan(scan(lost), Observed(event=True), NOW + 1, S)
    assert reason(p.status, cond.FAILED) == "StartAttemptsExhausted"
    assert "no longer knows workflow WF-3" in cond.message(p.status["conditions"], cond.FAILED)
    assert p.status["state"] == "ABORTED__PRESTARTUP"


def test_a_started_scan_whose_workflow_is_lost_is_replaced_once() -> None:
    obs = Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=LOST, fresh_id="NEWID")
    p = plan(scan(started_long_ago(), finalizers=[FINALIZER]), obs, NOW, S)
    (action,) = p.actions
    assert isinstance(action, Replace) and action.new_id == "NEWID"
    assert action.body["spec"]["rescanOf"] == "s1"
    assert reason(p.status, cond.WORKFLOW_READY) == "WorkflowLost"
    assert p.status["workforce"]["nRunning"] == 0
    # Marked replaced: its Job is deleted and the (gone) workflow aborted, which ends it.
    done = plan(
        scan(p.status, finalizers=[FINALIZER], deleted=True, replacedBy="NEWID"),
        Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=LOST, replacement_exists=True),
        NOW + 1,
        S,
    )
    assert DeleteJob("skyscan-s1") in done.actions and Deactivate("WF-1", "abort") in done.actions
    assert reason(done.status, cond.DELETED) == "Replaced"


def test_a_started_scan_that_still_reports_is_not_replaced_before_the_start_timeout() -> None:
    """Workers already running need no WMS record: the scan is retried only once it has been quiet
    for the start timeout since the loss (or since its scanner's last report)."""
    obs = Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=JUST_LOST, fresh_id="NEWID")
    p = plan(scan(started_long_ago(), finalizers=[FINALIZER]), obs, NOW, S)
    assert p.actions == [] and reason(p.status, cond.FAILED) is None
    assert reason(p.status, cond.WORKFLOW_READY) == "WorkflowLost"
    assert "rescanned at" in cond.message(p.status["conditions"], cond.WORKFLOW_READY)
    assert p.requeue_after == S.start_timeout_seconds - 5  # wakes when the timeout runs out
    # Its scanner reported 100 s after the loss: the timeout runs from that report.
    reporting = {**started_long_ago(), "lastUpdated": NOW + 100}
    timeout = S.start_timeout_seconds
    assert plan(scan(reporting, finalizers=[FINALIZER]), obs, NOW + timeout, S).actions == []
    quiet = plan(scan(reporting, finalizers=[FINALIZER]), obs, NOW + 100 + timeout, S)
    assert [type(a) for a in quiet.actions] == [Replace]


def test_a_lost_workflow_with_too_many_recent_rescans_fails_the_scan_and_stops_its_job() -> None:
    obs = Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=LOST, lineage_recent=4, fresh_id="N")
    p = plan(scan(started_long_ago(), finalizers=[FINALIZER]), obs, NOW, S)
    assert reason(p.status, cond.FAILED) == "WorkflowLost"
    assert "too many rescans" in cond.message(p.status["conditions"], cond.FAILED)
    assert Deactivate("WF-1", "abort") in p.actions and DeleteJob("skyscan-s1") in p.actions
    assert not any(isinstance(a, Replace) for a in p.actions)
    assert p.status["state"] == "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP"
    assert reason(p.status, cond.STALLED) == "WorkflowLost"


def test_a_listed_workflow_is_not_lost() -> None:
    obs = Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=WorkflowView(None, ()), fresh_id="N")
    p = plan(scan(started_long_ago(), finalizers=[FINALIZER]), obs, NOW, S)
    assert p.actions == [] and reason(p.status, cond.FAILED) is None


def test_a_lost_workflow_of_a_finished_scan_changes_nothing() -> None:
    status = started_long_ago()
    status["result"] = {"isFinal": True, "updatedAt": NOW - 100}
    obs = Observed(job=RUNNING_JOB, pods=(RUNNING_POD,), workflow=LOST, fresh_id="N")
    p = plan(scan(status, finalizers=[FINALIZER]), obs, NOW, S)
    assert not any(isinstance(a, Replace) for a in p.actions)
    assert p.actions == [Deactivate("WF-1", "finished")]  # the usual teardown (404: already gone)
    assert p.status["state"] == "SCAN_HAS_FINAL_RESULT"


def test_a_workflow_is_lost_only_after_successive_polls_without_it() -> None:
    absent = absences({}, ["WF-1", "WF-2"], {"WF-1"}, NOW)
    assert absent == {"WF-2": (1, NOW)} and 1 < LOST_AFTER_POLLS
    absent = absences(absent, ["WF-1", "WF-2"], {"WF-1"}, NOW + 1)
    assert absent == {"WF-2": (LOST_AFTER_POLLS, NOW)}  # lost, since it was first missed
    assert absences(absent, ["WF-1", "WF-2"], {"WF-1", "WF-2"}, NOW + 2) == {}  # listed again: not lost
    assert absences(absent, ["WF-1"], {"WF-1"}, NOW + 2) == {}  # no longer polled: forgotten


def test_failed_polls_back_off_up_to_a_bound() -> None:
    delays = [poll_backoff(n, 1.0) for n in range(1, 10)]
    assert delays[0] == 0.0  # the first failure: the next poll at its usual interval
    assert delays == sorted(delays) and delays[2] == 3.0  # 1 s interval + 3 s: 4 s apart
    assert max(delays) == 29.0  # at most 30 s apart
    assert poll_backoff(5, 60.0) == 0.0  # an interval beyond the bound is never lengthened
