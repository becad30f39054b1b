"""A Scan made with kubectl whose spec REST would refuse: the planner fails it (Failed/InvalidSpec, the
message naming the field) before anything starts, and the controller works the verdict out once per
generation of the spec."""

from __future__ import annotations

from typing import Any

import pytest

from skyscan import conditions as cond
from skyscan import policy
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from skyscan_operator.actions import (
    AddWorkers,
    CheckEvent,
    CreateJob,
    Deactivate,
    IssueScannerCredential,
    RecoverWorkflow,
    RequestWorkflow,
    SetFinalizer,
)
from skyscan_operator.controller import Controller
from skyscan_operator.endings import refuse_unreadable
from skyscan_operator.observed import Admission, Observed, ScanView
from skyscan_operator.planner import plan
from skyscan_operator.settings import OperatorSettings
from tests.unit.test_crd import minimal_spec
from tests.unit.test_planner import NOW, S, admitted, reason, scan, started

DEV = policy.Refusal("spec.dockerTag", "'dev' is not a tag of the catalog")
STARTS = (CheckEvent, RequestWorkflow, RecoverWorkflow, IssueScannerCredential, CreateJob, SetFinalizer)


def failed_invalid(p: Any, field: str, state: str = "ABORTED__PRESTARTUP") -> None:
    assert reason(p.status, cond.FAILED) == "InvalidSpec"
    assert cond.message(p.status["conditions"], cond.FAILED).startswith(f"{field}: ")
    assert reason(p.status, cond.ADMITTED) == "InvalidSpec"
    assert reason(p.status, cond.STALLED) == "InvalidSpec"
    assert p.status["backlog"] is None and p.status["state"] == state


def test_a_new_scan_with_an_invalid_spec_fails_and_nothing_starts() -> None:
    for obs in (Observed(refusal=DEV), Observed(refusal=DEV, event=True, admission=Admission(True))):
        p = plan(scan(dockerTag="dev"), obs, NOW, S)
        failed_invalid(p, "spec.dockerTag")
        assert not any(isinstance(a, STARTS) for a in p.actions), p.actions
        assert [(e.type, e.reason) for e in p.events] == [("Warning", "InvalidSpec")]
        assert "spec.dockerTag" in p.events[0].message
        # Level-triggered: planned again from what it wrote, the same status and nothing new.
        again = plan(scan(p.status, dockerTag="dev"), obs, NOW + 5, S)
        assert again.status == p.status and not again.actions and not again.events


def test_a_long_refusal_is_cut_short() -> None:
    tag = "x" * 100_000
    refusal = policy.refusal(minimal_spec(dockerTag=tag), S.request_policy({"4.1.2"}))
    p = plan(scan(dockerTag=tag), Observed(refusal=refusal), NOW, S)
    message = cond.message(p.status["conditions"], cond.FAILED)
    assert message.startswith("spec.dockerTag: 'xxx") and len(message) == 1024


def test_a_scan_valid_to_the_policy_starts() -> None:
    p = plan(scan(), Observed(event=True, admission=Admission(True)), NOW, S)
    assert reason(p.status, cond.FAILED) is None
    assert any(isinstance(a, RequestWorkflow) for a in p.actions)


def test_a_spec_edited_invalid_before_the_job_releases_the_workflow_an_earlier_generation_got() -> None:
    status = admitted(id="WF-1", requestedAt=cond.iso(NOW - 3), queuesActivated=True)
    p = plan(scan(status, finalizers=[FINALIZER], dockerTag="dev"), Observed(event=True, refusal=DEV), NOW, S)
    failed_invalid(p, "spec.dockerTag", "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP")
    assert Deactivate("WF-1", "abort") in p.actions
    assert not any(isinstance(a, CreateJob | IssueScannerCredential) for a in p.actions)


def test_a_started_scan_is_not_failed_by_a_later_verdict() -> None:
    """Settings or the catalog changed after its start, or its spec was edited: its Job no longer reads it."""
    p = plan(scan(started(), finalizers=[FINALIZER]), Observed(refusal=DEV), NOW, S)
    assert reason(p.status, cond.FAILED) is None and not p.events


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"classifiers": {"rescan": True}}, "spec.classifiers"),
        ({"scannerServerEnvFromUser": {"SKYSCAN_EWMS_JSON": "/x"}}, "spec.scannerServerEnvFromUser"),
    ],
)
def test_a_reserved_key_is_read_leniently_and_refused_by_the_planner(
    changes: dict[str, Any], field: str
) -> None:
    view = scan(**changes)  # `model.STORED`: no ValidationError, the policy is the planner's
    refusal = policy.refusal(view.raw_spec, S.request_policy({"4.1.2"}))
    assert refusal is not None and refusal.field == field
    failed_invalid(plan(view, Observed(refusal=refusal), NOW, S), field)


