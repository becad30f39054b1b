"""Kubernetes-convention conditions on the Scan status (wire form), and time helpers."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, NamedTuple

# Condition types the operator writes.
ADMITTED = "Admitted"  # the backlog let the scan start (False: why it waits, or why an attempt failed)
WORKFLOW_READY = "WorkflowReady"  # the WMS workflow exists and its message queues are activated
SCANNER_RUNNING = "ScannerRunning"  # the scanner Job's pod is running (False: pending, ended, why)
WMS_AVAILABLE = "WMSAvailable"  # the last WMS call for this scan, and the last batched poll, succeeded
COMPLETE = "Complete"  # a final result was recorded
FAILED = "Failed"  # terminal: the scan will not make progress (reason says why)
DELETED = "Deleted"  # soft-deleted (or replaced); terminal once its workflow and Job are gone
# The summary, in kstatus's terms (Flux reads these; Argo CD's health check too): Reconciling and
# Stalled are "abnormal-true", never both True; Ready is True once nothing is left to do.
READY = "Ready"  # the scan reached its end: a final result, or the abort its deletion asked for
RECONCILING = "Reconciling"  # the operator still works on it: waiting, starting, running, aborting
STALLED = "Stalled"  # failed: it will not progress without someone acting (reason and message say why)
SUMMARY = (READY, RECONCILING, STALLED)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def reason_of(text: str | None, default: str = "Unknown") -> str:
    """A condition reason (CamelCase identifier) from free text such as a pod's termination reason."""
    words = re.findall(r"[A-Za-z0-9]+", text or "")
    out = "".join(w[:1].upper() + w[1:] for w in words)
    out = out.lstrip("0123456789")
    return out or default


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def reason(conditions: list[dict[str, Any]], type_: str) -> str | None:
    c = find(conditions, type_)
    return c.get("reason") if c else None


def message(conditions: list[dict[str, Any]], type_: str) -> str:
    c = find(conditions, type_)
    return message_of(c) if c else ""


def message_of(condition: dict[str, Any]) -> str:
    return str(condition.get("message", ""))


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    c = find(conditions, type_)
    return c is not None and c.get("status") == "True"


class Summary(NamedTuple):
    holds: str  # READY, RECONCILING or STALLED
    reason: str
    message: str
    since: float | None  # when the condition that ended the scan (Failed, Deleted, Complete) turned True


def summary(conditions: list[dict[str, Any]], *, deleting: bool, released: bool) -> Summary:
    """Which summary condition holds, with its reason and message, from the other conditions;
    `released`: no workflow held and no Job running (a deletion's abort is done)."""
    if deleting:
        return Summary(RECONCILING, "Deleting", "deleted: its workflow and Job go first", None)
    for type_ in (FAILED, DELETED, COMPLETE):
        if is_true(conditions, type_):
            c = find(conditions, type_) or {}
            why, text, since = c.get("reason") or type_, message_of(c), epoch(c.get("lastTransitionTime"))
            if type_ == FAILED:
                return Summary(STALLED, why, text, since)
            if type_ == DELETED and not released:
                return Summary(RECONCILING, why, f"{text}: stopping its workflow and Job", None)
            return Summary(READY, why, text, since)
    if find(conditions, SCANNER_RUNNING):  # its Job exists
        return Summary(RECONCILING, "Running", message(conditions, SCANNER_RUNNING), None)
    if is_true(conditions, ADMITTED):
        text = message(conditions, WORKFLOW_READY) or message(conditions, ADMITTED)
        return Summary(RECONCILING, "Starting", text, None)
    return Summary(RECONCILING, "Waiting", message(conditions, ADMITTED) or "waiting in the backlog", None)


def summarized(
    conditions: list[dict[str, Any]], *, deleting: bool, released: bool, now: float, at: int | None
) -> list[dict[str, Any]]:
    """`conditions` with Ready, Reconciling and Stalled brought in line with the others (`at`: the
    generation observed). A scan that ended before it had them (an older operator's) gets them dated
    from its end, not now: the archiver's clock runs from a scan's latest transition."""
    s = summary(conditions, deleting=deleting, released=released)
    when = s.since if s.since is not None and find(conditions, READY) is None else now
    for type_ in SUMMARY:
        conditions = put(conditions, type_, type_ == s.holds, s.reason, s.message, when, at)
    return conditions


def put(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None,
) -> list[dict[str, Any]]:
    """`conditions` with `type_` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    old = find(conditions, type_)
    changed = old is None or old.get("status") != value
    new = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": iso(now) if changed else old["lastTransitionTime"],  # type: ignore[index]
        "observedGeneration": generation,
    }
    if old == new:
        return conditions
    return [new if c is old else c for c in conditions] if old else [*conditions, new]
