"""What Flux (kstatus) and Argo CD (the shipped Lua check) make of a Scan in each state, over the
objects the planner leaves (tests/integration/operator/test_gitops_health.py: over real Scans)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gitops import argocd_health, kstatus
from tests.unit.test_planner import SUMMARIES, planned

# state -> (kstatus, Argo CD health), as the README's GitOps health table documents them
VERDICTS = {
    "waiting": ("InProgress", "Progressing"),
    "held": ("InProgress", "Progressing"),
    "starting": ("InProgress", "Progressing"),
    "running": ("InProgress", "Progressing"),
    "final result": ("Current", "Healthy"),
    "failed": ("Failed", "Degraded"),
    "soft-deleting": ("InProgress", "Progressing"),
    "soft-deleted": ("Current", "Healthy"),
    "replaced": ("Current", "Healthy"),
    "hard-deleting": ("Terminating", "Progressing"),
}


def test_every_planned_state_has_a_verdict() -> None:
    assert VERDICTS.keys() == SUMMARIES.keys()


@pytest.mark.parametrize("state", VERDICTS)
def test_flux_and_argocd_read_each_state_as_documented(state: str) -> None:
    obj = planned(state)
    status, message = argocd_health(obj)
    assert (kstatus(obj), status) == VERDICTS[state]
    assert message.startswith(SUMMARIES[state][1] + ": ")  # the reason, then what the operator said


def hand_written(generation: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "s1", "generation": generation},
        "spec": {},
        **({"status": status} if status else {}),
    }


def test_a_scan_the_operator_has_not_seen_is_progressing() -> None:
    assert argocd_health(hand_written()) == ("Progressing", "waiting for the Skyscan operator")
    # kstatus cannot tell without a status: its known blind spot for every custom resource.
    assert kstatus(hand_written()) == "Current"


def test_a_change_the_operator_has_not_seen_is_in_progress_whatever_the_conditions() -> None:
    ready = planned("final result")["status"]
    stale = hand_written(2, **ready)
    assert kstatus(stale) == "InProgress"
    assert argocd_health(stale) == ("Progressing", "the Skyscan operator has not seen the latest change yet")


def test_unknown_or_missing_summary_conditions_are_progressing() -> None:
    queued = {"type": "Admitted", "status": "False", "reason": "Queued", "message": "waiting in the backlog"}
    older = hand_written(observedGeneration=1, conditions=[queued])  # written by an older operator
    assert argocd_health(older) == ("Progressing", "waiting for the Skyscan operator")
    unknown = hand_written(observedGeneration=1, conditions=[{"type": "Ready", "status": "Unknown"}])
    assert kstatus(unknown) == "InProgress" and argocd_health(unknown)[0] == "Progressing"
