"""Backlog admission (pure): order, the two rates, the concurrency cap, retry delays; the line kept
per event, whose ticks write a hold only when it changes."""

from __future__ import annotations

from dataclasses import replace

from skyscan_operator.backlog import (
    OUTAGES,
    QUOTA_REFUSALS,
    Candidate,
    Decision,
    Hold,
    Key,
    Line,
    Place,
    decide,
    holds,
    moved,
    order,
    retry_delay,
)
from skyscan_operator.planner import INTERRUPTIONS
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


# --- where a waiting scan stands (its status' backlog part) ---

P = S.model_copy(update={"backlog_positions_shown": 3, "backlog_positions_interval_seconds": 5})


def places(d: Decision) -> dict[str, tuple[str, int | None, float | None]]:
    return {k[1]: (p.wait, p.position, p.start_at) for k, p in d.place.items()}


def shown(line: Line, waiting: dict[Key, Candidate], d: Decision, now: float) -> None:
    """What the reconciles write comes back by the watch: each candidate shows its hold and place."""
    for key in d.admit:
        waiting.pop(key, None)
    for key in d.hold.keys() | d.place.keys():
        old = waiting[key]
        hold = d.hold.get(key, old.shown)
        waiting[key] = replace(old, shown=hold, place=d.place.get(key, old.place))
        line.put(waiting[key], now)


