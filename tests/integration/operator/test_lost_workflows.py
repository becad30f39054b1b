"""A WMS that comes back without its workflows (SIGKILLed, restarted with no data): the operator notices
the workflows it no longer lists and retries or ends their scans by the start-attempt and replacement
rules: no scan waits for workers that will not come longer than the start timeout."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from skyscan.io.kube import Kube, core_path, scan_path
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    RestartableWMS,
    condition,
    create_scan,
    scan_events,
    st,
)

START_TIMEOUT = 10.0
# Past the start timeout: the loss noticed (two polls of 0.5 s) and the replacements started.
SETTLING = 20.0
SCANS = 8
DOWN_SECONDS = 5


def workflow_id(scan: dict[str, Any]) -> str | None:
    return (st(scan).get("workflow") or {}).get("id")


def ended(scan: dict[str, Any]) -> bool:
    return (
        condition(scan, "Failed").get("status") == "True"
        or condition(scan, "Deleted").get("status") == "True"
    )


async def event_messages(api: Kube, namespace: str, name: str, reason: str) -> list[str]:
    selector = {"fieldSelector": f"involvedObject.name={name},reason={reason}"}
    return [
        e["message"]
        for e in (await api.request("GET", core_path("events", namespace), params=selector))["items"]
    ]


def settled(scan: dict[str, Any], known: set[str]) -> bool:
    """Ended, or running again (its Job) on a workflow the WMS knows."""
    if ended(scan):
        return not (workflow_id(scan) and not (st(scan).get("workflow") or {}).get("deactivated"))
    return workflow_id(scan) in known and bool((st(scan).get("job") or {}).get("name"))


async def test_scans_whose_workflows_the_wms_lost_are_retried_or_ended_within_the_start_timeout(
    api: Kube, namespace: str, restartable_wms: RestartableWMS, operator: OperatorFactory
) -> None:
    wms = restartable_wms
    operator(**HOLD, SKYSCAN_WMS_ADDRESS=wms.url, SKYSCAN_START_TIMEOUT_SECONDS=f"{START_TIMEOUT:g}")
    names = [await create_scan(api, namespace, priority=200) for _ in range(SCANS)]

    async def half_started() -> bool:
        listed = (await api.request("GET", scan_path(namespace)))["items"]
        return sum(bool((st(s).get("job") or {}).get("name")) for s in listed) >= SCANS // 2

    assert await eventually(half_started, timeout=60)
    lost = {w["workflow_id"] for w in await wms.workflows()}
    wms.kill()
    wms.state_file.unlink(missing_ok=True)  # it comes back knowing none of them
    had = {
        s["metadata"]["name"]: workflow_id(s)
        for s in (await api.request("GET", scan_path(namespace)))["items"]
    }
    await asyncio.sleep(DOWN_SECONDS)  # the outage itself
    wms.restart()
    back_at = time.monotonic()

    # kubectl describe says why a started scan waits, and until when, while its scanner may still report.
    async def told() -> str | None:
        listed = (await api.request("GET", scan_path(namespace)))["items"]
        shown = [condition(s, "WorkflowReady") for s in listed]
        return next((c["message"] for c in shown if c.get("reason") == "WorkflowLost"), None)

    message = await eventually(told, timeout=START_TIMEOUT, interval=0.2)
    assert message is not None and "no longer knows workflow" in message and "rescanned at" in message

    async def all_settled() -> list[dict[str, Any]] | None:
        known = {w["workflow_id"] for w in await wms.workflows()}
        listed = (await api.request("GET", scan_path(namespace)))["items"]
        return listed if all(settled(s, known) for s in listed) else None

    listed = await eventually(all_settled, timeout=START_TIMEOUT + SETTLING, interval=0.5)
    took = time.monotonic() - back_at
    assert listed is not None, "some scan still waits on a workflow the WMS no longer knows"

    by_name = {s["metadata"]["name"]: s for s in listed}
    outcomes: Counter[str] = Counter()
    for name in names:
        scan = by_name[name]
        if scan["spec"].get("replacedBy"):
            outcomes["replaced"] += 1
            assert condition(scan, "Deleted")["reason"] == "Replaced"
            assert st(scan)["workflow"]["deactivated"] == "ABORTED"  # the abort's 404: it is gone
            assert st(scan)["state"].startswith("ABORTED__")
            assert by_name[scan["spec"]["replacedBy"]]["spec"]["rescanOf"] == name
        elif condition(scan, "Failed").get("status") == "True":
            outcomes["failed"] += 1
            assert condition(scan, "Failed")["reason"] == "WorkflowLost", condition(scan, "Failed")
        else:
            outcomes["restarted"] += 1
            assert workflow_id(scan) not in lost  # a new workflow, requested after the loss
        if had[name] in lost:  # why is on record: the replacement's or the lost workflow's Event
            reasons = await scan_events(api, namespace, name)
            assert {"Replacing", "WorkflowLost"} & set(reasons), reasons
            if outcomes["replaced"] and scan["spec"].get("replacedBy"):
                assert any(had[name] in m for m in await event_messages(api, namespace, name, "Replacing"))
    assert outcomes["replaced"] + outcomes["restarted"] + outcomes["failed"] == SCANS
    assert outcomes["replaced"] >= 1  # the started ones were rescanned

    # The operator did not hammer the WMS about the lost workflows: each costs a handful of calls.
    about_lost = [p for _, p in await wms.requests() if any(wf in p for wf in lost)]
    assert len(about_lost) <= 6 * len(lost), about_lost
    print(
        f"{len(lost)} workflows lost; {dict(outcomes)}; all settled {took:.1f}s after the WMS returned; "
        f"{len(about_lost)} calls about lost workflows"
    )
