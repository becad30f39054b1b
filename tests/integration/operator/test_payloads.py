"""Sensor events and payload objects: no scan starts without its event, a missing one fails the scan
after a grace period, the janitor leaves no payload without an owner, and a shim SIGKILLed in the
middle of launches leaves nothing half-made behind."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import httpx

from api_shim.auth import make_token
from skyscan import names
from skyscan.io import kube, payloads
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    EVENT,
    OperatorFactory,
    Simulator,
    condition,
    create_scan,
    get_scan,
    scan_events,
    st,
    wait_scan,
)
from tests.integration.shim.conftest import scan_body, start_shim_process

EVENT_GRACE = 4.0
JANITOR = {"SKYSCAN_JANITOR_INTERVAL_SECONDS": "0.5", "SKYSCAN_PAYLOAD_GRACE_SECONDS": "2"}


async def event_owners(api: Kube, namespace: str, sensor_event_id: str) -> set[str] | None:
    """The uids owning the stored event, or None when there is no such event."""
    meta = await payloads.event_metadata(api, namespace, sensor_event_id)
    return None if meta is None else {o["uid"] for o in meta.get("ownerReferences") or []}


async def leading(api: Kube, namespace: str) -> bool:
    """Some operator holds this namespace's Lease (it watches Scans a moment later)."""
    try:
        lease = await api.request(
            "GET", kube.path("coordination.k8s.io/v1", "leases", namespace, "skyscan-operator")
        )
    except KubeError:
        return False
    return bool(lease["spec"].get("holderIdentity"))  # raw: Lease


async def test_a_scan_whose_event_never_comes_fails_after_the_grace_period(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_EVENT_GRACE_SECONDS=str(EVENT_GRACE))
    await eventually(lambda: leading(api, namespace), timeout=30)  # the grace runs from the Scan's creation
    name = await create_scan(api, namespace, priority=200, event=False)
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "Admitted").get("reason") == "EventMissing"
    )
    assert condition(scan, "Admitted")["status"] == "False" and condition(scan, "Failed") == {}
    assert f"skyscan-event-{name}" in condition(scan, "Admitted")["message"]
    scan = await wait_scan(
        api, namespace, name, lambda s: condition(s, "Failed").get("reason") == "EventMissing", timeout=30
    )
    failed_at = scan["status"]["conditions"]
    assert condition(scan, "Failed")["status"] == "True"
    assert st(scan).get("backlog") is None and not (st(scan).get("workflow") or {}).get("requestedAt")
    assert await wms.workflows() == []  # nothing was started for it
    assert (await api.request("GET", kube.path("batch/v1", "jobs", namespace)))["items"] == []
    await asyncio.sleep(1)
    assert (await get_scan(api, namespace, name))["status"]["conditions"] == failed_at  # inert


async def test_a_late_event_within_the_grace_period_lets_the_scan_start(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_EVENT_GRACE_SECONDS="30")
    name = await create_scan(api, namespace, priority=200, event=False)
    await wait_scan(api, namespace, name, lambda s: condition(s, "Admitted").get("reason") == "EventMissing")
    scan = await get_scan(api, namespace, name)
    await payloads.create_event(api, namespace, name, EVENT, owners=[scan])
    scan = await wait_scan(api, namespace, name, lambda s: (st(s).get("job") or {}).get("name"), timeout=30)
    assert condition(scan, "Failed") == {}


