"""A standby operator (issue 12, item 3): two real operator processes, one Lease. The standby does
nothing while the holder renews; it takes over at once when the holder lets go (SIGTERM), within
15 s when the holder is SIGKILLed in the middle of 20 scans (measured), and every scan still gets
exactly one Job and one WMS workflow and completes. A holder whose Lease is taken ends at once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from skyscan.io import kube
from skyscan_local import processes
from skyscan_local import stack as localstack
from skyscan_operator.leader import EXIT_LEASE_LOST
from skyscan_operator.lease import API_VERSION
from tests.conftest import Cluster
from tests.e2e.conftest import REPO, Rest
from tests.e2e.own_cluster import OwnCluster, own_cluster
from tests.helpers import eventually

OPERATOR = [sys.executable, "-m", "skyscan_operator.handlers"]
LEASE = "skyscan-operator"
# The operator's defaults, over the local stack's longer Lease: what a deployment gets.
TIMING = {"SKYSCAN_LEASE_DURATION_SECONDS": "8", "SKYSCAN_LEASE_RENEW_SECONDS": "2"}
TAKEOVER_LIMIT = 15.0  # seconds from the holder's SIGKILL until the standby acts
SCANS = 20
SMALL = {"8": 0, "64": 0}


@dataclass
class Replica:
    identity: str
    proc: subprocess.Popen[bytes]
    health_url: str
    metrics_url: str
    log: Path

    async def scrape(self, http: httpx.AsyncClient) -> dict[str, float]:
        """Each family's samples summed over their labels (`name_total`, `name_count`, ...)."""
        sums: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families((await http.get(self.metrics_url)).text):
            for sample in family.samples:
                sums[sample.name] += sample.value
        return sums

    def stop(self) -> None:
        processes.stop([processes.Recorded(self.proc.pid, tuple(OPERATOR))], timeout=15)


def start_replica(identity: str, env: dict[str, str], logs: Path) -> Replica:
    """One more operator process with `env`, on ports of its own; returns once its liveness endpoint
    answers (a standby's does at once)."""
    health, port = processes.free_port(), processes.free_port()
    env = env | {
        "SKYSCAN_LEASE_IDENTITY": identity,
        "SKYSCAN_LIVENESS_ENDPOINT": f"http://127.0.0.1:{health}/healthz",
        "SKYSCAN_METRICS_PORT": str(port),
    }
    log = logs / f"operator-{identity}.log"
    proc = processes.spawn(OPERATOR, log, env=env, tie_to_parent=True)
    processes.wait_until(
        localstack.http_ok(f"http://127.0.0.1:{health}/healthz"), identity, 60, proc=proc, log=log
    )
    return Replica(identity, proc, env["SKYSCAN_LIVENESS_ENDPOINT"], f"http://127.0.0.1:{port}/metrics", log)


async def holder(api: kube.Kube, namespace: str) -> str:
    found = await api.request("GET", kube.path(API_VERSION, "leases", namespace, LEASE))
    return str(found["spec"].get("holderIdentity") or "")


async def held_by(api: kube.Kube, namespace: str, identity: str) -> bool:
    return await holder(api, namespace) == identity


async def jobs(api: kube.Kube, namespace: str) -> list[str]:
    listed = await api.request("GET", kube.path("batch/v1", "jobs", namespace))
    return [j["metadata"]["name"] for j in listed["items"]]


async def jobs_at_least(api: kube.Kube, namespace: str, count: int) -> bool:
    return len(await jobs(api, namespace)) >= count


async def acting(replica: Replica, http: httpx.AsyncClient) -> bool:
    """It holds the Lease (its gauge says so) and has reconciled a scan since."""
    try:
        got = await replica.scrape(http)
    except httpx.HTTPError:  # between the standby's endpoint and the controller's
        return False
    return (
        got["skyscan_operator_leader"] == 1 and got["skyscan_operator_reconcile_duration_seconds_count"] > 0
    )


