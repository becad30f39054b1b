"""How the command shows scans, statuses and results to people (`--json` shows the documents instead)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.table import Table

from skyscan_client.follow import workers
from skyscan_client.types import Result, Status

FIND_PROJECTION = [
    "scan_id",
    "timestamp",
    "event_metadata",
    "classifiers",
    "is_deleted",
    "replaced_by_scan_id",
]


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def scans(manifests: list[dict[str, Any]], states: dict[str, str] | None = None) -> Table:
    table = Table(title=f"{len(manifests)} scan{'s' if len(manifests) != 1 else ''}", title_justify="left")
    for name in ("scan id", "created (UTC)", "run", "event", "classifiers", "deleted", "replaced by"):
        table.add_column(name, no_wrap=name == "scan id")
    if states is not None:
        table.add_column("state")
    for m in manifests:
        event = m.get("event_metadata") or {}
        classifiers = ", ".join(f"{k}={v}" for k, v in sorted((m.get("classifiers") or {}).items()))
        row = [
            str(m.get("scan_id")),
            _when(m.get("timestamp")),
            str(event.get("run_id", "-")),
            str(event.get("event_id", "-")),
            classifiers,
            "yes" if m.get("is_deleted") else "",
            str(m.get("replaced_by_scan_id") or ""),
        ]
        if states is not None:
            row.append(states.get(str(m.get("scan_id")), ""))
        table.add_row(*row)
    return table


# The interface's `wms_workflow_id` before the workflow is requested (as the workforce's `workflow_id`).
NOT_YET_REQUESTED = "not-yet-requested"


def wms(doc: Status) -> str:
    """The scan's WMS workflow as a word: its deactivation, else active once it exists; a workflow
    never created (waiting, failed or deleted before its start) is not shown active."""
    if deactivated := doc.get("wms_deactivated"):
        return str(deactivated)
    workflow_id = (doc.get("wms_workforce") or {}).get("workflow_id")
    return "active" if workflow_id not in (None, "", NOT_YET_REQUESTED) else "not requested"


def status(scan_id: str, doc: Status) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_row("scan", scan_id)
    table.add_row("state", f"[bold]{doc['scan_state']}[/bold]")
    table.add_row("complete", "yes" if doc.get("scan_complete") else "no")
    table.add_row("deleted", "yes" if doc.get("is_deleted") else "no")
    table.add_row("WMS", wms(doc))
    table.add_row("workers", workers(dict(doc)))
    table.add_row("logs", str((doc.get("scanner_server_logs") or {}).get("url") or "-"))
    if place := doc.get("backlog"):
        table.add_row("backlog", backlog_place(place))
    return table


# What each wait reason of a waiting scan means (docs: the backlog).
WAITS = {
    "Rate": "next to start, at the admission rate",
    "Priority": "scans ahead of it start first",
    "Quota": "the cap on running scans is reached",
    "Outage": "its start was interrupted by an outage; retrying",
    "Retry": "its last start attempt failed; retrying",
}


def backlog_place(place: dict[str, Any]) -> str:
    """A waiting scan's place: `position 3 · Priority (scans ahead of it start first) · about 4 min`."""
    reason = str(place.get("wait_reason"))
    parts = [f"{reason} ({WAITS[reason]})" if reason in WAITS else reason]
    if (position := place.get("position")) is not None:
        parts.insert(0, f"position {position}")
    if (wait := place.get("estimated_wait_seconds")) is not None:
        parts.append(f"about {_duration(float(wait))}")
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def result(scan_id: str, doc: Result) -> Table:
    """Per nside: pixels and the best (lowest -llh) pixel."""
    blocks = doc.get("scan_result") or {}
    final = "final" if doc.get("is_final") else "partial"
    table = Table(title=f"{final} result of scan {scan_id}", title_justify="left")
    for name in ("nside", "pixels", "best pixel", "llh"):
        table.add_column(name, justify="right")
    for key, block in sorted(blocks.items(), key=lambda kv: int(str(kv[0]).rpartition("-")[2] or 0)):
        columns = list(block.get("columns") or [])
        rows = block.get("data") or []
        if "llh" in columns and rows:
            llh = columns.index("llh")
            best = min(rows, key=lambda r: float(r[llh]) if isinstance(r[llh], int | float) else float("inf"))
            table.add_row(key.rpartition("-")[2], str(len(rows)), str(best[0]), f"{best[llh]:.3f}")
        else:
            table.add_row(key.rpartition("-")[2], str(len(rows)), "-", "-")
    return table