def test_places_in_admission_order_with_why_and_when() -> None:
    line = Line(P)
    for x in [c("l2", 0, 1), c("h2", 200, 5), c("l1", 50, 3), c("h1", 200, 2), c("l3", 0, 9)]:
        line.put(x, now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert d.admit == [("ns", "h1")] and line.admissions_per_minute() == 0.1
    # One admission in the 600 s window: one start per 600 s ahead of each.
    assert places(d) == {
        "h2": ("Rate", 1, 1600.0),  # its class's next admission takes it
        "l1": ("Rate", 2, 2200.0),  # the next low-priority one: it waits for the interval
        "l2": ("Priority", 3, 2800.0),  # the scans ahead of it go first
        "l3": ("Priority", None, None),  # beyond the first shown
    }


def test_no_estimate_without_a_recent_admission() -> None:
    line = Line(P)
    line.put(c("a", 0, 1), now=1000)
    line.put(c("b", 0, 2), now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert places(d) == {"a": ("Rate", 1, None), "b": ("Priority", 2, None)}
    line = Line(P)
    line.put(c("a", 0, 1), now=1000)
    assert line.tick(running=0, now=1000, last_low_priority_admission=None).admit == [("ns", "a")]
    line.put(c("b", 0, 2), now=1599)
    d = line.tick(running=0, now=1599, last_low_priority_admission=1500)
    assert places(d) == {"b": ("Rate", 1, 2199.0)}
    line.put(c("c", 0, 3), now=1600)
    d = line.tick(running=0, now=1600, last_low_priority_admission=1500)  # the admission left the window
    assert places(d) == {"c": ("Priority", 2, None)} and line.admissions_per_minute() == 0


def test_positions_move_once_per_interval_and_only_the_first_shown() -> None:
    line, waiting = Line(P), {}
    for i in range(6):
        waiting[("ns", f"s{i}")] = c(f"s{i}", 200, i)
        line.put(waiting[("ns", f"s{i}")], now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=None)
    assert d.admit == [("ns", "s0")]
    assert {k: v[1] for k, v in places(d).items()} == {"s1": 1, "s2": 2, "s3": 3, "s4": None, "s5": None}
    shown(line, waiting, d, 1000)
    d = line.tick(running=0, now=1001, last_low_priority_admission=None)  # within the interval
    assert d.admit == [("ns", "s1")] and d.place == {}  # what the pass wrote stands until the next
    shown(line, waiting, d, 1001)
    d = line.tick(running=0, now=1005, last_low_priority_admission=None)
    assert d.admit == [("ns", "s2")]
    # s3 becomes the next up, s4 and s5 come into the first shown; 3 admissions in the window.
    assert places(d) == {
        "s3": ("Rate", 1, 1205.0),
        "s4": ("Priority", 2, 1405.0),
        "s5": ("Priority", 3, 1605.0),
    }
    shown(line, waiting, d, 1005)
    assert line.tick(running=0, now=1006, last_low_priority_admission=None).place == {}


def test_a_scan_pushed_back_beyond_the_first_shown_loses_its_position() -> None:
    line, waiting = Line(P), {}
    for i in range(3):
        waiting[("ns", f"s{i}")] = c(f"s{i}", 0, i)
        line.put(waiting[("ns", f"s{i}")], now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    shown(line, waiting, d, 1000)
    waiting[("ns", "new")] = c("new", 50, 5)  # a higher priority, joining between passes
    line.put(waiting[("ns", "new")], now=1001)
    d = line.tick(running=0, now=1001, last_low_priority_admission=990)
    assert places(d) == {"new": ("Rate", 1, None)}  # it takes its place at once; the others later
    shown(line, waiting, d, 1001)
    d = line.tick(running=0, now=1005, last_low_priority_admission=990)
    assert places(d) == {
        "s0": ("Priority", 2, None),
        "s1": ("Priority", 3, None),
        "s2": ("Priority", None, None),
    }
    shown(line, waiting, d, 1005)
    assert line.tick(running=0, now=1010, last_low_priority_admission=990).place == {}


def test_the_next_low_priority_scan_waits_for_the_rate_wherever_it_stands() -> None:
    few = P.model_copy(update={"backlog_positions_shown": 1})
    line, waiting = Line(few), {}
    for x in [c("h1", 200, 1), c("h2", 200, 2), c("h3", 200, 3), c("l1", 0, 3), c("l2", 0, 4)]:
        waiting[x.key] = x
        line.put(x, now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert places(d) == {
        "h2": ("Rate", 1, 1600.0),
        "h3": ("Priority", None, None),
        "l1": ("Rate", None, None),  # beyond the first shown, but next of its class
        "l2": ("Priority", None, None),
    }
    shown(line, waiting, d, 1000)
    waiting[("ns", "l0")] = c("l0", 10, 0)  # ahead of l1 now
    line.put(waiting[("ns", "l0")], now=1001)
    d = line.tick(running=0, now=1001, last_low_priority_admission=990)
    assert d.admit == [("ns", "h2")] and places(d) == {"l0": ("Rate", None, None)}
    shown(line, waiting, d, 1001)
    assert line.tick(running=0, now=1002, last_low_priority_admission=990).admit == [("ns", "h3")]
    d = line.tick(running=0, now=1005, last_low_priority_admission=990)
    assert places(d) == {"l0": ("Rate", 1, 1205.0), "l1": ("Priority", None, None)}


def test_the_concurrency_cap_and_retries_say_what_holds_them() -> None:
    capped = P.model_copy(update={"max_running_scanners": 1})
    line = Line(capped)
    line.put(c("a", 200, 1), now=1000)
    line.put(c("b", 0, 2), now=1000)
    assert places(line.tick(running=1, now=1000, last_low_priority_admission=None)) == {
        "a": ("Quota", 1, None), "b": ("Quota", 2, None)}  # fmt: skip
    line = Line(
        P.model_copy(update={"outage_retry_delay_seconds": 1000, "outage_retry_max_delay_seconds": 1000})
    )
    line.put(c("x", 200, 0), now=1000)
    assert line.tick(running=0, now=1000, last_low_priority_admission=None).admit == [("ns", "x")]
    for name, reason in [("out", "WMSUnavailable"), ("api", "APIUnavailable"), ("quota", "QuotaExceeded"),
                         ("forbidden", "APIForbidden")]:  # fmt: skip
        line.put(replace(c(name, 200, 1, pending=999, interruptions=1), shown=Hold(reason, "")), now=1001)
    line.put(replace(c("failed", 200, 1, pending=999, attempts=1), shown=Hold("StartFailed", "")), now=1001)
    line.put(c("none", 200, 1, pending=999, interruptions=1), now=1001)
    d = line.tick(running=0, now=1001, last_low_priority_admission=None)
    assert d.hold[("ns", "failed")] == Hold("RetryDelay", "attempt 1 failed; retrying after a delay")
    got = places(d)
    assert {k: v[0] for k, v in got.items()} == {
        "out": "Outage", "api": "Outage", "quota": "Quota", "forbidden": "Quota", "failed": "Retry",
        "none": "Retry"}  # fmt: skip
    # Not before its retry is due (1000 s after 999), even if the rate says sooner.
    assert got["api"] == ("Outage", 1, 1999.0) and got["failed"] == ("Retry", 2, 2201.0)
    assert got["forbidden"] == ("Quota", 3, 2801.0) and got["none"] == ("Retry", None, None)


def test_a_moved_estimate_is_written_past_its_slack_only() -> None:
    assert moved(None, Place("Rate"), 0)
    assert moved(Place("Rate", 1), Place("Priority", 1), 0)
    assert moved(Place("Rate", 1), Place("Rate", 2), 0)
    assert moved(Place("Rate", 1), Place("Rate", 1, 100.0), 0)
    assert moved(Place("Rate", 1, 100.0), Place("Rate", 1), 0)
    assert not moved(Place("Rate", 1), Place("Rate", 1), 0)
    assert not moved(Place("Rate", 1, 100.0), Place("Rate", 1, 110.0), 100)  # within 10 s
    assert moved(Place("Rate", 1, 100.0), Place("Rate", 1, 110.5), 100)
    assert not moved(Place("Rate", 1, 1000.0), Place("Rate", 1, 1200.0), 0)  # within a quarter of 1200
    assert moved(Place("Rate", 1, 1000.0), Place("Rate", 1, 1350.0), 0)
    assert moved(Place("Rate", 1, 1000.0), Place("Rate", 1, 749.0), 0)


def test_interruptions_are_outages_or_quota_refusals() -> None:
    assert OUTAGES | QUOTA_REFUSALS == INTERRUPTIONS and not OUTAGES & QUOTA_REFUSALS


def test_the_write_cost_of_a_thousand_waiting_scans() -> None:
    """Status writes per tick with 1,000 waiting scans, one admitted per tick: each write comes back
    by the watch (`shown`). Printed for the docs' figure."""
    s = S.model_copy(update={"backlog_positions_shown": 20, "backlog_positions_interval_seconds": 5})
    line, waiting = Line(s), {}
    for i in range(1000):
        waiting[("ns", f"s{i}")] = c(f"s{i}", 100 + i % 7, i)
        line.put(waiting[("ns", f"s{i}")], now=0)
    d = line.tick(running=0, now=0, last_low_priority_admission=None)
    first = len(d.hold.keys() | d.place.keys())
    shown(line, waiting, d, 0)
    writes = []
    for now in range(1, 301):  # a tick a second
        d = line.tick(running=0, now=now, last_low_priority_admission=None)
        writes.append(len(d.hold.keys() | d.place.keys()))
        shown(line, waiting, d, now)
    print(f"first tick {first}; then per tick max {max(writes)}, mean {sum(writes) / len(writes):.1f}")
    assert first == 999  # once, as each joins the line (and one is admitted)
    assert max(writes) <= 21  # a pass: the first 20 (and the next up)
    assert sum(w > 0 for w in writes) == 60  # only on the pass's ticks, every 5 s


def test_the_cap_reached_by_a_low_priority_admission_holds_the_low_class_only() -> None:
    # Capacity 2: one high and one low start; the cap is then reached for low-priority scans only
    # (the next tick's highs see it then).
    capped = P.model_copy(update={"max_running_scanners": 3, "backlog_positions_shown": 0})
    line = Line(capped)
    for x in [c("h1", 200, 1), c("h2", 100, 2), c("l1", 0, 3), c("l2", 0, 4)]:
        line.put(x, now=1000)
    d = line.tick(running=1, now=1000, last_low_priority_admission=None)
    assert d.admit == [("ns", "h1"), ("ns", "l1")]
    assert {k[1]: h.reason for k, h in d.hold.items()} == {"h2": "Queued", "l2": "ConcurrencyLimit"}
    assert places(d) == {"h2": ("Rate", None, None), "l2": ("Quota", None, None)}  # h2: priority 100 is high
    # Capacity 3: after the same two, one is left, for everyone.
    line = Line(capped)
    for x in [c("h1", 200, 1), c("h2", 100, 2), c("l1", 0, 3), c("l2", 0, 4)]:
        line.put(x, now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=None)
    assert {k[1]: h.reason for k, h in d.hold.items()} == {"h2": "Queued", "l2": "LowPriorityInterval"}


def test_the_cap_reached_between_passes_is_written_at_once_keeping_the_place() -> None:
    capped = P.model_copy(update={"max_running_scanners": 2})
    line, waiting = Line(capped), {}
    for x in [c("h", 200, 0), c("l1", 0, 1), c("l2", 0, 2)]:
        waiting[x.key] = x
        line.put(x, now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert d.admit == [("ns", "h")]
    assert places(d) == {"l1": ("Rate", 1, 1600.0), "l2": ("Priority", 2, 2200.0)}
    shown(line, waiting, d, 1000)
    d = line.tick(running=2, now=1001, last_low_priority_admission=990)  # within the interval
    assert d.place == {("ns", "l1"): Place("Quota", 1, 1600.0), ("ns", "l2"): Place("Quota", 2, 2200.0)}
    shown(line, waiting, d, 1001)
    # The next pass: the same positions, estimates within their slack: nothing to write.
    assert line.tick(running=2, now=1005, last_low_priority_admission=990).place == {}


def test_a_restarted_operator_revisits_what_scans_show() -> None:
    """A new line fed scans as a previous operator left them: the head shows no place of its own yet,
    the one that was next shows Rate, and one beyond the first shown still shows a position."""
    line = Line(P.model_copy(update={"backlog_positions_shown": 1}))
    line.put(replace(c("l0", 10, 5), place=Place("Priority")), now=1000)
    line.put(replace(c("l1", 0, 1), place=Place("Rate")), now=1000)
    line.put(replace(c("l2", 0, 2), place=Place("Priority", 2)), now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    assert places(d) == {
        "l0": ("Rate", 1, None),
        "l1": ("Priority", None, None),
        "l2": ("Priority", None, None),
    }


def test_a_scan_written_but_not_yet_seen_is_revisited() -> None:
    """Places written by a pass whose watch events have not come back yet are looked at again."""
    line = Line(P.model_copy(update={"backlog_positions_shown": 0}))
    line.put(c("l1", 0, 1), now=1000)
    line.put(c("l2", 0, 2), now=1000)
    assert places(line.tick(running=0, now=1000, last_low_priority_admission=990)) == {
        "l1": ("Rate", None, None), "l2": ("Priority", None, None)}  # fmt: skip
    line.put(c("l0", 10, 5), now=1001)
    assert places(line.tick(running=0, now=1001, last_low_priority_admission=990)) == {
        "l0": ("Rate", None, None)
    }
    d = line.tick(running=0, now=1005, last_low_priority_admission=990)
    # l1 (was next, Rate) is looked at again; l0 too, as what it shows is not seen yet; not l2.
    assert places(d) == {"l0": ("Rate", None, None), "l1": ("Priority", None, None)}


def test_the_next_high_priority_scan_is_told_by_a_pass_wherever_it_stands() -> None:
    line, waiting = Line(P.model_copy(update={"backlog_positions_shown": 0})), {}
    for i in range(1, 5):
        waiting[("ns", f"h{i}")] = c(f"h{i}", 200, i)
        line.put(waiting[("ns", f"h{i}")], now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=None)
    assert places(d) == {
        "h2": ("Rate", None, None),
        "h3": ("Priority", None, None),
        "h4": ("Priority", None, None),
    }
    shown(line, waiting, d, 1000)
    d = line.tick(running=0, now=1001, last_low_priority_admission=None)
    assert d.admit == [("ns", "h2")] and d.place == {}  # h3, next now, is told by the next pass
    d = line.tick(running=0, now=1005, last_low_priority_admission=None)
    assert d.admit == [("ns", "h3")] and places(d) == {"h4": ("Rate", None, None)}


def test_the_next_low_priority_scan_is_told_when_the_one_ahead_starts() -> None:
    line, waiting = Line(P.model_copy(update={"backlog_positions_shown": 0})), {}
    for x in [c("h1", 200, 1), c("h2", 200, 2), c("h3", 200, 3), c("l1", 0, 1), c("l2", 0, 2), c("l3", 0, 3)]:
        waiting[x.key] = x
        line.put(x, now=1000)
    d = line.tick(running=0, now=1000, last_low_priority_admission=990)
    shown(line, waiting, d, 1000)
    d = line.tick(running=0, now=1290, last_low_priority_admission=990)  # h2 and l1 start; a pass
    assert d.admit == [("ns", "h2"), ("ns", "l1")]
    assert places(d) == {"h3": ("Rate", None, None), "l2": ("Rate", None, None)}  # the next up of each


def test_a_scan_leaving_its_retry_leaves_no_trace() -> None:
    line = Line(S)
    line.put(c("a", 200, 1, pending=990, attempts=1), now=1000)
    line.remove(("ns", "a"))
    assert line.tick(running=0, now=1100, last_low_priority_admission=None) == decide(
        [], running=0, now=1100, last_low_priority_admission=None, settings=S
    )
    line.put(c("b", 200, 1, pending=990, attempts=1), now=1000)
    line.put(c("b", 300, 1, pending=990, attempts=1), now=1000)  # changed while retrying
    d = line.tick(running=0, now=1100, last_low_priority_admission=None)
    assert d.admit == [("ns", "b")] and len(line) == 0