async def answer(http: httpx.AsyncClient, url: str) -> str:
    """The body of a 200 answer; "" for anything else (nothing listening yet included)."""
    try:
        got = await http.get(url)
    except httpx.HTTPError:
        return ""
    return got.text if got.status_code == 200 else ""


async def exit_code(replica: Replica, timeout: float) -> int:
    return await asyncio.to_thread(replica.proc.wait, timeout)


# --- a standby, a clean hand-over, a lost Lease: two operators on the session cluster, no WMS ---


@pytest.mark.timeout(150)
async def test_a_standby_does_nothing_until_the_holder_lets_go_and_a_holder_that_loses_the_lease_ends(
    cluster: Cluster, namespace: str, api: kube.Kube, tmp_path: Path
) -> None:
    env = {
        "SKYSCAN_KUBECONFIG": cluster.kubeconfig,
        "SKYSCAN_NAMESPACE": namespace,
        "SKYSCAN_BACKLOG_TICK_SECONDS": "0.3",
        "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",
        "SKYSCAN_TAGS": '["4.2.0"]',  # examples/scan.yaml's: else the operator fails it (InvalidSpec)
        **TIMING,
    }
    a = await asyncio.to_thread(start_replica, "a", env, tmp_path)
    replicas = [a]
    try:
        await eventually(lambda: held_by(api, namespace, "a"), timeout=20)
        b = await asyncio.to_thread(start_replica, "b", env, tmp_path)
        replicas.append(b)
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await b.scrape(http))["skyscan_operator_leader"] == 0
            assert "standby" in await answer(http, b.health_url)  # its own liveness endpoint, not kopf's
            # A Scan made with kubectl (no WMS: it waits in the backlog): the holder reconciles it.
            for doc in yaml.safe_load_all((REPO / "examples" / "scan.yaml").read_text()):
                where = (
                    kube.core_path("configmaps", namespace)
                    if doc["kind"] == "ConfigMap"
                    else kube.scan_path(namespace)
                )
                await api.request("POST", where, body=doc)
            await eventually(lambda: acting(a, http), timeout=30)
            # Three of the standby's reads of the Lease: it does nothing, the holder keeps renewing.
            until = time.monotonic() + 3 * float(TIMING["SKYSCAN_LEASE_RENEW_SECONDS"])
            while time.monotonic() < until:
                got = await b.scrape(http)
                assert got["skyscan_operator_leader"] == 0
                assert got["skyscan_operator_reconcile_duration_seconds_count"] == 0
                assert got["skyscan_operator_admissions_total"] == 0
                assert await holder(api, namespace) == "a"
                await asyncio.sleep(0.5)
            assert "standing by for Lease" in b.log.read_text()

            # SIGTERM: the holder stops, releases the Lease, and the standby takes it on its next read.
            began = time.monotonic()
            a.proc.send_signal(signal.SIGTERM)
            await eventually(lambda: acting(b, http), timeout=15, interval=0.1)
            handover = time.monotonic() - began
            print(f"clean hand-over: the standby acted {handover:.1f}s after SIGTERM")
            assert await exit_code(a, 15) == 0
            assert "released Lease" in a.log.read_text()
            assert await holder(api, namespace) == "b"
            assert "standby" not in await eventually(lambda: answer(http, b.health_url))  # kopf's now
            assert handover < float(TIMING["SKYSCAN_LEASE_RENEW_SECONDS"]) + 5  # a read, and the start

            # Another holder in the Lease (as if b had stalled past its deadline): b ends at once.
            path = kube.path(API_VERSION, "leases", namespace, LEASE)
            taken = await api.request("GET", path)
            taken["spec"]["holderIdentity"] = "intruder"
            await api.request("PUT", path, body=taken)
            assert await exit_code(b, 2 * float(TIMING["SKYSCAN_LEASE_RENEW_SECONDS"]) + 3) == EXIT_LEASE_LOST
            assert "lost the operator's Lease (now held by intruder)" in b.log.read_text()
    finally:
        for replica in replicas:
            replica.stop()
            print(f"--- {replica.log.name} ---\n{processes.tail(replica.log, 3000)}")


