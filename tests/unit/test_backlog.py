"""Backlog admission (pure): order, the two rates, the concurrency cap, retry delays."""

from __future__ import annotations

from skyscan_operator.backlog import Candidate, decide, order, retry_delay
from skyscan_operator.settings import OperatorSettings

S = OperatorSettings(low_priority_interval_seconds=300, start_retry_delay_seconds=60, admissions_per_tick=1)


def c(
    name: str, priority: int, entered: float, pending: float = 0.0, attempts: int = 0, interruptions: int = 0
) -> Candidate:
    return Candidate(("ns", name), priority, entered, pending, attempts, interruptions)


def test_order_is_priority_then_age() -> None:
    got = order([c("old-low", 0, 1), c("new-high", 200, 5), c("old-high", 200, 2), c("mid", 100, 0)])
    assert [x.key[1] for x in got] == ["old-high", "new-high", "mid", "old-low"]


def test_high_priority_starts_on_every_tick_up_to_the_budget() -> None:
    d = decide(
        [c("a", 100, 1), c("b", 150, 2)], running=0, now=1000, last_low_priority_admission=990, settings=S
    )
    assert d.admit == [("ns", "b")]
    assert d.hold[("ns", "a")].reason == "Queued"
    d = decide([c("a", 100, 1)], running=0, now=1015, last_low_priority_admission=990, settings=S)
    assert d.admit == [("ns", "a")]


def test_low_priority_at_most_one_per_interval() -> None:
    waiting = [c("x", 0, 1), c("y", 99, 2)]
    d = decide(waiting, running=0, now=1000, last_low_priority_admission=800, settings=S)
    assert d.admit == []
    assert {h.reason for h in d.hold.values()} == {"LowPriorityInterval"}
    assert d.low_priority_admitted_at == 800
    d = decide(waiting, running=0, now=1100, last_low_priority_admission=800, settings=S)
    assert d.admit == [("ns", "y")]  # higher priority first, only one
    assert d.low_priority_admitted_at == 1100
    assert d.hold[("ns", "x")].reason == "LowPriorityInterval"


def test_an_idle_queue_lets_the_next_low_priority_scan_start_at_once() -> None:
    d = decide([c("x", 0, 1)], running=0, now=1000, last_low_priority_admission=None, settings=S)
    assert d.admit == [("ns", "x")]


def test_high_and_low_in_one_tick() -> None:
    d = decide(
        [c("h", 500, 3), c("l", 1, 1)], running=0, now=1000, last_low_priority_admission=None, settings=S
    )
    assert d.admit == [("ns", "h"), ("ns", "l")]


def test_the_concurrency_cap_holds_everything_back_with_a_reason() -> None:
    capped = S.model_copy(update={"max_running_scanners": 2})
    d = decide(
        [c("a", 200, 1), c("b", 200, 2)],
        running=2,
        now=1000,
        last_low_priority_admission=None,
        settings=capped,
    )
    assert d.admit == []
    assert d.hold[("ns", "a")].reason == "ConcurrencyLimit" and "at most 2" in d.hold[("ns", "a")].message
    d = decide(
        [c("a", 200, 1), c("l", 0, 0)], running=1, now=1000, last_low_priority_admission=None, settings=capped
    )
    assert d.admit == [("ns", "a")]
    assert d.hold[("ns", "l")].reason == "ConcurrencyLimit"


def test_a_failed_attempt_waits_out_the_retry_delay() -> None:
    retrying = [c("a", 200, 1, pending=990, attempts=1)]
    d = decide(retrying, running=0, now=1000, last_low_priority_admission=None, settings=S)
    assert d.admit == [] and d.hold[("ns", "a")].reason == "RetryDelay"
    d = decide(retrying, running=0, now=1060, last_low_priority_admission=None, settings=S)
    assert d.admit == [("ns", "a")]


def test_interrupted_attempts_back_off_exponentially_up_to_a_bound() -> None:
    s = S.model_copy(update={"outage_retry_delay_seconds": 15, "outage_retry_max_delay_seconds": 100})
    assert [retry_delay(n, s) for n in range(7)] == [60, 15, 30, 60, 100, 100, 100]
    assert retry_delay(10**6, s) == 100  # no overflow however long the outage
    interrupted = [c("a", 200, 1, pending=990, attempts=0, interruptions=3)]
    d = decide(interrupted, running=0, now=1040, last_low_priority_admission=None, settings=s)
    assert d.admit == [] and d.hold[("ns", "a")].reason == "RetryDelay"  # its reason stays visible
    d = decide(interrupted, running=0, now=1050, last_low_priority_admission=None, settings=s)
    assert d.admit == [("ns", "a")]
