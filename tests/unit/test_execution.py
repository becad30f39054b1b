"""An execution's bookkeeping of a start attempt's end: failures of the scan count, outages and quota
refusals do not (the attempt is given back and the scan backs off), with API answers as they come."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, get_args

import aiohttp
import pytest

from skyscan import conditions as cond
from skyscan.io.kube_errors import KubeError
from skyscan_operator.actions import Action
from skyscan_operator.execution import Execution, Stop, api_refusal
from skyscan_operator.executor import ACTIONS
from skyscan_operator.live_scans import LiveScans
from skyscan_operator.observed import Admission, Observed
from skyscan_operator.planner import plan
from tests.unit.test_planner import NOW, scan
from tests.unit.test_planner import S as PLANNER_SETTINGS

S = SimpleNamespace  # fakes of the executor's collaborators


def api_error(status: int, message: str = "") -> KubeError:
    return KubeError(status, "Reason", json.dumps({"kind": "Status", "message": message}).encode())


QUOTA = 'jobs.batch "skyscan-s1" is forbidden: exceeded quota: q, requested: count/jobs.batch=1, used: 0'


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (api_error(403, QUOTA), "QuotaExceeded"),
        (api_error(403, "status unknown for quota: q, resource: count/jobs.batch"), "QuotaExceeded"),
        (api_error(403, 'User "x" cannot create resource "jobs"'), "APIForbidden"),
        (api_error(401), "APIForbidden"),
        (api_error(500), "APIUnavailable"),
        (api_error(503), "APIUnavailable"),
        (api_error(429), "APIUnavailable"),
        (api_error(408), "APIUnavailable"),
        (aiohttp.ClientConnectionError("refused"), "APIUnavailable"),
        (TimeoutError(), "APIUnavailable"),
        (api_error(422, "Job.batch is invalid"), "StartFailed"),
        (api_error(400, "bad request"), "StartFailed"),
        (api_error(404, "serviceaccounts not found"), "StartFailed"),
    ],
)
def test_only_a_refusal_of_the_scans_own_object_counts(error: Exception, reason: str) -> None:
    assert api_refusal(error) == reason


SETTINGS = PLANNER_SETTINGS.model_copy(
    update={"outage_retry_delay_seconds": 10, "outage_retry_max_delay_seconds": 25}
)


def in_attempt(attempts: int = 1) -> Execution:
    """An Execution of a scan admitted to its start attempt `attempts`, over fakes; `run.written` is
    the status as it last wrote it."""
    first = plan(scan(), Observed(event=True), NOW - 10, SETTINGS).status
    first["backlog"]["attempts"] = attempts - 1
    admitted = plan(scan(first), Observed(event=True, admission=Admission(True)), NOW - 5, SETTINGS)

    async def apply_status(path: str, body: dict[str, Any], *args: Any, **kw: Any) -> dict[str, Any]:
        meta = {"name": "s1", "namespace": "ns", "uid": "uid-1", "resourceVersion": "9"}
        return {"metadata": meta, "spec": {}, "status": body["status"]}

    executor = S(
        settings=SETTINGS,
        clock=lambda: NOW,
        store=LiveScans(),
        events=S(post=lambda *a: None),
        api=S(apply=apply_status),  # the status apply is the only API call here
    )
    view = scan(admitted.status)
    return Execution(executor, view, {"metadata": {}, "status": {}}, admitted)  # type: ignore[arg-type]


async def test_an_outage_gives_the_attempt_back_and_backs_off() -> None:
    run = in_attempt(attempts=2)
    with pytest.raises(Stop):
        await run.kube_refused(aiohttp.ClientConnectionError("connection refused"), "creating Job skyscan-s1")
    assert run.written["backlog"]["attempts"] == 1 and run.written["backlog"]["interruptions"] == 1
    assert run.written["backlog"]["pendingSince"] == NOW
    admitted = cond.find(run.written["conditions"], cond.ADMITTED)
    assert admitted is not None and (admitted["status"], admitted["reason"]) == ("False", "APIUnavailable")
    assert "not counted as a start attempt (1 of 3 used), retrying in 10s" in admitted["message"]
    assert run.store.outage_at == NOW  # attempts elsewhere do not time out meanwhile


async def test_a_quota_refusal_waits_without_consuming_attempts() -> None:
    run = in_attempt(attempts=1)
    for _ in range(3):  # the attempt, given back, is not double-refunded by later interruptions
        run.draft.set(cond.ADMITTED, True, "Admitted", "start attempt 1 of 3")
        run.draft.backlog.attempts = 1  # type: ignore[union-attr]
        with pytest.raises(Stop):
            await run.kube_refused(api_error(403, QUOTA), "creating Job skyscan-s1")
    assert run.written["backlog"]["attempts"] == 0 and run.written["backlog"]["interruptions"] == 3
    admitted = cond.find(run.written["conditions"], cond.ADMITTED)
    assert admitted is not None and admitted["reason"] == "QuotaExceeded"
    assert "exceeded quota" in admitted["message"] and "retrying in 25s" in admitted["message"]  # capped
    assert run.store.outage_at == 0.0  # a quota refusal is no outage


async def test_an_invalid_job_counts_and_resets_the_backoff() -> None:
    run = in_attempt(attempts=2)
    run.draft.backlog.interruptions = 4  # type: ignore[union-attr]
    with pytest.raises(Stop):
        await run.kube_refused(api_error(422, "Job.batch is invalid: spec"), "creating Job skyscan-s1")
    assert run.written["backlog"]["attempts"] == 2 and run.written["backlog"]["interruptions"] == 0
    admitted = cond.find(run.written["conditions"], cond.ADMITTED)
    assert admitted is not None and admitted["reason"] == "StartFailed" and "invalid" in admitted["message"]


def test_every_action_type_has_its_handler() -> None:
    assert set(ACTIONS) == set(get_args(Action))