# --- SIGKILL of the holder while 20 scans run on the whole stack ---


@pytest.fixture
def own(tmp_path: Path, archive_dsn: str) -> Iterator[OwnCluster]:
    overrides = {
        "operator": TIMING | {"SKYSCAN_LEASE_IDENTITY": "a"},
        "scanner-simulator": {"SKYSCAN_SCANNER_SIM_BATCHES_PER_NSIDE": "1"},  # fewer reports: quicker
    }
    with own_cluster(tmp_path, overrides, archive_dsn=archive_dsn) as cluster:
        yield cluster


@pytest.fixture
def standby(own: OwnCluster) -> Iterator[Replica]:
    """A second operator exactly as the stack runs its own, under another name."""
    settings = own.stack.settings
    state = localstack.load_state(settings.dir)
    (operator,) = [c for c in localstack.components(settings, state) if c.name == "operator"]
    replica = start_replica("b", operator.env, settings.dir / "logs")
    try:
        yield replica
    finally:
        replica.stop()
        print(f"--- {replica.log.name} ---\n{processes.tail(replica.log, 4000)}")


@pytest.mark.timeout(300)
async def test_the_standby_takes_over_within_15s_of_a_sigkill_and_every_scan_completes_once(
    own: OwnCluster, own_rest: Rest, standby: Replica
) -> None:
    rest, stack = own_rest, own.stack
    async with await kube.connect(stack.kubeconfig) as api, httpx.AsyncClient(timeout=5) as http:
        assert await holder(api, stack.namespace) == "a"
        assert (await standby.scrape(http))["skyscan_operator_leader"] == 0
        # Small skies (768 pixels, then a few), so that 20 scans finish quickly on the simulator.
        launches = [rest.launch(nsides=SMALL, classifiers={"standby": str(i)}) for i in range(SCANS)]
        scans = await asyncio.gather(*launches)
        # The holder admits one scan per backlog tick: kill it once it has started some.
        await eventually(lambda: jobs_at_least(api, stack.namespace, 8), timeout=60, interval=0.2)
        assert (await standby.scrape(http))["skyscan_operator_reconcile_duration_seconds_count"] == 0

        started = len(await jobs(api, stack.namespace))
        assert started < SCANS  # the rest is the standby's to start
        began = time.monotonic()
        localstack.kill(stack.settings, "operator")  # SIGKILL: no release, the Lease must expire
        await eventually(lambda: held_by(api, stack.namespace, "b"), timeout=30, interval=0.1)
        lease_moved = time.monotonic() - began
        await eventually(lambda: acting(standby, http), timeout=30, interval=0.1)
        acted = time.monotonic() - began
        print(
            f"SIGKILL to takeover: Lease held by the standby after {lease_moved:.1f}s, "
            f"acting after {acted:.1f}s"
        )
        assert acted < TAKEOVER_LIMIT

        async def all_final() -> bool:
            states = {s: (await rest.status(s))["scan_state"] for s in scans}
            unfinished.clear()
            unfinished.update({s: state for s, state in states.items() if state != "SCAN_HAS_FINAL_RESULT"})
            return not unfinished

        unfinished: dict[str, str] = {}
        try:
            await eventually(all_final, timeout=150, interval=1)
        except TimeoutError:
            pytest.fail(f"unfinished: {unfinished}")
        print(
            f"{started} of {SCANS} had a Job at the kill; all final {time.monotonic() - began:.1f}s after it"
        )

        assert sorted(await jobs(api, stack.namespace)) == sorted(f"skyscan-{s}" for s in scans)
        async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as wms:
            workflows = (await wms.get("/_sim/workflows")).json()["workflows"]
        for scan_id in scans:
            mine = [w["workflow_id"] for w in workflows if scan_id in json.dumps(w)]
            scan = await api.request("GET", kube.scan_path(stack.namespace, scan_id))
            assert mine == [scan["status"]["workflow"]["id"]], (scan_id, mine)
