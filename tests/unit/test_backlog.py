"""Backlog admission (pure): order, the two rates, the concurrency cap, retry delays; the line kept
per event, whose ticks write a hold only when it changes."""

from __future__ import annotations

from skyscan_operator.backlog import Candidate, Line, decide, holds, order, retry_delay
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


def test_a_tick_with_nothing_to_do_admits_and_writes_nothing() -> None:
    line = Line(S)
    for i in range(1000):
        line.put(c(f"s{i}", i % 100, i), now=1000)
    first = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert first.admit == [] and len(first.hold) == 1000  # each joins the line with its hold
    assert {h.reason for h in first.hold.values()} == {"LowPriorityInterval"}
    assert line.tick(running=0, now=1001, last_low_priority_admission=990).hold == {}
    # What a scan's status shows is not written again, when it rejoins the line.
    shown = holds(S)["LowPriorityInterval"]
    line.put(Candidate(("ns", "s5"), 5, 5, 0.0, 0, shown=shown), now=1002)
    assert line.tick(running=0, now=1002, last_low_priority_admission=990).hold == {}
    assert line.tick(running=0, now=1300, last_low_priority_admission=990).admit == [("ns", "s99")]


def test_a_class_whose_reason_changes_is_told_once() -> None:
    capped = S.model_copy(update={"max_running_scanners": 1, "admissions_per_tick": 1})
    line = Line(capped)
    for name, priority in [("h1", 200), ("h2", 200), ("l1", 0)]:
        line.put(c(name, priority, 1), now=1000)
    d = line.tick(running=1, now=1000, last_low_priority_admission=None)
    assert {k[1]: h.reason for k, h in d.hold.items()} == {
        "h1": "ConcurrencyLimit", "h2": "ConcurrencyLimit", "l1": "ConcurrencyLimit"}  # fmt: skip
    assert line.tick(running=1, now=1001, last_low_priority_admission=None).hold == {}
    d = line.tick(running=0, now=1002, last_low_priority_admission=None)  # a scanner ended
    assert d.admit == [("ns", "h1")] and d.hold == {}  # the cap is reached again at once
    d = line.tick(running=0, now=1003, last_low_priority_admission=None)  # h1's attempt failed
    assert d.admit == [("ns", "h2")] and d.hold == {}
    d = line.tick(running=0, now=1004, last_low_priority_admission=1003)  # nothing left that is high
    assert d.admit == [] and d.hold == {("ns", "l1"): holds(capped)["LowPriorityInterval"]}


def test_a_retrying_scan_rejoins_the_line_when_due() -> None:
    line = Line(S)
    line.put(c("a", 200, 1, pending=990, attempts=1), now=1000)
    line.put(c("b", 200, 2), now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=None)
    assert d.admit == [("ns", "b")] and d.hold[("ns", "a")].reason == "RetryDelay"
    assert line.tick(running=0, now=1049, last_low_priority_admission=None).admit == []
    line.put(c("a", 200, 1, pending=990, attempts=1), now=1049)  # an unchanged event changes nothing
    assert line.tick(running=0, now=1050, last_low_priority_admission=None).admit == [("ns", "a")]
    assert len(line) == 0


def test_a_changed_candidate_takes_its_new_place() -> None:
    line = Line(S)
    line.put(c("a", 100, 1), now=1000)
    line.put(c("b", 100, 2), now=1000)
    line.put(c("b", 300, 2), now=1000)  # its priority raised
    assert line.tick(running=0, now=1000, last_low_priority_admission=None).admit == [("ns", "b")]
    line.remove(("ns", "a"))
    assert line.tick(running=0, now=1001, last_low_priority_admission=None) == decide(
        [], running=0, now=1001, last_low_priority_admission=None, settings=S
    )