async def test_the_janitor_removes_ownerless_payloads_and_adopts_used_ones(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    data = payloads.encode({"debris": True}, "event")
    for name in ("skyscan-event-debris", "skyscan-result-0000000000x0"):  # no owner, no Scan names them
        await api.request(
            "POST", core_path("configmaps", namespace), body=payloads.configmap(name, "event", data, [])
        )
    # A kubectl-made event, applied without an owner, and the Scan using it.
    await api.request(
        "POST",
        core_path("configmaps", namespace),
        body=payloads.configmap(names.event_object_name("by-hand"), "event", data, []),
    )
    user = await create_scan(api, namespace, event=False, sensorEventId="by-hand", priority=0)
    unrelated = {"metadata": {"name": "not-a-payload"}, "data": {"k": "v"}}
    await api.request("POST", core_path("configmaps", namespace), body=unrelated)
    operator(**JANITOR, SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS="3600")  # the Scan waits

    async def swept() -> bool:
        listed = await api.request(
            "GET", core_path("configmaps", namespace), params={"labelSelector": names.PAYLOAD_LABEL}
        )
        return {cm["metadata"]["name"] for cm in listed["items"]} == {names.event_object_name("by-hand")}

    await eventually(swept, timeout=30)
    scan = await get_scan(api, namespace, user)
    assert await event_owners(api, namespace, "by-hand") == {scan["metadata"]["uid"]}  # goes with it
    assert condition(scan, "Failed") == {}
    await api.request("GET", core_path("configmaps", namespace, "not-a-payload"))  # not a payload: kept


async def test_a_scan_owns_the_event_stored_for_it_once_the_operator_looks_and_only_a_foreign_one_is_told(
    api: Kube, namespace: str, wms: Simulator, operator: OperatorFactory
) -> None:
    operator(SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS="3600")  # the scans wait in the backlog

    async def owned_by(name: str, event_id: str) -> None:
        uid = (await get_scan(api, namespace, name))["metadata"]["uid"]

        async def owned() -> bool:
            return await event_owners(api, namespace, event_id) == {uid}

        await eventually(owned, timeout=30)

    launched = await create_scan(api, namespace, event=False, priority=0)
    await payloads.create_event(api, namespace, launched, EVENT, stored_for=launched)  # as POST /scan does
    await owned_by(launched, launched)
    by_hand = await create_scan(api, namespace, event=False, sensorEventId="by-hand", priority=0)
    await payloads.create_event(api, namespace, "by-hand", EVENT)  # kubectl-made: no owner, no scan named
    await owned_by(by_hand, "by-hand")
    await scan_events(api, namespace, by_hand, "EventAdopted")
    # Events are posted in order: one about the first adoption would be there by now.
    assert "EventAdopted" not in await scan_events(api, namespace, launched)


async def test_a_shim_killed_amid_launches_leaves_no_debris_and_no_scan_without_its_event(
    api: Kube,
    namespace: str,
    cluster: Cluster,
    wms: Simulator,
    operator: OperatorFactory,
    tmp_path: Path,
) -> None:
    # Low priority, one start an hour: the scans wait in the backlog; only their events matter here.
    waiting = {"SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "3600"}
    operator(**JANITOR, **waiting, SKYSCAN_EVENT_GRACE_SECONDS=str(EVENT_GRACE))
    token_file = tmp_path / "tokens.json"
    headers = {"Authorization": f"Bearer {make_token(token_file, 'chaos', ['user'])}"}
    rounds, per_round = 10, 50  # as the issue asks: 50 concurrent POSTs, the shim SIGKILLed, 10 times
    rng = random.Random(20261123)
    acknowledged: list[str] = []
    for _ in range(rounds):
        process, url = start_shim_process(cluster, namespace, token_file, tmp_path / "shim.log")
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
                await eventually(lambda: _healthy(http), timeout=60)
                posts = [asyncio.create_task(http.post("/scan", json=scan_body())) for _ in range(per_round)]
                await asyncio.sleep(rng.uniform(0.05, 1.0))
                process.send_signal(signal.SIGKILL)
                for reply in await asyncio.gather(*posts, return_exceptions=True):
                    if isinstance(reply, httpx.Response) and reply.status_code == 200:
                        acknowledged.append(reply.json()["scan_id"])
        finally:
            process.kill()
            process.wait(10)

    scans = (await api.request("GET", scan_path(namespace)))["items"]
    assert {s["metadata"]["name"] for s in scans} >= set(acknowledged)
    # An acknowledged POST is a complete scan: its event is stored, now, for it (or owned by it already:
    # the operator makes the scan its owner at its first look, which `settled` waits for below).
    for scan in scans:
        if (name := scan["metadata"]["name"]) in acknowledged:
            meta = await payloads.event_metadata(api, namespace, scan["spec"]["sensorEventId"])
            assert meta is not None
            owners = {o["uid"] for o in meta.get("ownerReferences") or []}
            stored_for = (meta.get("annotations") or {}).get(names.STORED_FOR_ANNOTATION)
            assert scan["metadata"]["uid"] in owners or stored_for == name

    # After the grace periods, every Scan has its event or is Failed/EventMissing, and no payload lacks
    # an owner.
    await asyncio.sleep(EVENT_GRACE + 3)

    async def settled() -> tuple[int, int]:
        complete = missing = 0
        for scan in (await api.request("GET", scan_path(namespace)))["items"]:
            owners = await event_owners(api, namespace, scan["spec"]["sensorEventId"])
            if owners is not None and scan["metadata"]["uid"] in owners:
                assert condition(scan, "Failed") == {}
                complete += 1
            else:
                assert condition(scan, "Failed").get("reason") == "EventMissing", scan["metadata"]["name"]
                missing += 1
        listed = await api.request(
            "GET", core_path("configmaps", namespace), params={"labelSelector": names.PAYLOAD_LABEL}
        )
        assert [
            cm["metadata"]["name"] for cm in listed["items"] if not cm["metadata"].get("ownerReferences")
        ] == []
        return complete, missing

    complete, missing = await eventually(settled, timeout=30)
    print(
        f"{rounds} SIGKILLs amid {per_round} concurrent POSTs: {len(acknowledged)} acknowledged, "
        f"{complete} scans complete, {missing} Failed/EventMissing, 0 payloads without an owner"
    )
    assert complete >= len(acknowledged)


async def _healthy(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False
