"""What the scan's status says about its WMS taskforces (pure): the workforce summary and list."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from skyscan import model

NOT_WORKING = ("FatalError", "Done")


def _add(into: dict[str, Any], counts: dict[str, Any]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + int(n or 0)


def summarize(taskforces: Iterable[dict[str, Any]]) -> model.Workforce:
    """Compound statuses summed key-wise; n_running = RUNNING workers not FatalError/Done; top errors."""
    statuses: dict[str, dict[str, int]] = {}
    errors: dict[str, int] = {}
    for tf in taskforces:
        for condor, by_pilot in (tf.get("compound_statuses") or {}).items():
            _add(statuses.setdefault(condor, {}), by_pilot or {})
        _add(errors, tf.get("top_task_errors") or {})
    running = statuses.get("RUNNING", {})
    n_running = sum(n for pilot, n in running.items() if pilot not in NOT_WORKING)
    return model.Workforce(statuses=statuses, n_running=n_running, top_errors=errors)


def compact(taskforces: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The taskforce list kept in status, in the WMS's own field names (the REST route returns them)."""
    keep = (
        "taskforce_uuid",
        "cluster_location",
        "n_workers",
        "phase",
        "compound_statuses",
        "top_task_errors",
    )
    return [{k: tf.get(k) for k in keep} for tf in sorted(taskforces, key=lambda t: t.get("timestamp", 0))]
