"""Which finished scans are due for the archive, and when."""

from __future__ import annotations

from skyscan import conditions as cond
from skyscan import names
from skyscan.scan_record import ScanRecord
from skyscan_operator.archiver import ArchiveQueue, finished_at, git_managed


def scan(
    created: float, *, transitions: tuple[float, ...] = (), last_updated: float | None = None
) -> ScanRecord:
    status: dict[str, object] = {
        "conditions": [
            {"type": f"T{i}", "status": "True", "lastTransitionTime": cond.iso(t)}
            for i, t in enumerate(transitions)
        ]
    }
    if last_updated is not None:
        status["lastUpdated"] = last_updated
    return ScanRecord(
        {"metadata": {"name": "s", "annotations": {names.TIMESTAMP_ANNOTATION: repr(created)}}, "spec": {},
         "status": status}
    )  # fmt: skip


def test_a_scan_finished_when_it_last_changed() -> None:
    assert finished_at(scan(1000.0)) == 1000.0
    assert finished_at(scan(1000.0, transitions=(2000.0, 5000.0), last_updated=3000.5)) == 5000.0
    assert finished_at(scan(1000.0, transitions=(2000.0,), last_updated=3000.5)) == 3000.5


def test_the_queue_pops_due_keys_in_order_up_to_the_limit() -> None:
    queue = ArchiveQueue()
    for i, due in enumerate([30.0, 10.0, 20.0, 40.0]):
        queue.schedule(("ns", f"s{i}"), due)
    assert queue.pop_due(5.0, 10) == []
    assert queue.pop_due(35.0, 2) == [("ns", "s1"), ("ns", "s2")]
    assert queue.pop_due(35.0, 2) == [("ns", "s0")]
    assert len(queue) == 1


def test_a_rescheduled_or_forgotten_key_is_popped_at_its_latest_time_or_never() -> None:
    queue = ArchiveQueue()
    queue.schedule(("ns", "a"), 10.0)
    queue.schedule(("ns", "a"), 50.0)  # changed again: due later
    queue.schedule(("ns", "b"), 10.0)
    queue.forget(("ns", "b"))  # came back to life, or deleted
    assert queue.pop_due(20.0, 10) == []
    assert queue.pop_due(50.0, 10) == [("ns", "a")]
    assert len(queue) == 0


def test_a_scan_applied_from_git_is_never_archived() -> None:
    def obj(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "s", "labels": labels, "annotations": annotations}}

    assert git_managed(obj({"kustomize.toolkit.fluxcd.io/name": "scans"}, {}))
    assert git_managed(obj({}, {"argocd.argoproj.io/tracking-id": "app:skyscan.io/Scan:ns/s"}))
    assert git_managed(obj({"app.kubernetes.io/instance": "app"}, {}))
    assert not git_managed(obj({"team": "realtime"}, {names.TIMESTAMP_ANNOTATION: "1.0"}))
