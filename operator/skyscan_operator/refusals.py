"""How a WMS refusal reads on a scan (pure): which cluster it names, and what the scan records.

A refusal (`WMSError`, not `WMSUnavailable`) is the WMS's answer to this request: asking again gets the
same answer. EWMS refuses a cluster location it does not know with a 400 whose text names it
("condor cluster location not found: local"), so the scan's condition and add-workers' answer name it
too, by the name the scan asked for it when an alias (`SKYSCAN_WMS_CLUSTERS_ALIAS`) renamed it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from skyscan_operator.wms_client import WMSError, WMSUnavailable

CLUSTER_REFUSED = "ClusterRefused"  # the WMS refused a cluster location the scan asks for
WMS_REJECTED = "WMSRejected"  # the WMS refused the workflow request for another reason


def named_clusters(detail: str, clusters: Mapping[str, str]) -> list[str]:
    """The clusters (WMS names, keys of `clusters`) that the WMS's refusal text names, as whole names
    (a sentence's full stop may follow one)."""
    return [name for name in clusters if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", detail)]


def _shown(name: str, asked: str) -> str:
    return f"'{name}'" if name == asked else f"'{name}' (asked as '{asked}')"


def workflow_refusal(e: WMSError, clusters: Mapping[str, str]) -> tuple[str, str]:
    """A scan's (reason, message) when the WMS refused its workflow request; `clusters` maps each
    location as the WMS was asked for it to the scan's own name for it."""
    named = named_clusters(e.detail, clusters)
    if not named:
        return WMS_REJECTED, f"the WMS refused the workflow request: {e}"
    shown = ", ".join(_shown(name, clusters[name]) for name in named)
    return CLUSTER_REFUSED, f"the WMS refused cluster {shown}: {e}"


Outcome = Literal["Refused", "Rejected", "Failed"]


def refused_workers(e: WMSError, location: str, asked: str) -> tuple[Outcome, str]:
    """An add-workers request's (state, reason) when the WMS did not add them: `Refused` (REST 422)
    when the WMS says the workflow takes no more (its 422: deactivated), `Rejected` (REST 400) when it
    refused the request itself (a 4xx: a cluster it does not know), `Failed` (REST 500) when it could
    not serve it or no longer knows the workflow (404)."""
    if isinstance(e, WMSUnavailable) or e.status in (None, 404):
        return "Failed", str(e)
    if e.status == 422:
        return "Refused", f"the WMS takes no more workers for this workflow: {e}"
    return "Rejected", f"the WMS refused workers at cluster {_shown(location, asked)}: {e}"
