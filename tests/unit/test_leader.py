"""The operator's Lease decisions (skyscan_operator.lease): who acts, when a standby takes over, what
each write of the Lease holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from skyscan_operator import lease
from skyscan_operator.lease import Move, Seen, Timing

TIMING = Timing(duration=8, renew_interval=2.0)
T0 = datetime(2026, 11, 23, 18, 0, 0, 123456, tzinfo=UTC)
T1 = datetime(2026, 11, 23, 18, 0, 2, tzinfo=UTC)


def stored(holder: str | None, version: str = "10", transitions: int = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseDurationSeconds": 8,
        "acquireTime": "2026-11-23T17:00:00.000000Z",
        "renewTime": "2026-11-23T17:59:58.000000Z",
        "leaseTransitions": transitions,
    }
    if holder is not None:
        spec["holderIdentity"] = holder
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "skyscan-operator", "namespace": "ns", "resourceVersion": version,
                     "labels": {"app.kubernetes.io/name": "skyscan"}},
        "spec": spec,
    }  # fmt: skip


def test_the_renew_deadline_leaves_the_holder_one_interval_to_stop_before_a_standby_may_act() -> None:
    assert TIMING.renew_deadline == 6.0
    assert TIMING.renew_deadline < TIMING.duration


def test_a_record_is_timed_from_when_this_replica_first_saw_it() -> None:
    first = lease.seen(stored("a"), None, now=100.0)
    assert first == Seen(version="10", holder="a", duration=8.0, since=100.0)
    assert lease.seen(stored("a"), first, now=107.0) == first  # unchanged: still since 100
    renewed = lease.seen(stored("a", version="11"), first, now=107.0)
    assert renewed is not None and renewed.since == 107.0  # renewed: timed anew
    assert lease.seen(None, first, now=108.0) is None  # deleted


@pytest.mark.parametrize(
    ("record", "now", "move"),
    [
        (None, 0.0, Move.CREATE),  # no Lease yet
        (Seen("10", "other", 8.0, since=100.0), 100.0, Move.WAIT),  # held, just renewed
        (Seen("10", "other", 8.0, since=100.0), 107.9, Move.WAIT),  # not yet expired
        (Seen("10", "other", 8.0, since=100.0), 108.0, Move.TAKE),  # unchanged for its duration
        (Seen("10", "", 8.0, since=100.0), 100.0, Move.TAKE),  # released: at once
        (Seen("10", "me", 8.0, since=100.0), 100.0, Move.TAKE),  # ours from before a restart
        (Seen("10", "other", 30.0, since=100.0), 108.0, Move.WAIT),  # the Lease's own duration counts
    ],
)
def test_a_standby_waits_until_the_lease_is_free_expired_or_its_own(
    record: Seen | None, now: float, move: Move
) -> None:
    assert lease.decide(record, "me", now) is move


def test_a_new_lease_names_its_holder_duration_and_times() -> None:
    body = lease.held(None, "skyscan-operator", "ns", "me", TIMING, T0)
    assert body == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "skyscan-operator", "namespace": "ns"},
        "spec": {
            "holderIdentity": "me",
            "leaseDurationSeconds": 8,
            "acquireTime": "2026-11-23T18:00:00.123456Z",
            "renewTime": "2026-11-23T18:00:00.123456Z",
            "leaseTransitions": 0,
        },
    }


def test_a_renewal_keeps_the_acquire_time_and_the_read_version() -> None:
    before = stored("me")
    body = lease.held(before, "skyscan-operator", "ns", "me", TIMING, T1)
    assert body["metadata"] == before["metadata"]  # resourceVersion: the write fails if it changed
    assert body["spec"] == {
        "holderIdentity": "me",
        "leaseDurationSeconds": 8,
        "acquireTime": "2026-11-23T17:00:00.000000Z",
        "renewTime": "2026-11-23T18:00:02.000000Z",
        "leaseTransitions": 3,
    }
    assert before["spec"]["renewTime"] == "2026-11-23T17:59:58.000000Z"  # the read object is left alone


@pytest.mark.parametrize("previous", ["other", None])
def test_a_takeover_counts_a_transition_and_starts_a_new_tenure(previous: str | None) -> None:
    body = lease.held(stored(previous), "skyscan-operator", "ns", "me", TIMING, T1)
    assert body["metadata"]["resourceVersion"] == "10"
    assert body["spec"]["holderIdentity"] == "me"
    assert body["spec"]["acquireTime"] == body["spec"]["renewTime"] == "2026-11-23T18:00:02.000000Z"
    assert body["spec"]["leaseTransitions"] == 4


def test_a_released_lease_has_no_holder_so_a_standby_takes_it_at_once() -> None:
    body = lease.released(stored("me"), T1)
    assert "holderIdentity" not in body["spec"] and "acquireTime" not in body["spec"]
    assert body["metadata"]["resourceVersion"] == "10"
    assert lease.holder_of(body) == ""
    assert lease.decide(lease.seen(body, None, now=5.0), "other", now=5.0) is Move.TAKE
