"""Backlog admission (pure): which waiting scans may start on this tick, and why the others wait.

Order is priority (high first) then age, as in the reference. Scans with priority at least
`min_priority_asap` may start on every tick (`admissions_per_tick` of them); lower priorities at most
one per `low_priority_interval_seconds`. The reference's "fast-forward" falls out naturally: the
interval is measured from the last low-priority admission, so after an idle period the next
low-priority scan starts on the next tick. A concurrency cap holds everything back when reached.

A scan whose last start attempt failed waits before it is tried again: `start_retry_delay_seconds`
after a failure of the scan itself (which counted as an attempt), or a bounded exponential backoff
after attempts interrupted by an outage or a quota refusal (which did not count): see `retry_delay`.

The waiting scans are kept in a `Line`, updated per watch event, so a tick looks at the head it may
admit and at the scans whose hold must change, never at all of them. The hold of a scan follows from
its class and the tick's outcome alone: after the admissions, every held high-priority scan waits for
the same reason (`Queued`, or `ConcurrencyLimit` once the cap is reached), and so does every held
low-priority one (`LowPriorityInterval`, or `ConcurrencyLimit`). So a hold is written when a scan
joins the line, or when its class's reason changes; a scan waiting out a retry delay keeps its failed
attempt's reason visible.

Where a waiting scan stands (`Place`, its status' `backlog` part) is written as sparingly. Its wait
reason: Outage, Quota or Retry while it waits out a retry delay (by its attempt's reason), Quota while
its class is held by the concurrency cap, Rate if its class's next admission takes it, else Priority
(scans ahead of it go first). Only the first `backlog_positions_shown` scans in admission order (and
the scans their class admits next) have a position and an estimated start (from the admissions over
the last `backlog_rate_window_seconds`); those are looked at by a pass at most every
`backlog_positions_interval_seconds`, so a pass writes at most that many places, plus those pushed
back beyond them. Every other scan's place changes with its class's reason only, as its hold does.
"""

from __future__ import annotations

import bisect
import heapq
import math
import sys
from collections import deque
from dataclasses import dataclass, field, replace

from skyscan_operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)
Rank = tuple[int, float, Key]  # the admission order: higher priority, then older, then by name
# An attempt's reasons (planner.INTERRUPTIONS) by what they tell a scan waiting out the retry delay.
OUTAGES = frozenset({"WMSUnavailable", "APIUnavailable"})
QUOTA_REFUSALS = frozenset({"QuotaExceeded", "APIForbidden"})
WAITS = ("Rate", "Priority", "Quota", "Outage", "Retry")
# A shown estimated start is written again when the estimate moved by more than this share of the
# wait still ahead, and by more than ESTIMATE_SLACK_SECONDS.
ESTIMATE_SHARE = 0.25
ESTIMATE_SLACK_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Hold:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Place:
    """Where a waiting scan stands, as its status shows it: why it waits, and among the first in
    admission order its 1-based position and estimated start (Unix seconds, whole)."""

    wait: str
    position: int | None = None
    start_at: float | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    key: Key
    priority: int
    entered_at: float
    pending_since: float  # when the last start attempt began or failed; 0: never tried
    attempts: int
    interruptions: int = 0  # attempts in a row interrupted by an outage or a quota refusal
    shown: Hold | None = None  # the hold its status shows now (so an unchanged one is not rewritten)
    place: Place | None = None  # the place its status shows now

    @property
    def rank(self) -> Rank:
        return (-self.priority, self.entered_at, self.key)


@dataclass
class Decision:
    admit: list[Key] = field(default_factory=list)
    hold: dict[Key, Hold] = field(default_factory=dict)  # only the holds to write
    place: dict[Key, Place] = field(default_factory=dict)  # only the places to write
    low_priority_admitted_at: float | None = None


def retry_delay(interruptions: int, settings: OperatorSettings) -> float:
    """How long a scan waits after its last failed attempt (`interruptions` 0), or after its last
    `interruptions` attempts in a row were interrupted: from `outage_retry_delay_seconds`, doubling,
    up to `outage_retry_max_delay_seconds`."""
    if interruptions:
        first, most = settings.outage_retry_delay_seconds, settings.outage_retry_max_delay_seconds
        return float(min(most, first * 2 ** min(interruptions - 1, 30)))
    return settings.start_retry_delay_seconds


def retry_due(c: Candidate, settings: OperatorSettings) -> float:
    """When a scan may be tried (again): at once if it never was."""
    return c.pending_since + retry_delay(c.interruptions, settings) if c.pending_since else 0.0


def order(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: c.rank)


def moved(shown: Place | None, place: Place, now: float) -> bool:
    """Whether `place` must be written over what the status shows: another reason or position, an
    estimate appearing or going, or one that moved by more than its slack."""
    if shown is None or (shown.wait, shown.position) != (place.wait, place.position):
        return True
    if shown.start_at is None or place.start_at is None:
        return shown.start_at != place.start_at
    slack = max(ESTIMATE_SLACK_SECONDS, ESTIMATE_SHARE * (place.start_at - now))
    return abs(place.start_at - shown.start_at) > slack


