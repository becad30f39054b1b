"""What Flux (kstatus) and Argo CD (manifests/argocd/health.lua) make of real Scans driven into each
state by the real operator, read back from the API server: Progressing/InProgress while waiting,
starting or running, Healthy/Current with a final result or once a soft delete's abort is done,
Degraded/Failed when failed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from skyscan.io.kube import Kube, scan_path
from skyscan.io.kube_errors import KubeError
from tests.gitops import argocd_health, kstatus
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    running_scan,
    wait_scan,
)

MERGE = "application/merge-patch+json"


def verdict(scan: dict[str, Any]) -> tuple[str, str, str]:
    """(kstatus, Argo CD health, Argo CD's message)."""
    return kstatus(scan), *argocd_health(scan)


def summary_is(type_: str, reason: str | None = None) -> Any:
    """A check that the summary condition `type_` holds (with `reason`) for the latest generation."""

    def check(scan: dict[str, Any]) -> bool:
        c = condition(scan, type_)
        seen = (scan.get("status") or {}).get("observedGeneration") == scan["metadata"]["generation"]
        return seen and c.get("status") == "True" and reason in (None, c.get("reason"))

    return check


async def record(api: Kube, namespace: str, into: list[dict[str, Any]]) -> asyncio.Task[None]:
    """Every version of every Scan in the namespace from now on, as a watch delivers them."""
    listed = await api.request("GET", scan_path(namespace))

    async def follow(version: str) -> None:
        while True:
            try:
                async for event in api.watch(
                    scan_path(namespace), {"resourceVersion": version, "timeoutSeconds": 120}
                ):
                    into.append(event["object"])
                    version = event["object"]["metadata"]["resourceVersion"]
            except KubeError:
                await asyncio.sleep(0.2)

    return asyncio.create_task(follow(listed["metadata"]["resourceVersion"]))


async def test_a_scan_is_progressing_until_its_final_result_then_healthy(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    snapshots: list[dict[str, Any]] = []
    recorder = await record(api, namespace, snapshots)  # from before the scan exists
    scan = await running_scan(api, namespace)
    name = scan["metadata"]["name"]
    assert verdict(scan) == (
        "InProgress",
        "Progressing",
        f"Running: {condition(scan, 'ScannerRunning')['message']}",
    )

    # As the shim records the scanner's final result.
    final = {"status": {"result": {"isFinal": True, "updatedAt": time.time()}}}
    await api.request("PATCH", scan_path(namespace, name, "status"), body=final, content_type=MERGE)
    scan = await wait_scan(api, namespace, name, summary_is("Ready", "FinalResult"))
    assert verdict(scan) == ("Current", "Healthy", "FinalResult: the scanner recorded its final result")
    assert condition(scan, "Complete")["status"] == "True"
    recorder.cancel()
    await asyncio.gather(recorder, return_exceptions=True)

    # Every version the API server held on the way: waiting and starting were Progressing as well,
    # and the two tools never disagreed.
    seen: dict[str, str] = {}
    for snapshot in snapshots:
        if snapshot["metadata"]["name"] == name and (snapshot.get("status") or {}).get("conditions"):
            flux, argo, message = verdict(snapshot)
            assert (flux, argo) in {("InProgress", "Progressing"), ("Current", "Healthy")}, message
            seen.setdefault(message.split(":", 1)[0], argo)
    assert seen == {"Waiting": "Progressing", "Starting": "Progressing", "Running": "Progressing",
                    "FinalResult": "Healthy"}  # fmt: skip


async def test_a_scan_held_in_the_backlog_is_progressing_and_a_failed_one_degraded(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD, SKYSCAN_MAX_RUNNING_SCANNERS="1", SKYSCAN_EVENT_GRACE_SECONDS="3")
    await running_scan(api, namespace)  # takes the one slot
    held = await create_scan(api, namespace)
    scan = await wait_scan(
        api, namespace, held, lambda s: condition(s, "Admitted").get("reason") == "ConcurrencyLimit"
    )
    flux, argo, message = verdict(scan)
    assert (flux, argo) == ("InProgress", "Progressing")
    assert message == f"Waiting: {condition(scan, 'Admitted')['message']}"

    failed = await create_scan(api, namespace, event=False)  # its sensor event never comes
    scan = await wait_scan(api, namespace, failed, summary_is("Stalled", "EventMissing"))
    flux, argo, message = verdict(scan)
    assert (flux, argo) == ("Failed", "Degraded") and message.startswith("EventMissing: its sensor event")
    assert condition(scan, "Failed")["status"] == "True"


async def test_soft_deleted_and_replaced_scans_are_healthy_once_their_abort_is_done(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    deleted, replaced = await asyncio.gather(running_scan(api, namespace), running_scan(api, namespace))
    marks = [({"deleted": True}, "SoftDeleted: deleted"),
             ({"deleted": True, "replacedBy": "s2"}, "Replaced: replaced by scan s2")]  # fmt: skip
    for scan, (spec, healthy) in zip((deleted, replaced), marks, strict=True):
        name = scan["metadata"]["name"]
        patched = await api.request(
            "PATCH", scan_path(namespace, name), body={"spec": spec}, content_type=MERGE
        )
        # The API server's answer to the change: a generation the operator has not seen yet.
        assert patched["metadata"]["generation"] == 2 and patched["status"]["observedGeneration"] == 1
        assert verdict(patched) == (
            "InProgress", "Progressing", "the Skyscan operator has not seen the latest change yet"
        )  # fmt: skip
        scan = await wait_scan(api, namespace, name, summary_is("Ready"))
        assert verdict(scan) == ("Current", "Healthy", healthy)
        assert scan["status"]["workflow"]["deactivated"] == "ABORTED"
        assert scan["status"]["job"]["state"] in ("Deleted", "Succeeded", "Failed")
