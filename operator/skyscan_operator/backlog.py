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
"""

from __future__ import annotations

import bisect
import heapq
import sys
from dataclasses import dataclass, field

from skyscan_operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)
Rank = tuple[int, float, Key]  # the admission order: higher priority, then older, then by name


@dataclass(frozen=True, slots=True)
class Hold:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Candidate:
    key: Key
    priority: int
    entered_at: float
    pending_since: float  # when the last start attempt began or failed; 0: never tried
    attempts: int
    interruptions: int = 0  # attempts in a row interrupted by an outage or a quota refusal
    shown: Hold | None = None  # the hold its status shows now (so an unchanged one is not rewritten)

    @property
    def rank(self) -> Rank:
        return (-self.priority, self.entered_at, self.key)


@dataclass
class Decision:
    admit: list[Key] = field(default_factory=list)
    hold: dict[Key, Hold] = field(default_factory=dict)  # only the holds to write
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
        due = retry_due(c, self.settings)
        if due > now:
            self._due[c.key] = due
            heapq.heappush(self._retrying, (due, c.key))
        else:
            bisect.insort(self._ready, c.rank)
        self._touched.add(c.key)

    def remove(self, key: Key) -> None:
        held = self._candidates.pop(key, None)
        if held is not None:
            self._unlink(held)
        self._touched.discard(key)

    def _unlink(self, c: Candidate) -> None:
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
        self._write_holds(decision, now, high_reason, low_reason)
        return decision

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