def holds(settings: OperatorSettings) -> dict[str, Hold]:
    """The holds a tick writes, by reason, with the messages the status shows."""
    return {
        "ConcurrencyLimit": Hold(
            "ConcurrencyLimit", f"at most {settings.max_running_scanners} scanners run at once"
        ),
        "Queued": Hold("Queued", "waiting for a backlog tick"),
        "LowPriorityInterval": Hold(
            "LowPriorityInterval",
            f"priority below {settings.min_priority_asap}: one start per "
            f"{settings.low_priority_interval_seconds:g}s",
        ),
    }


class Line:
    """The scans waiting in the backlog: those that may start now in admission order, those waiting
    out a retry delay by due time. `put` and `remove` cost a binary search (and a list shift); `tick`
    costs the admissions it makes and the holds it must (re)write."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._holds = holds(settings)
        self._candidates: dict[Key, Candidate] = {}
        self._ready: list[Rank] = []  # sorted: the head is admitted first
        self._retrying: list[tuple[float, Key]] = []  # a heap by due time; stale entries are skipped
        self._due: dict[Key, float] = {}  # the candidates in `_retrying`, with their due times
        self._touched: set[Key] = set()  # put since the last tick: their holds are looked at
        self._reasons = ("", "")  # the last tick's holds of high-, low-priority scans
        self._order: list[Rank] = []  # every candidate, sorted: positions are taken from it
        self._placed: set[Key] = set()  # given a position or Rate: looked at again by the next pass
        self._placed_at = -math.inf  # when the last pass of positions ran
        self._admitted_at: deque[float] = deque()  # admissions within the rate window

    def __len__(self) -> int:
        return len(self._candidates)

    def __contains__(self, key: Key) -> bool:
        return key in self._candidates

    def oldest_entry(self) -> float | None:
        """When the scan longest in the line entered the backlog (for /metrics: one pass, at scrape)."""
        return min((c.entered_at for c in self._candidates.values()), default=None)

    def put(self, c: Candidate, now: float) -> None:
        """Add or update a candidate; an unchanged one costs a lookup."""
        held = self._candidates.get(c.key)
        if held == c:
            return
        if held is not None:
            self._unlink(held)
        self._candidates[c.key] = c
        rank = c.rank  # one tuple in both lines, not one each (10,000 waiting scans: 0.6 MiB)
        bisect.insort(self._order, rank)
        due = retry_due(c, self.settings)
        if due > now:
            self._due[c.key] = due
            heapq.heappush(self._retrying, (due, c.key))
        else:
            bisect.insort(self._ready, rank)
        self._touched.add(c.key)

    def remove(self, key: Key) -> None:
        held = self._candidates.pop(key, None)
        if held is not None:
            self._unlink(held)
        self._touched.discard(key)

    def _unlink(self, c: Candidate) -> None:
        del self._order[bisect.bisect_left(self._order, c.rank)]
        if self._due.pop(c.key, None) is not None:
            return  # its entry in `_retrying` goes stale
        i = bisect.bisect_left(self._ready, c.rank)
        if i < len(self._ready) and self._ready[i] == c.rank:
            del self._ready[i]

    def _low_start(self) -> int:
        """Index of the first low-priority scan in `_ready`; all before it are high-priority."""
        after_high: tuple[int] = (1 - self.settings.min_priority_asap,)  # sorts before any such rank
        return bisect.bisect_left(self._ready, after_high)

    def _release_due(self, now: float) -> None:
        while self._retrying and self._retrying[0][0] <= now:
            due, key = heapq.heappop(self._retrying)
            if self._due.get(key) == due:
                del self._due[key]
                bisect.insort(self._ready, self._candidates[key].rank)
                self._touched.add(key)

    def tick(self, *, running: int, now: float, last_low_priority_admission: float | None) -> Decision:
        """Admit from the head; `running` counts started, unfinished scans (for the concurrency cap)."""
        s = self.settings
        self._release_due(now)
        decision = Decision(low_priority_admitted_at=last_low_priority_admission)
        cap = s.max_running_scanners
        capacity = max(0, cap - running) if cap else sys.maxsize
        while len(decision.admit) < min(s.admissions_per_tick, capacity) and self._low_start() > 0:
            self._admit(self._ready[0][2], decision)
        capacity -= len(decision.admit)
        high_reason = "Queued" if capacity > 0 else "ConcurrencyLimit"
        low_due = (
            last_low_priority_admission is None
            or now - last_low_priority_admission >= s.low_priority_interval_seconds
        )
        low = self._low_start()
        if capacity > 0 and low_due and low < len(self._ready):
            self._admit(self._ready[low][2], decision)
            decision.low_priority_admitted_at = now
            capacity -= 1
        low_reason = "LowPriorityInterval" if capacity > 0 else "ConcurrencyLimit"
        window = s.backlog_rate_window_seconds
        self._admitted_at.extend(now for _ in decision.admit)
        while self._admitted_at and self._admitted_at[0] <= now - window:
            self._admitted_at.popleft()
        self._write_holds(decision, now, high_reason, low_reason)
        if now - self._placed_at >= s.backlog_positions_interval_seconds:
            self._place_first(decision, now)
        return decision

    def admissions_per_minute(self) -> float:
        """The recent admission rate: admissions over the last `backlog_rate_window_seconds`."""
        return len(self._admitted_at) * 60 / self.settings.backlog_rate_window_seconds

    def _admit(self, key: Key, decision: Decision) -> None:
        decision.admit.append(key)
        self.remove(key)  # in a start attempt now; put back if it waits again

    def _write_holds(self, decision: Decision, now: float, high_reason: str, low_reason: str) -> None:
        """Holds for the scans put since the last tick, and for every scan of a class whose reason
        changed; only those that differ from what the scan shows."""
        touched, self._touched = self._touched, set()
        low = self._low_start()
        if high_reason != self._reasons[0]:
            touched.update(rank[2] for rank in self._ready[:low])
        if low_reason != self._reasons[1]:
            touched.update(rank[2] for rank in self._ready[low:])
        self._reasons = (high_reason, low_reason)
        asap = self.settings.min_priority_asap
        for key in touched:
            c = self._candidates.get(key)
            if c is None:
                continue
            if key in self._due:  # its failed attempt's reason stays visible
                hold = Hold("RetryDelay", f"attempt {c.attempts} failed; retrying after a delay")
            else:
                hold = self._holds[high_reason if c.priority >= asap else low_reason]
            if hold != c.shown:
                decision.hold[key] = hold
            self._write_kept_place(decision, c, now)

    def _write_kept_place(self, decision: Decision, c: Candidate, now: float) -> None:
        """Between passes, a scan that shows a place keeps its position and estimate, and Rate or
        Priority, until the next pass; what holds its class (the cap) or its retry is written at once.
        A scan that shows none (joining the line) takes its place now."""
        shown = c.place
        if shown is None:
            position = bisect.bisect_left(self._order, c.rank) + 1
            shown_now = position <= self.settings.backlog_positions_shown
            self._write_place(decision, c, now, position if shown_now else None)
            return
        wait = self._wait(c)
        if {wait, shown.wait} <= {"Rate", "Priority"}:
            wait = shown.wait
        if shown.position is not None or wait == "Rate":
            self._placed.add(c.key)
        if wait != shown.wait:
            decision.place[c.key] = replace(shown, wait=wait)

    def _place_first(self, decision: Decision, now: float) -> None:
        """The pass of positions: the first shown scans in admission order and the scans their
        class admits next, and those the last pass placed that are neither now."""
        self._placed_at = now
        placed, self._placed = self._placed, set()
        first = [rank[2] for rank in self._order[: self.settings.backlog_positions_shown]]
        for position, key in enumerate(first, 1):
            self._write_place(decision, self._candidates[key], now, position)
        low = self._low_start()
        heads = [r[2] for r in self._ready[: min(self.settings.admissions_per_tick, low)]]
        heads += [r[2] for r in self._ready[low : low + 1]]
        for key in [*heads, *placed]:
            c = self._candidates.get(key)
            if c is not None and key not in self._placed:
                self._write_place(decision, c, now, None)

    def _write_place(self, decision: Decision, c: Candidate, now: float, position: int | None) -> None:
        wait = self._wait(c)
        if position is not None or wait == "Rate":
            self._placed.add(c.key)
        place = Place(wait, position, self._estimate(c, now, position))
        if moved(c.place, place, now):
            decision.place[c.key] = place

    def _estimate(self, c: Candidate, now: float, position: int | None) -> float | None:
        """When the scan at `position` may start at the recent admission rate (not before its retry
        is due); None beyond the first shown, or with no admission in the window."""
        if position is None or not self._admitted_at:
            return None
        wait = position * self.settings.backlog_rate_window_seconds / len(self._admitted_at)
        return float(round(max(now + wait, self._due.get(c.key, now))))

    def _wait(self, c: Candidate) -> str:
        """Why the scan waits now (see the module's docstring)."""
        if c.key in self._due:
            reason = c.shown.reason if c.shown else ""
            return "Outage" if reason in OUTAGES else "Quota" if reason in QUOTA_REFUSALS else "Retry"
        high = c.priority >= self.settings.min_priority_asap
        if self._reasons[0 if high else 1] == "ConcurrencyLimit":
            return "Quota"
        i, low = bisect.bisect_left(self._ready, c.rank), self._low_start()
        next_up = i < min(self.settings.admissions_per_tick, low) if high else i == low
        return "Rate" if next_up else "Priority"


def decide(
    candidates: list[Candidate],
    *,
    running: int,
    now: float,
    last_low_priority_admission: float | None,
    settings: OperatorSettings,
) -> Decision:
    """One tick over a fresh line of `candidates` (the scans waiting in the backlog, not in a start
    attempt right now): every candidate not admitted gets its hold."""
    line = Line(settings)
    for c in candidates:
        line.put(c, now)
    return line.tick(running=running, now=now, last_low_priority_admission=last_low_priority_admission)
