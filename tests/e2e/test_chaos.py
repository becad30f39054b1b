"""Chaos (issue 10, item 6): while a batch of scans runs through the whole stack, the operator, the shim
and the WMS simulator are SIGKILLed at random moments (seeded, logged) and restarted, and the API
server is killed and restarted once. Afterwards: every scan is terminal, each has at most one Job and
one WMS workflow (exactly one when it ran), no payload ConfigMap is without an owner once the janitor
had its period, and no acknowledged write is lost. On a control plane of its own.

`SKYSCAN_CHAOS_SEED` replays a run."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skyscan.io import kube
from skyscan.io.kube import core_path, scan_path
from skyscan.scan_record import ScanRecord
from skyscan_local import stack as localstack
from tests.e2e.conftest import LONG_NSIDES, Rest, scan_request
from tests.e2e.own_cluster import OwnCluster, own_cluster
from tests.helpers import eventually

SCANS, DELETED = 8, (2, 5)  # launch 8; soft-delete the 3rd and the 6th while they run
KILLED = ("operator", "shim", "wms-simulator")
OPERATOR = {
    "SKYSCAN_OUTAGE_RETRY_DELAY_SECONDS": "0.5",
    "SKYSCAN_OUTAGE_RETRY_MAX_DELAY_SECONDS": "4",
    "SKYSCAN_JANITOR_INTERVAL_SECONDS": "2",
    "SKYSCAN_PAYLOAD_GRACE_SECONDS": "10",
    "SKYSCAN_EVENT_GRACE_SECONDS": "20",
}
JANITOR_PERIOD = 10 + 2 + 5  # grace + interval + slack
COMPLETED = "Attempted to delete a completed scan (must use `delete_completed_scan=True`)"


@pytest.fixture
def own(tmp_path: Path, archive_dsn: str) -> Iterator[OwnCluster]:
    overrides = {
        "operator": OPERATOR,
        # The WMS keeps its workflows across a crash, as the real one does.
        "wms-simulator": {"SKYSCAN_WMS_SIM_STATE_FILE": str(tmp_path / "wms-state.json")},
    }
    with own_cluster(tmp_path, overrides, archive_dsn=archive_dsn) as cluster:
        yield cluster


@pytest.fixture
async def own_rest(own: OwnCluster) -> AsyncIterator[Rest]:
    async with httpx.AsyncClient(base_url=own.stack.url, timeout=10) as http:
        yield Rest(own.stack, http)


def log(began: float, message: str) -> None:
    print(f"[chaos {time.monotonic() - began:6.1f}s] {message}", flush=True)


async def until_answered(rest: Rest, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """Retry while the shim is away or answers 5xx; its first answer below 500."""
    while True:
        try:
            r = await rest.call(method, path, **kwargs)
            if r.status_code < 500:
                return r
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)


async def until_ok(rest: Rest, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """The call, retried through outages; it is acknowledged once it answers 200."""
    r = await until_answered(rest, method, path, **kwargs)
    assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
    return r


@pytest.mark.timeout(420)
async def test_scans_survive_random_kills_of_every_component(own: OwnCluster, own_rest: Rest) -> None:
    rest, stack = own_rest, own.stack
    seed = int(os.environ.get("SKYSCAN_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    began = time.monotonic()
    log(began, f"seed {seed} (SKYSCAN_CHAOS_SEED={seed} replays this schedule)")
    acknowledged: dict[str, int] = {}  # scan id -> its index (in its classifiers)
    deleted: set[str] = set()

    async def launcher() -> None:
        for i in range(SCANS):
            body = scan_request(nsides=LONG_NSIDES, classifiers={"chaos": str(i)})
            r = await until_ok(rest, "POST", "/scan", json=body)
            acknowledged[r.json()["scan_id"]] = i
            log(began, f"POST /scan #{i} acknowledged: {r.json()['scan_id']}")
            if i in DELETED:
                await asyncio.sleep(rng.uniform(1, 4))
                scan_id = r.json()["scan_id"]
                d = await until_answered(rest, "DELETE", f"/scan/{scan_id}", json={})
                if d.status_code == 200:
                    deleted.add(scan_id)
                    log(began, f"DELETE {scan_id} acknowledged")
                else:  # retried through an outage that outlasted the scan: a finished one is kept
                    assert (d.status_code, d.json()["reason"]) == (400, COMPLETED), d.text
                    log(began, f"DELETE {scan_id} refused: the scan finished first")
            await asyncio.sleep(rng.uniform(0.5, 2))

    # One kill of each component and one API-server restart, at random moments of the first 30 s.
    schedule = sorted(
        [(rng.uniform(2, 30), name) for name in KILLED] + [(rng.uniform(4, 25), "kube-apiserver")]
    )
    launching = asyncio.create_task(launcher())
    for at, name in schedule:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - began)))
        down = rng.uniform(0.5, 3) if name != "kube-apiserver" else rng.uniform(5, 10)
        if name == "kube-apiserver":
            log(began, f"SIGKILL kube-apiserver, down {down:.1f}s")
            took = await own.restart_api_server(down, crash=True)  # the launcher goes on meanwhile
            log(began, f"kube-apiserver back after {took:.1f}s")
            continue
        localstack.kill(stack.settings, name)
        log(began, f"SIGKILL {name}, down {down:.1f}s")
        await asyncio.sleep(down)
        localstack.restart(stack.settings, name)  # its ports and settings; blocks until ready
        log(began, f"{name} restarted")
    await asyncio.wait_for(launching, timeout=120)
    assert localstack.status(stack.settings) == dict.fromkeys(
        ["wms-simulator", "shim", "operator", "scanner-simulator"], True
    ), "a component died besides the killed ones"

    async with await kube.connect(stack.kubeconfig) as api:

        async def scans() -> dict[str, dict[str, Any]]:
            listed = await api.request("GET", scan_path(stack.namespace))
            return {s["metadata"]["name"]: s for s in listed["items"]}

        # Every Scan (acknowledged or not: a POST cut by a kill may still have made one) ends.
        async def all_terminal() -> dict[str, dict[str, Any]] | None:
            found = await scans()
            states = {name: (await until_ok(rest, "GET", f"/scan/{name}/status")).json() for name in found}
            waiting = {
                n: (states[n], conditions(found[n])) for n in found if not terminal(found[n], states[n])
            }
            last_waiting.clear()
            last_waiting.update(waiting)
            return None if waiting else found

        last_waiting: dict[str, Any] = {}
        try:
            found = await eventually(all_terminal, timeout=180, interval=1)
        except TimeoutError:
            pytest.fail(f"not terminal (seed {seed}): {json.dumps(last_waiting, indent=1)}")
        log(began, f"all {len(found)} Scans terminal ({len(acknowledged)} acknowledged POSTs)")

        # No acknowledged write lost: each acknowledged POST is its Scan, with what was asked;
        # each acknowledged DELETE shows; every scan not deleted has its final result (the
        # scanner's acknowledged PUTs and PATCHes) or says why it failed.
        assert set(acknowledged) <= set(found)
        for scan_id, i in acknowledged.items():
            got = await until_ok(rest, "GET", f"/scan/{scan_id}/manifest", params={"include_deleted": "true"})
            manifest = got.json()
            assert manifest["classifiers"] == {"chaos": str(i)}
            status = (await until_ok(rest, "GET", f"/scan/{scan_id}/status")).json()
            assert status["is_deleted"] == (scan_id in deleted), (scan_id, status)
            if scan_id not in deleted and failed(found[scan_id]) is None:
                assert status["scan_state"] == "SCAN_HAS_FINAL_RESULT", (scan_id, status)
        failures = {n: failed(s) for n, s in found.items() if failed(s)}
        log(began, f"failed: {failures}")
        # A failure is terminal when it says why (a scanner whose REST calls outlast its retries fails).
        assert all(reason and not reason.startswith("None") for reason in failures.values()), failures

        # One Job and one workflow per scan.
        jobs = (await api.request("GET", kube.path("batch/v1", "jobs", stack.namespace)))["items"]
        job_names = [j["metadata"]["name"] for j in jobs]
        assert len(job_names) == len(set(job_names))
        async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as wms:
            workflows = (await wms.get("/_sim/workflows")).json()["workflows"]
        for name, scan in found.items():
            mine = [w for w in workflows if name in json.dumps(w)]
            assert len(mine) <= 1, f"{name} has {len(mine)} workflows"
            recorded = ((scan.get("status") or {}).get("workflow") or {}).get("id")
            if recorded:
                assert [w["workflow_id"] for w in mine] == [recorded], (name, recorded, mine)
            if name in acknowledged and name not in deleted and name not in failures:
                assert len(mine) == 1, f"{name} ran without exactly one workflow: {mine}"
                assert f"skyscan-{name}" in job_names or (scan["status"].get("job") or {}).get("name")
        log(began, f"{len(workflows)} workflows, {len(job_names)} Jobs for {len(found)} Scans")

        # No payload without an owner once the janitor had its period.

        async def no_ownerless() -> bool:
            maps = await api.request(
                "GET",
                core_path("configmaps", stack.namespace),
                params={"labelSelector": "skyscan.io/payload"},
            )
            ownerless = [
                m["metadata"]["name"] for m in maps["items"] if not m["metadata"].get("ownerReferences")
            ]
            assert not ownerless, f"ownerless payloads: {ownerless}"
            return True

        await eventually(no_ownerless, timeout=JANITOR_PERIOD)
    log(began, "invariants hold")


def conditions(scan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (scan.get("status") or {}).get("conditions") or []}


def failed(scan: dict[str, Any]) -> str | None:
    """`reason: message` of a Failed=True condition."""
    c = conditions(scan).get("Failed") or {}
    return f"{c.get('reason')}: {c.get('message')}" if c.get("status") == "True" else None


def terminal(scan: dict[str, Any], status: dict[str, Any]) -> bool:
    """A final result, a failure that says why, or a soft-deleted scan that holds nothing any more
    (aborted, or deleted before it ever started)."""
    state = str(status["scan_state"])
    if state == "SCAN_HAS_FINAL_RESULT" or failed(scan) is not None or state.startswith("ABORTED"):
        return True
    return bool(status["is_deleted"]) and ScanRecord(scan).is_terminal
