"""The operator's Lease decisions (skyscan_operator.lease): who acts, when a standby takes over, what
each write of the Lease holds."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from skyscan.io import kube, kubeconfig
from skyscan_operator import leader, lease
from skyscan_operator.lease import Move, Seen, Timing
from skyscan_operator.settings import OperatorSettings

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


# --- the holder's deadline, on real threads and a real (unreachable) API server address ---


def expiries() -> tuple[list[str], threading.Event, Callable[[str], None]]:
    """What a deadline calls on expiry, recording why and when."""
    reasons: list[str] = []
    fired = threading.Event()

    def expire(reason: str) -> None:
        reasons.append(reason)
        fired.set()

    return reasons, fired, expire


def test_the_deadline_fires_once_passed_and_not_when_moved_on_or_cancelled() -> None:
    reasons, fired, expire = expiries()
    began = time.monotonic()
    leader.Deadline(began + 0.2, expire, time.monotonic)
    assert fired.wait(5)
    assert reasons == ["not renewed in time"] and time.monotonic() - began >= 0.2

    reasons, fired, expire = expiries()
    moved = leader.Deadline(time.monotonic() + 0.2, expire, time.monotonic)
    moved.extend(time.monotonic() + 0.6)
    assert not fired.wait(0.4)  # past the first deadline, not the second
    assert fired.wait(5)

    reasons, fired, expire = expiries()
    cancelled = leader.Deadline(time.monotonic() + 0.2, expire, time.monotonic)
    cancelled.cancel()
    assert not fired.wait(0.5) and reasons == []


async def test_a_holder_that_cannot_renew_gives_up_at_its_renew_deadline() -> None:
    settings = OperatorSettings(
        namespace="ns", lease_duration_seconds=2, lease_renew_seconds=0.2, lease_identity="me"
    )
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
    reasons, fired, expire = expiries()
    async with kube.Kube(kubeconfig.Endpoint(f"http://127.0.0.1:{closed.getsockname()[1]}")) as api:
        holder = leader.Leadership(api, settings, lost=expire)
        holder.lease = lease.held(None, "skyscan-operator", "ns", "me", holder.timing, T0)
        began = time.monotonic()
        keeping = asyncio.create_task(holder.keep(began))
        assert await asyncio.to_thread(fired.wait, 10)
        keeping.cancel()
    closed.close()
    assert reasons == ["not renewed in time"]
    assert 1.8 <= time.monotonic() - began < 5  # the duration less a renew interval
