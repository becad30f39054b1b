"""Backlog admission (pure): which waiting scans may start on this tick, and why the others wait.

Order is priority (high first) then age, as in the reference. Scans with priority at least
`min_priority_asap` may start on every tick (`admissions_per_tick` of them); lower priorities at most
one per `low_priority_interval_seconds`. The reference's "fast-forward" falls out naturally: the
interval is measured from the last low-priority admission, so after an idle period the next
low-priority scan starts on the next tick. A concurrency cap holds everything back when reached.

A scan whose last start attempt failed waits before it is tried again: `start_retry_delay_seconds`
after a failure of the scan itself (which counted as an attempt), or a bounded exponential backoff
after attempts interrupted by an outage or a quota refusal (which did not count): see `retry_delay`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skyscan_operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Candidate:
    key: Key
    priority: int
    entered_at: float
    pending_since: float  # when the last start attempt began or failed; 0: never tried
    attempts: int
    interruptions: int = 0  # attempts in a row interrupted by an outage or a quota refusal


@dataclass(frozen=True)
class Hold:
    reason: str
    message: str


@dataclass
class Decision:
    admit: list[Key] = field(default_factory=list)
    hold: dict[Key, Hold] = field(default_factory=dict)
    low_priority_admitted_at: float | None = None


def retry_delay(interruptions: int, settings: OperatorSettings) -> float:
    """How long a scan waits after its last failed attempt (`interruptions` 0), or after its last
    `interruptions` attempts in a row were interrupted: from `outage_retry_delay_seconds`, doubling,
    up to `outage_retry_max_delay_seconds`."""
    if interruptions:
        first, most = settings.outage_retry_delay_seconds, settings.outage_retry_max_delay_seconds
        return float(min(most, first * 2 ** min(interruptions - 1, 30)))
    return settings.start_retry_delay_seconds


def order(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=lambda c: (-c.priority, c.entered_at, c.key))


def decide(
    candidates: list[Candidate],
    *,
    running: int,
    now: float,
    last_low_priority_admission: float | None,
    settings: OperatorSettings,
) -> Decision:
    """`candidates` are the scans waiting in the backlog (not in a start attempt right now);
    `running` counts started, unfinished scans (for the concurrency cap)."""
    decision = Decision(low_priority_admitted_at=last_low_priority_admission)
    cap = settings.max_running_scanners
    capacity = max(0, cap - running) if cap else len(candidates)
    high_budget = settings.admissions_per_tick
    low_due = (
        last_low_priority_admission is None
        or now - last_low_priority_admission >= settings.low_priority_interval_seconds
    )
    for c in order(candidates):
        if c.pending_since and now - c.pending_since < retry_delay(c.interruptions, settings):
            decision.hold[c.key] = Hold("RetryDelay", f"attempt {c.attempts} failed; retrying after a delay")
            continue
        if capacity <= 0:
            decision.hold[c.key] = Hold("ConcurrencyLimit", f"at most {cap} scanners run at once")
            continue
        if c.priority >= settings.min_priority_asap:
            if high_budget > 0:
                high_budget -= 1
            else:
                decision.hold[c.key] = Hold("Queued", "waiting for a backlog tick")
                continue
        elif low_due:
            low_due = False
            decision.low_priority_admitted_at = now
        else:
            decision.hold[c.key] = Hold(
                "LowPriorityInterval",
                f"priority below {settings.min_priority_asap}: one start per "
                f"{settings.low_priority_interval_seconds:g}s",
            )
            continue
        capacity -= 1
        decision.admit.append(c.key)
    return decision
