"""Watch bodies to summaries, and the store's indexes (pure, in memory)."""

from __future__ import annotations

from typing import Any

from skyscan import conditions as cond
from skyscan_operator.store import Store, job_view, pod_view


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
    done = pod_view(
        pod({"phase": "Succeeded", "startTime": "2026-01-01T00:00:00Z", **terminated("Completed", 0)})
    )
    assert not done.transient_failure and done.started_at == cond.epoch("2026-01-01T00:00:00Z")


def test_job_view() -> None:
    body = {"metadata": {"name": "j", "creationTimestamp": "t"}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}  # fmt: skip
    view = job_view(body)
    assert view.failed and view.reason == "DeadlineExceeded" and not view.complete


def scan(name: str, status: dict[str, Any], rv: str = "1", **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "resourceVersion": rv, "creationTimestamp": cond.iso(1000.0)}
    return {"metadata": meta, "spec": spec, "status": status}


def test_indexes_follow_the_scans() -> None:
    store = Store()
    queued = {
        "backlog": {"attempts": 0},
        "conditions": cond.put([], cond.ADMITTED, False, "Queued", "", 0, 1),
    }
    store.put_scan(scan("a", queued))
    assert store.waiting == {("ns", "a")} and not store.running
    live = {"workflow": {"id": "WF-1"}, "job": {"name": "j", "state": "Running"}}
    assert store.put_scan(scan("a", live, rv="2"))
    assert (
        not store.waiting and store.running == {("ns", "a")} and store.live_workflows == {"WF-1": ("ns", "a")}
    )
    assert not store.put_scan(scan("a", queued, rv="1"))  # an older version never replaces a newer one
    ended = {"workflow": {"id": "WF-1", "deactivated": "ABORTED"}, "job": {"name": "j", "state": "Succeeded"}}
    store.put_scan(scan("a", ended, rv="3"))
    assert not store.running and not store.live_workflows
    store.drop_scan(("ns", "a"))
    assert not store.scans


def test_lineage_counts_rescans_of_one_request() -> None:
    store = Store()
    store.put_scan(scan("root", {}))
    store.put_scan(scan("r1", {}, rescanOf="root"))
    store.put_scan(scan("r2", {}, rescanOf="r1"))
    store.put_scan(scan("other", {}))
    assert store.lineage_recent(("ns", "r2"), since=0) == 3
    assert store.lineage_recent(("ns", "other"), since=0) == 1
    assert store.lineage_recent(("ns", "r2"), since=2000) == 0
