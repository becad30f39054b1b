"""Operator benchmark (not a test): admission latency and memory with many Scans.

    SKYSCAN_K8S_BIN_READY=~/.cache/skyscan/k8s/v1.33.13 .venv/bin/python tools/bench/operator_bench.py

Starts a local control plane (or uses --kubeconfig), the WMS simulator and the operator as real
processes, then measures:
1. latency: Scan created -> Job created, for --latency-scans scans created one after another
   (median and p90; the backlog tick, the WMS queue activation delay and the queue poll interval
   are printed with the result since they dominate it);
2. memory: the operator's RSS once --scans Scans exist and each has been reconciled (they wait in
   the backlog: low priority, one start per interval), and how long reconciling them took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from skyscan import install, kube, model, payloads
from skyscan.model import new_scan_id
from skyscan_local import control_plane as localcluster

SCAN = kube.SCAN_RESOURCE
SPEC = {
    "dockerTag": "4.1.2",
    "recoAlgo": "millipede_wilks",
    "sensorEventId": "ev1",
    "nsides": {"8": 0},
    "realOrSimulatedEvent": "real",
    "maxPixelRecoTime": 600,
    "requestClusters": [{"location": "osg", "nWorkers": 10}],
}
TIMERS = {
    "SKYSCAN_BACKLOG_TICK_SECONDS": "1",
    "SKYSCAN_QUEUE_POLL_SECONDS": "0.5",
    "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "5",
    "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "3600",
}
ACTIVATION_DELAY = "0.5"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def body(name: str, priority: int) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": "Scan", "metadata": {"name": name},
            "spec": {**SPEC, "sensorEventId": name, "priority": priority}}  # fmt: skip


EVENT = payloads.encode({"value": {"data": {"run_id": 1, "event_id": 2}}}, "event")


async def create(api: client.ApiClient, ns: str, name: str, priority: int) -> None:
    """A Scan and its sensor event, owned by it, as `POST /scan` writes them."""
    scan = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        **SCAN, namespace=ns, body=body(name, priority)
    )
    await payloads.create_event(api, ns, name, EVENT, owners=[scan])


async def wait(probe: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := await probe():
            return result
        await asyncio.sleep(interval)
    raise TimeoutError


async def latency(api: client.ApiClient, ns: str, n: int) -> list[float]:
    batch = client.BatchV1Api(api)
    took = []
    for _ in range(n):
        name = new_scan_id(time.time(), secrets.token_hex(10))
        start = time.monotonic()
        await create(api, ns, name, 100)

        async def job(name: str = name) -> bool:
            jobs = await batch.list_namespaced_job(ns, label_selector=f"skyscan.io/scan-id={name}")
            return bool(jobs.items)

        await wait(job, 60)
        took.append(time.monotonic() - start)
    return took


async def many(api: client.ApiClient, ns: str, n: int) -> float:
    objs = client.CustomObjectsApi(api)
    gate = asyncio.Semaphore(20)
    start = time.monotonic()

    async def one(i: int) -> None:
        async with gate:
            name = new_scan_id(time.time(), secrets.token_hex(10))
            await create(api, ns, name, 0)

    await asyncio.gather(*(one(i) for i in range(n)))

    async def all_reconciled() -> bool:
        listed = await objs.list_namespaced_custom_object(**SCAN, namespace=ns)
        done = [s for s in listed["items"] if (s.get("status") or {}).get("observedGeneration")]
        return len(done) >= n

    await wait(all_reconciled, 600, interval=1)
    return time.monotonic() - start


async def run(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.api_client(kubeconfig)
    async with api:
        await install.install(kubeconfig)
        core = client.CoreV1Api(api)
        ns = f"bench-{secrets.token_hex(3)}"
        await core.create_namespace({"metadata": {"name": ns}})
        await wait(lambda: _sa(core, ns), 30)
        sim_args = ["-m", "skyscan_local.wms_simulator", "--port", "0"]
        sim_args += ["--activation-delay", ACTIVATION_DELAY]
        sim = await asyncio.create_subprocess_exec(sys.executable, *sim_args, stdout=asyncio.subprocess.PIPE)
        assert sim.stdout is not None
        wms_url = (await sim.stdout.readline()).decode().strip().rsplit(" ", 1)[-1]
        env = {
            **os.environ,
            **TIMERS,
            "SKYSCAN_KUBECONFIG": kubeconfig,
            "SKYSCAN_NAMESPACE": ns,
            "SKYSCAN_WMS_ADDRESS": wms_url,
            "SKYSCAN_LOG_LEVEL": "WARNING",
        }
        operator = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "skyscan_operator.handlers", env=env
        )
        try:
            await asyncio.sleep(2)  # kopf login and first listing
            idle_rss = rss_mib(operator.pid)
            took = await latency(api, ns, args.latency_scans)
            reconcile_seconds = await many(api, ns, args.scans)
            rss = rss_mib(operator.pid)
            await asyncio.sleep(5)  # a few backlog ticks and polls with everything present
            rss_later = rss_mib(operator.pid)
        finally:
            operator.terminate()
            await operator.wait()
            sim.terminate()
            await sim.wait()
            await core.delete_namespace(ns)
    took.sort()
    return {
        "settings": {**TIMERS, "wms_activation_delay_s": float(ACTIVATION_DELAY)},
        "created_to_job_s": {
            "n": len(took),
            "median": round(statistics.median(took), 3),
            "p90": round(took[int(0.9 * (len(took) - 1))], 3),
            "min": round(took[0], 3),
            "max": round(took[-1], 3),
        },
        "scans_present": args.scans + args.latency_scans,
        "seconds_to_reconcile_all_new_scans": round(reconcile_seconds, 1),
        "operator_rss_mib": {
            "idle": round(idle_rss, 1),
            "with_scans": round(rss, 1),
            "with_scans_5s_later": round(rss_later, 1),
        },
    }


async def _sa(core: client.CoreV1Api, ns: str) -> bool:
    try:
        await core.read_namespaced_service_account("default", ns)
    except client.exceptions.ApiException:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="an existing cluster; default: start the local control plane")
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--latency-scans", type=int, default=20)
    args = parser.parse_args()
    if args.kubeconfig:
        result = asyncio.run(run(args.kubeconfig, args))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="skyscan-bench-"))
        state = localcluster.start(workdir, tie_to_parent=True)
        try:
            result = asyncio.run(run(state.kubeconfig, args))
        finally:
            localcluster.stop(workdir)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
