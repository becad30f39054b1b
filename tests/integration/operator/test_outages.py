"""Outages and quota refusals never consume start attempts: the scan waits in the backlog with the
reason on `Admitted`, backs off, and starts once the WMS or the quota lets it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from api_shim import view
from skyscan.io import kube
from skyscan.io.kube import Kube, core_path, scan_path
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    OperatorFactory,
    RestartableWMS,
    condition,
    create_scan,
    get_scan,
    st,
    wait_scan,
)

BACKOFF = {"SKYSCAN_OUTAGE_RETRY_DELAY_SECONDS": "0.5", "SKYSCAN_OUTAGE_RETRY_MAX_DELAY_SECONDS": "4"}
# The outage outlasts the start timeout (time in an outage must not count toward it) and the backoff's
# cap several times over; the timeout is shortened from the suite's 30 s so the outage can be too.
START_TIMEOUT = 10
OUTAGE_SECONDS = 25


def has_job(scan: dict[str, Any]) -> bool:
    return bool((st(scan).get("job") or {}).get("name"))


async def test_a_wms_outage_while_scans_are_admitted_fails_none(
    api: Kube, namespace: str, restartable_wms: RestartableWMS, operator: OperatorFactory
) -> None:
    wms = restartable_wms
    # One attempt only: any outage counted as an attempt would fail the scan at once.
    operator(
        **BACKOFF,
        SKYSCAN_WMS_ADDRESS=wms.url,
        SKYSCAN_MAX_START_ATTEMPTS="1",
        SKYSCAN_START_TIMEOUT_SECONDS=str(START_TIMEOUT),
    )
    names = [await create_scan(api, namespace, priority=200) for _ in range(10)]
    # The backlog admits one per tick: kill the WMS once the first scans have their workflow.
    await wait_scan(api, namespace, names[1], lambda s: (st(s).get("workflow") or {}).get("id"))
    wms.kill()
    down_at = time.monotonic()

    # While it is down, waiting scans say why, keep their attempt, and stay on the backlog.
    async def interrupted() -> dict[str, Any] | None:
        for name in names:
            scan = await get_scan(api, namespace, name)
            if condition(scan, "Admitted").get("reason") == "WMSUnavailable":
                return scan
        return None

    waiting = await eventually(interrupted, timeout=30)
    assert waiting is not None
    admitted = condition(waiting, "Admitted")
    assert admitted["status"] == "False" and "not counted as a start attempt" in admitted["message"]
    assert waiting["status"]["backlog"]["attempts"] == 0
    assert waiting["status"]["backlog"]["interruptions"] >= 1
    entry = view.backlog_entry(waiting)
    assert entry is not None and entry["next_attempt"] == 0  # GET /scans/backlog shows it waiting
    await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
    for name in names:
        scan = await get_scan(api, namespace, name)
        assert condition(scan, "Failed") == {}, condition(scan, "Failed")
    wms.restart()
    back_at = time.monotonic()

    # Back: every scan starts (within the bounded backoff), runs, and completes.
    for name in names:
        await wait_scan(api, namespace, name, has_job, timeout=60)
    print(f"all {len(names)} scans had their Job {time.monotonic() - back_at:.1f}s after the WMS returned")
    for name in names:
        await api.request(
            "PATCH",
            scan_path(namespace, name, "status"),
            body={"status": {"result": {"isFinal": True, "updatedAt": time.time()}}},
            content_type="application/merge-patch+json",
        )
    for name in names:
        scan = await wait_scan(
            api,
            namespace,
            name,
            lambda s: (st(s).get("workflow") or {}).get("deactivated") == "FINISHED",
            timeout=60,
        )
        assert condition(scan, "Complete")["status"] == "True" and condition(scan, "Failed") == {}
        assert scan["status"]["state"] == "SCAN_HAS_FINAL_RESULT"
        assert len(await wms.workflows(marker=scan["metadata"]["uid"])) == 1  # one workflow per scan
    jobs = await api.request("GET", kube.path("batch/v1", "jobs", namespace))
    assert sorted(j["metadata"]["name"] for j in jobs["items"]) == sorted(f"skyscan-{n}" for n in names)


async def test_a_quota_refusing_the_job_holds_the_scan_without_consuming_attempts(
    api: Kube, namespace: str, wms: object, operator: OperatorFactory
) -> None:
    quota = {"metadata": {"name": "no-jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}}
    await api.request("POST", core_path("resourcequotas", namespace), body=quota)
    operator(**BACKOFF, SKYSCAN_MAX_START_ATTEMPTS="1")
    name = await create_scan(api, namespace, priority=200)
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "Admitted").get("reason") == "QuotaExceeded"
    )
    assert "quota" in condition(scan, "Admitted")["message"]
    # It keeps trying, backing off, and never spends its one attempt.
    scan = await wait_scan(
        api, namespace, name, lambda s: (st(s).get("backlog") or {}).get("interruptions", 0) >= 3
    )
    assert scan["status"]["backlog"]["attempts"] == 0 and condition(scan, "Failed") == {}
    assert condition(scan, "WorkflowReady")["status"] == "True"  # everything else is ready
    assert (await api.request("GET", kube.path("batch/v1", "jobs", namespace)))["items"] == []

    await api.request("DELETE", core_path("resourcequotas", namespace, "no-jobs"))
    scan = await wait_scan(api, namespace, name, has_job, timeout=30)
    assert condition(scan, "Admitted")["reason"] == "Started" and condition(scan, "Failed") == {}
