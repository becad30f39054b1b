"""Where a waiting scan stands, on the real API server with the operator as a process: its position
in admission order (priority, then arrival), why it waits (the rate, the scans ahead of it, the cap on
running scanners, a WMS outage), its estimated start from the recent admissions, and the position in
`kubectl get scans` (the Scan's printer column, as the API server prints it)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from skyscan.io.kube import Kube, scan_path
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    RestartableWMS,
    Simulator,
    condition,
    create_scan,
    get_scan,
    release_pod,
    st,
    wait_scan,
)

pytestmark = pytest.mark.timeout(150)

# Positions looked at twice a tick; the low-priority interval long enough that waiting ones stay so.
PLACES = {
    "SKYSCAN_BACKLOG_TICK_SECONDS": "0.3",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "3600",
    "SKYSCAN_BACKLOG_POSITIONS_INTERVAL_SECONDS": "0.15",
}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"  # what kubectl get asks for


def place(scan: dict[str, Any]) -> dict[str, Any]:
    return st(scan).get("backlog") or {}


def admitted(scan: dict[str, Any]) -> bool:
    return condition(scan, "Admitted").get("status") == "True"


async def test_positions_in_admission_order_with_the_rate_or_the_scans_ahead(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**PLACES)
    first = await create_scan(api, namespace, priority=0)
    await wait_scan(api, namespace, first, admitted)  # an idle backlog: at once; one admission
    older = await create_scan(api, namespace, priority=0)
    mid = await create_scan(api, namespace, priority=5)
    newer = await create_scan(api, namespace, priority=0)
    top = await create_scan(api, namespace, priority=50)
    created_at = time.time()
    expected = [top, mid, older, newer]  # priority first, then arrival

    async def placed() -> list[dict[str, Any]] | None:
        scans = [await get_scan(api, namespace, name) for name in expected]
        return scans if [place(s).get("position") for s in scans] == [1, 2, 3, 4] else None

    scans = await eventually(placed, timeout=30)
    # The first is next of its class and waits for the low-priority interval; the others for it.
    assert [place(s)["waitReason"] for s in scans] == ["Rate", "Priority", "Priority", "Priority"]
    assert {condition(s, "Admitted")["reason"] for s in scans} == {"LowPriorityInterval"}
    # One admission in the last 600 s: each waits 600 s more than the one ahead of it.
    starts = [place(s)["estimatedStart"] for s in scans]
    for position, start in enumerate(starts, 1):
        assert abs(start - (created_at + 600 * position)) < 30, (position, start, created_at)

    table = await api.request("GET", scan_path(namespace), accept=TABLE)
    columns = [c["name"] for c in table["columnDefinitions"]]
    shown = {row["cells"][0]: row["cells"][columns.index("Position")] for row in table["rows"]}
    assert shown == {top: 1, mid: 2, older: 3, newer: 4, first: None}


async def test_a_scan_held_by_the_cap_on_running_scanners_says_quota(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD, **PLACES, SKYSCAN_MAX_RUNNING_SCANNERS="1")
    running = await create_scan(api, namespace, priority=200)
    await wait_scan(api, namespace, running, lambda s: condition(s, "ScannerRunning").get("status") == "True")
    held = await create_scan(api, namespace, priority=200)
    scan = await wait_scan(api, namespace, held, lambda s: place(s).get("waitReason") == "Quota")
    assert place(scan)["position"] == 1 and condition(scan, "Admitted")["reason"] == "ConcurrencyLimit"
    await release_pod(api, namespace, running)
    scan = await wait_scan(api, namespace, held, lambda s: (st(s).get("job") or {}).get("name"))
    assert "backlog" not in st(scan)  # started: off the backlog, its place with it


async def test_a_scan_whose_start_a_wms_outage_interrupted_says_outage(
    api: Kube, namespace: str, restartable_wms: RestartableWMS, operator: OperatorFactory
) -> None:
    wms = restartable_wms
    operator(
        **PLACES,
        SKYSCAN_WMS_ADDRESS=wms.url,
        SKYSCAN_OUTAGE_RETRY_DELAY_SECONDS="2",
        SKYSCAN_OUTAGE_RETRY_MAX_DELAY_SECONDS="4",
    )
    wms.kill()
    name = await create_scan(api, namespace, priority=200)
    scan = await wait_scan(api, namespace, name, lambda s: place(s).get("waitReason") == "Outage")
    assert condition(scan, "Admitted")["reason"] == "WMSUnavailable"
    assert place(scan)["position"] == 1
    # Its own admission is the recent rate (600 s a start), and never before its retry is due.
    interrupted = place(scan)["pendingSince"]
    assert interrupted + 1 <= place(scan)["estimatedStart"] <= time.time() + 600 + 5
    wms.restart()
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("job") or {}).get("name"), timeout=60)
    assert "backlog" not in st(scan)