def body(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    meta = {"name": "s1", "namespace": "ns", "uid": "uid-1", "generation": 2, "resourceVersion": "5",
            "creationTimestamp": cond.iso(NOW - 100)}  # fmt: skip
    return {"metadata": meta, "spec": minimal_spec(**spec), "status": status or {}}


def test_a_spec_the_model_cannot_read_fails_a_scan_not_yet_started() -> None:
    unreadable = body(classifiers={"k" * 26: 1})
    with pytest.raises(ValueError):
        ScanView.from_body(unreadable)
    refusal = policy.Refusal(f"spec.classifiers[{'k' * 26}]", "String should have at most 25 characters")
    refused = refuse_unreadable(unreadable, refusal, NOW)
    assert refused is not None
    status, events = refused
    assert reason(status, cond.FAILED) == "InvalidSpec" and status["observedGeneration"] == 2
    assert cond.message(status["conditions"], cond.FAILED) == str(refusal)
    assert status["state"] == "ABORTED__PRESTARTUP" and [e.reason for e in events] == ["InvalidSpec"]
    assert refuse_unreadable({**unreadable, "status": status}, refusal, NOW) is None  # once
    # Started (a workflow held, or a Job): no plan can stop it from here; it is left alone.
    assert refuse_unreadable(body(started(), classifiers={"k" * 26: 1}), refusal, NOW) is None
    requested = admitted(requestedAt=cond.iso(NOW - 3))
    assert refuse_unreadable(body(requested, classifiers={"k" * 26: 1}), refusal, NOW) is None


def test_a_worker_request_beyond_the_bound_is_refused() -> None:
    requests = [{"id": "r1", "location": "osg", "nWorkers": S.max_n_workers + 1}]
    p = plan(scan(started(), finalizers=[FINALIZER], workerRequests=requests), Observed(), NOW, S)
    assert not any(isinstance(a, AddWorkers) for a in p.actions)
    assert p.status["workerRequests"] == [
        {"id": "r1", "state": "Refused", "reason": f"'n_workers': must be no more than {S.max_n_workers}"}
    ]


async def test_the_verdict_is_worked_out_once_per_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real = policy.refusal

    def counting(spec: dict[str, Any], rules: policy.Policy) -> policy.Refusal | None:
        checked.append(spec["dockerTag"])
        return real(spec, rules)

    monkeypatch.setattr(policy, "refusal", counting)
    controller = Controller(OperatorSettings(tags=["4.1.2"]))
    key = ("ns", "s1")
    view = ScanView.from_body(body(dockerTag="dev"))
    first = await controller.refusal(key, view)
    assert first is not None and first.field == "spec.dockerTag"
    assert await controller.refusal(key, view) == first and checked == ["dev"]  # cached
    edited = ScanView.from_body({**body(), "metadata": {**body()["metadata"], "generation": 3}})
    assert await controller.refusal(key, edited) is None and checked == ["dev", "4.1.2"]
    recreated = ScanView.from_body({**body(), "metadata": {**body()["metadata"], "uid": "uid-2"}})
    assert await controller.refusal(key, recreated) is None and len(checked) == 3
    # A started scan is not looked at, and its verdict is dropped.
    assert await controller.refusal(key, ScanView.from_body(body(started(), dockerTag="dev"))) is None
    assert key not in controller.store.verdicts and len(checked) == 3
    controller.store.verdicts[key] = ("uid-1", 2, None)
    controller.store.settle(key)
    assert key not in controller.store.verdicts


async def test_the_catalog_directory_is_read_for_the_verdict(tmp_path: Any) -> None:
    (tmp_path / "skymap_scanner:4.3.0").mkdir()
    controller = Controller(OperatorSettings(tag_catalog_dir=tmp_path, tags=[]))
    view = ScanView.from_body(body(dockerTag="4.3.0"))
    assert await controller.refusal(("ns", "s1"), view) is None
    other = ScanView.from_body({**body(dockerTag="4.1.2"), "metadata": {**body()["metadata"], "uid": "u"}})
    refusal = await controller.refusal(("ns", "s1"), other)
    assert refusal is not None and "not a tag of the catalog" in refusal.message
