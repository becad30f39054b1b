"""Backlog admission on the real API server: priority then age, the two rates, the concurrency cap
and the attempt limit."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from skyscan.io.kube import Kube
from skyscan.names import WORKFLOW_FINALIZER as FINALIZER
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    get_scan,
    release_pod,
    st,
    wait_scan,
    watch_admissions,
)


async def test_priority_then_age_under_a_concurrency_cap(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    low = await create_scan(api, namespace, priority=10)
    high = await create_scan(api, namespace, priority=150)
    mid = await create_scan(api, namespace, priority=120)
    high_later = await create_scan(api, namespace, priority=150)
    admitted: dict[str, float] = {}
    recorder = asyncio.create_task(watch_admissions(api, namespace, admitted))
    operator(**HOLD, SKYSCAN_MAX_RUNNING_SCANNERS="1", SKYSCAN_BACKLOG_TICK_SECONDS="1")
    try:
        expected = [high, high_later, mid, low]
        for i, name in enumerate(expected):
            await wait_scan(
                api, namespace, name, lambda s: condition(s, "ScannerRunning").get("status") == "True"
            )
            assert set(admitted) == set(expected[: i + 1])  # nobody else started meanwhile
            for waiting in expected[i + 1 :]:
                scan = await wait_scan(
                    api,
                    namespace,
                    waiting,
                    lambda s: condition(s, "Admitted").get("reason") == "ConcurrencyLimit",
                )
                assert condition(scan, "Admitted")["message"] == "at most 1 scanners run at once"
                assert scan["status"]["backlog"]["attempts"] == 0
            await release_pod(api, namespace, name)
        assert sorted(admitted, key=admitted.__getitem__) == expected
    finally:
        recorder.cancel()


async def test_high_priority_every_tick_low_priority_once_per_interval(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    lows = [await create_scan(api, namespace, priority=0) for _ in range(3)]
    highs = [await create_scan(api, namespace, priority=100) for _ in range(2)]
    admitted: dict[str, float] = {}
    recorder = asyncio.create_task(watch_admissions(api, namespace, admitted))
    operator(SKYSCAN_BACKLOG_TICK_SECONDS="0.3", SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS="3")
    try:
        await wait_scan(api, namespace, lows[2], lambda s: (st(s).get("job") or {}).get("name"), timeout=30)
        # A low-priority scan waiting for its slot says why.
        reasons = [condition(await get_scan(api, namespace, n), "Admitted").get("reason") for n in lows]
        assert all(r in ("Started", "Admitted") for r in reasons)
    finally:
        recorder.cancel()
    start = min(admitted.values())
    assert max(admitted[h] for h in highs) - start < 3.0  # on consecutive ticks
    gaps = [admitted[b] - admitted[a] for a, b in itertools.pairwise(lows)]
    assert all(gap >= 2.5 for gap in gaps), gaps  # one per 3 s interval
    assert admitted[lows[0]] - start < 3.0  # the queue was idle: the first one starts at once


async def test_low_priority_scan_waiting_says_why(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_BACKLOG_TICK_SECONDS="0.3", SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS="60")
    first = await create_scan(api, namespace, priority=0)
    await wait_scan(api, namespace, first, lambda s: (st(s).get("job") or {}).get("name"))
    second = await create_scan(api, namespace, priority=0)
    scan = await wait_scan(
        api, namespace, second, lambda s: condition(s, "Admitted").get("reason") == "LowPriorityInterval"
    )
    assert "one start per 60s" in condition(scan, "Admitted")["message"]
    assert scan["status"]["backlog"]["attempts"] == 0 and scan["status"]["state"] == "PENDING__PRESTARTUP"


async def test_start_attempts_are_bounded_and_the_failure_is_visible(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """Starts that time out while the WMS and the API server answer (its queues never activate) each
    count; the third fails the scan. (A request the WMS refuses fails it at once: test_real_wms.)"""
    await wms.call("PATCH", "/_sim/config", {"activation_delay": 3600})
    operator(start_timeout_seconds="1", start_retry_delay_seconds="0")
    name = await create_scan(api, namespace, priority=200)

    def settled(s: dict[str, Any]) -> bool:  # failed, and (a write later) its finalizer released
        return condition(s, "Failed").get("status") == "True" and FINALIZER not in (
            s["metadata"].get("finalizers") or []
        )

    scan = await wait_scan(api, namespace, name, settled, timeout=60)
    failed = condition(scan, "Failed")
    assert failed["reason"] == "StartAttemptsExhausted"
    assert "3 start attempts failed" in failed["message"], failed["message"]
    assert scan["status"].get("backlog") is None  # off the backlog, not silently dropped
    workflows = await wms.workflows()
    assert workflows and all(w["deactivated"] for w in workflows)  # none left running
