"""Restarts and WMS trouble: one workflow and one Job per scan whatever happens, and a scanner
killed for a transient reason replaced exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from skyscan import names
from skyscan.io import kube
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan_local import control_plane as localcluster
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    HOLD,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    fresh_id,
    get_scan,
    running_scan,
    scan_events,
    scan_pod,
    st,
    wait_scan,
)


async def test_the_scanners_credential_is_on_record_before_its_job_exists(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    """An operator killed right after creating a Job leaves no Pod whose credential the Scan does not
    record (the shim would refuse it as revoked): the status holding it is written first."""
    since = (await api.request("GET", scan_path(namespace)))["metadata"]["resourceVersion"]
    recorded: list[int] = []  # resourceVersions of the Scan holding a credential
    job_made: list[int] = []

    async def follow(path: str, seen: list[int], wanted: Callable[[dict[str, Any]], object]) -> None:
        async for e in api.watch(path, {"resourceVersion": since, "timeoutSeconds": "60"}):
            if e["type"] in ("ADDED", "MODIFIED") and wanted(e["object"]):
                seen.append(int(e["object"]["metadata"]["resourceVersion"]))

    watches = [
        asyncio.create_task(follow(scan_path(namespace), recorded, lambda s: st(s).get("scannerCredential"))),
        asyncio.create_task(follow(kube.path("batch/v1", "jobs", namespace), job_made, lambda _: True)),
    ]

    async def job_seen() -> bool:
        return bool(job_made)

    try:
        operator()
        await create_scan(api, namespace, priority=200)
        await eventually(job_seen, timeout=60)
    finally:
        for w in watches:
            w.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
    assert recorded and min(recorded) < min(job_made)  # one etcd: resourceVersions order the writes


async def test_operator_killed_mid_request_creates_no_second_workflow(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    # The WMS creates the workflow but answers late: the operator dies before it hears the id.
    await wms.call(
        "POST", "/_sim/delays",
        {"seconds": 1.5, "when": "after", "path_prefix": "/v1/workflows", "method": "POST", "count": 1},
    )  # fmt: skip
    first = operator()
    name = await create_scan(api, namespace, priority=200)
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("workflow") or {}).get("requestedAt"))
    await eventually(lambda: _posted(wms))
    first.kill()
    scan = await get_scan(api, namespace, name)
    assert not scan["status"]["workflow"].get("id")  # the answer never arrived
    (workflow,) = await eventually(lambda: wms.workflows(marker=scan["metadata"]["uid"]))

    operator()
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("job") or {}).get("name"), timeout=60)
    assert scan["status"]["workflow"]["id"] == workflow["workflow_id"]  # found, not requested again
    assert len(await wms.workflows(marker=scan["metadata"]["uid"])) == 1
    assert [r for r in await wms.requests() if r == ("POST", "/v1/workflows")] == [("POST", "/v1/workflows")]
    jobs = await api.request("GET", kube.path("batch/v1", "jobs", namespace))
    assert [j["metadata"]["name"] for j in jobs["items"]] == [f"skyscan-{name}"]
    await scan_events(api, namespace, name, "WorkflowRecovered")


async def _posted(wms: Simulator) -> bool:
    return ("POST", "/v1/workflows") in await wms.requests()


async def test_operator_killed_after_starting_restarts_idempotently(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    first = operator(**HOLD)
    names = [await create_scan(api, namespace, priority=200) for _ in range(3)]
    await wait_scan(api, namespace, names[0], lambda s: (st(s).get("workflow") or {}).get("id"))
    first.kill()  # some scans admitted, some mid-way, some queued
    operator(**HOLD)
    for name in names:
        await wait_scan(
            api, namespace, name, lambda s: condition(s, "ScannerRunning").get("status") == "True"
        )
    jobs = await api.request("GET", kube.path("batch/v1", "jobs", namespace))
    assert sorted(j["metadata"]["name"] for j in jobs["items"]) == sorted(f"skyscan-{n}" for n in names)
    for name in names:
        scan = await get_scan(api, namespace, name)
        assert len(await wms.workflows(marker=scan["metadata"]["uid"])) == 1


async def test_wms_5xx_for_a_while_is_retried_and_visible(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    # The next four WMS requests fail: the workflow request (not retried: it is not idempotent), then
    # the look-up that precedes asking again, with both its retries.
    await wms.call("POST", "/_sim/faults", {"status": 503, "count": 4})
    operator(SKYSCAN_MAX_START_ATTEMPTS="6")
    name = await create_scan(api, namespace, priority=200)
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "WMSAvailable").get("status") == "False"
    )
    assert condition(scan, "WMSAvailable")["reason"] == "WMSUnavailable"
    assert "HTTP 503" in condition(scan, "WMSAvailable")["message"]
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("job") or {}).get("name"), timeout=60)
    assert condition(scan, "WMSAvailable")["status"] == "True"
    assert condition(scan, "Failed") == {}
    assert len(await wms.workflows(marker=scan["metadata"]["uid"])) == 1
    assert scan["status"]["job"]["name"] == f"skyscan-{name}"
    await scan_events(api, namespace, name, "WMSError")


async def test_oom_killed_scanner_is_replaced_exactly_once(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    name = await create_scan(
        api, namespace, priority=200, classifiers={"origin": "alert"}, sensorEventId="ev1"
    )
    original = await wait_scan(
        api, namespace, name, lambda s: condition(s, "ScannerRunning").get("status") == "True"
    )
    pod = await scan_pod(api, namespace, name)
    await api.request(
        "PATCH",
        core_path("pods", namespace, pod["metadata"]["name"]),
        body={
            "metadata": {
                "labels": {localcluster.FAIL_LABEL: "true"},
                "annotations": {
                    f"{localcluster.FAIL_LABEL}/reason": "OOMKilled",
                    f"{localcluster.FAIL_LABEL}/exit-code": "137",
                },
            }
        },
        content_type=kube.STRATEGIC_MERGE_PATCH,
    )
    original = await wait_scan(
        api, namespace, name, lambda s: condition(s, "Deleted").get("reason") == "Replaced", timeout=60
    )
    new = original["spec"]["replacedBy"]
    assert original["spec"]["deleted"] is True
    assert original["status"]["job"]["replacement"] == new
    assert original["status"]["job"]["state"] in ("Failed", "Deleted")
    replacement = await wait_scan(
        api, namespace, new, lambda s: condition(s, "ScannerRunning").get("status") == "True", timeout=60
    )
    assert replacement["spec"]["rescanOf"] == name
    assert replacement["spec"]["classifiers"] == {"origin": "alert"}
    assert {k: v for k, v in replacement["spec"].items() if k != "rescanOf"} == {
        k: v for k, v in original["spec"].items() if k not in ("deleted", "replacedBy")
    } | {"deleted": False}
    # The original's workflow was aborted; the replacement has its own.
    (old_workflow,) = await wms.workflows(marker=original["metadata"]["uid"])
    assert old_workflow["deactivated"] == "ABORTED"
    scans = await api.request("GET", scan_path(namespace))
    assert sorted(s["metadata"]["name"] for s in scans["items"]) == sorted([name, new])
    await scan_events(api, namespace, name, "Replacing")
    # The shared sensor event now also belongs to the replacement (it outlives the original).
    event = await api.request("GET", core_path("configmaps", namespace, names.event_object_name("ev1")))
    owners = {o["uid"] for o in event["metadata"]["ownerReferences"]}
    assert owners == {original["metadata"]["uid"], replacement["metadata"]["uid"]}


async def test_a_wms_that_cannot_be_polled_shows_on_running_scans(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(**HOLD)
    name = (await running_scan(api, namespace, priority=200))["metadata"]["name"]
    await wms.call("POST", "/_sim/faults", {"status": 503, "path_prefix": "/v1/query/"})
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "WMSAvailable").get("reason") == "PollFailed"
    )
    assert condition(scan, "WMSAvailable")["status"] == "False"
    assert "503" in condition(scan, "WMSAvailable")["message"]
    assert condition(scan, "ScannerRunning")["status"] == "True"  # the scan itself carries on
    await wms.call("POST", "/_sim/clear", {})
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "WMSAvailable").get("status") == "True"
    )
    assert condition(scan, "WMSAvailable")["reason"] == "Reachable"


async def test_the_scanner_credential_secret_of_someone_else_is_neither_read_nor_taken(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    name = fresh_id()
    secret_name = names.scanner_token_secret_name(name)
    planted = {"metadata": {"name": secret_name}, "stringData": {"token": "planted"}}
    await api.request("POST", core_path("secrets", namespace), body=planted)
    operator(SKYSCAN_MAX_START_ATTEMPTS="1")
    await create_scan(api, namespace, name, priority=200)
    scan = await wait_scan(api, namespace, name, lambda s: condition(s, "Failed").get("status") == "True")
    assert "belongs to someone else" in condition(scan, "Failed")["message"]
    secret = await api.request("GET", core_path("secrets", namespace, planted["metadata"]["name"]))
    assert secret["data"] == {"token": "cGxhbnRlZA=="}  # untouched
    jobs = await api.request("GET", kube.path("batch/v1", "jobs", namespace))
    assert jobs["items"] == []


async def test_a_restart_between_the_credential_secret_and_its_token_adopts_the_secret(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    # As if an earlier pass created the scan's Secret and died before recording the credential.
    name = await create_scan(api, namespace, priority=200)
    scan = await get_scan(api, namespace, name)
    owned = {
        "metadata": {
            "name": names.scanner_token_secret_name(name),
            "ownerReferences": [names.owner_reference(name, scan["metadata"]["uid"])],
        }
    }
    created = await api.request("POST", core_path("secrets", namespace), body=owned)
    operator(**HOLD)
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("job") or {}).get("name"), timeout=60)
    assert scan["status"]["scannerCredential"]["secret"] == created["metadata"]["name"]
    secret = await api.request("GET", core_path("secrets", namespace, created["metadata"]["name"]))
    assert (
        secret["metadata"]["uid"] == created["metadata"]["uid"] and secret["data"]["token"]
    )  # adopted, token written
