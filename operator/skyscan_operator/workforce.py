"""What the scan's status says about its WMS taskforces (pure): the workforce summary and list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skyscan import model

NOT_WORKING = ("FatalError", "Done")
# The phases a deactivation leaves every taskforce in (EWMS moves the others to pending-stopper at once).
STOPPING_PHASES = frozenset({"pending-stopper", "condor-rm", "condor-complete"})


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


def cluster_of(taskforce: Mapping[str, Any], schedds: Mapping[str, str]) -> str | None:
    """The cluster location of a taskforce. EWMS's taskforce names only its `schedd` (the cluster was
    resolved to it at creation), so the cluster is the one `schedds` pairs with it; a WMS that states
    a `cluster_location` is taken at its word."""
    if given := taskforce.get("cluster_location"):
        return str(given)
    schedd = taskforce.get("schedd")
    return next((cluster for cluster, s in schedds.items() if s == schedd), None)


def compact(taskforces: Iterable[dict[str, Any]], schedds: Mapping[str, str]) -> list[dict[str, Any]]:
    """The taskforce list kept in status, in the WMS's own field names (the REST route returns them),
    with the `cluster_location` each runs at (`cluster_of`)."""
    keep = ("taskforce_uuid", "schedd", "n_workers", "phase", "compound_statuses", "top_task_errors")
    return [
        {**{k: tf.get(k) for k in keep}, "cluster_location": cluster_of(tf, schedds)}
        for tf in sorted(taskforces, key=lambda t: t.get("timestamp", 0))
    ]


def wants_final_read(taskforces: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the taskforces a deactivated workflow's scan shows predate its deactivation: none
    recorded, or one not yet in a stopping phase. The WMS is then read once more, so the last
    display is what the WMS says after the deactivation, not the poll before it."""
    shown = list(taskforces)
    return not shown or any(tf.get("phase") not in STOPPING_PHASES for tf in shown)
