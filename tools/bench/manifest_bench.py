"""Benchmark: GET /scan/{id}/manifest from one shim process vs a direct API-server GET of a Scan.

Stores N Scans (default 1,000) in a fresh namespace, starts `skyscan-shim serve` as a subprocess
(one process, served from its watch cache), then drives each target with C concurrent clients for
R requests over random ids and prints requests/s and p50/p99 latency.

    python tools/bench/manifest_bench.py [--scans 1000] [--requests 5000] [--concurrency 16]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (needs the cached
binaries; SKYSCAN_K8S_BIN_READY as for the tests) and stops it afterwards. The load generator runs
on the same machine, so absolute numbers include its own CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from skyscan import install, kube, model
from skyscan_local import control_plane as localcluster

SCAN = kube.SCAN_RESOURCE


def spec(i: int) -> dict[str, Any]:
    return {
        "dockerTag": "4.1.0",
        "recoAlgo": "millipede_wilks",
        "sensorEventId": f"{i:032x}",
        "nsides": {"8": 0, "64": 12, "512": 24},
        "realOrSimulatedEvent": "real",
        "maxPixelRecoTime": 600,
        "requestClusters": [{"location": "osg", "nWorkers": 100}],
        "classifiers": {"origin": "bench", "i": i},
        "priority": i % 3,
    }


async def store_scans(api: client.ApiClient, namespace: str, n: int) -> list[str]:
    objs = client.CustomObjectsApi(api)
    names = [model.new_scan_id(time.time() + i / 1000, secrets.token_hex(10)) for i in range(n)]
    progress = {
        "summary": "s" * 200,
        "epilogue": "",
        "tallies": {"a": 1},
        "processing_stats": {"start": {}, "runtime": {}},
    }
    sem = asyncio.Semaphore(16)

    async def one(i: int, name: str) -> None:
        async with sem:
            body = {
                "apiVersion": model.API_VERSION,
                "kind": model.KIND,
                "metadata": {"name": name},
                "spec": spec(i),
            }
            await objs.create_namespaced_custom_object(**SCAN, namespace=namespace, body=body)
            await objs.patch_namespaced_custom_object_status(
                **SCAN,
                namespace=namespace,
                name=name,
                body={"status": {"progress": progress}},
                _content_type="application/merge-patch+json",
            )

    await asyncio.gather(*(one(i, name) for i, name in enumerate(names)))
    return names


async def drive(
    call: Callable[[str], Awaitable[None]], ids: list[str], requests: int, concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            name = random.choice(ids)
            start = time.perf_counter()
            await call(name)
            latencies.append(time.perf_counter() - start)

    for _ in range(min(200, requests // 10)):  # warm up connections and caches
        await call(random.choice(ids))
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
    }


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    await install.install(kubeconfig)
    api = await kube.api_client(kubeconfig)
    namespace = f"bench-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})
    shim: asyncio.subprocess.Process | None = None
    try:
        t0 = time.perf_counter()
        ids = await store_scans(api, namespace, args.scans)
        stored_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as tmp:
            token_file = Path(tmp) / "tokens.json"
            from api_shim.auth import make_token

            token = make_token(token_file, "bench", ["user"])
            port = localcluster.free_port()
            env = {
                **os.environ,
                "SKYSCAN_NAMESPACE": namespace,
                "SKYSCAN_KUBECONFIG": kubeconfig,
                "SKYSCAN_TOKEN_FILE": str(token_file),
                "SKYSCAN_HOST": "127.0.0.1",
                "SKYSCAN_PORT": str(port),
            }
            shim = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "api_shim.app", "serve", env=env
            )
            base = f"http://127.0.0.1:{port}"
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(
                headers=headers, connector=aiohttp.TCPConnector(limit=args.concurrency)
            ) as http:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        async with http.get(f"{base}/scan/{ids[-1]}/manifest") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError("shim did not become ready")
                    await asyncio.sleep(0.2)

                async def via_shim(name: str) -> None:
                    async with http.get(f"{base}/scan/{name}/manifest") as r:
                        assert r.status == 200
                        await r.read()

                shim_figures = await drive(via_shim, ids, args.requests, args.concurrency)

        objs = client.CustomObjectsApi(api)

        async def direct(name: str) -> None:
            await objs.get_namespaced_custom_object(**SCAN, namespace=namespace, name=name)

        api_figures = await drive(direct, ids, args.requests, args.concurrency)
        return {
            "scans_stored": len(ids),
            "store_seconds": round(stored_s, 1),
            "requests": args.requests,
            "concurrency": args.concurrency,
            "shim GET /scan/{id}/manifest": shim_figures,
            "API server GET scan (kubernetes_asyncio)": api_figures,
        }
    finally:
        if shim:
            shim.terminate()
            await asyncio.wait_for(shim.wait(), 10)
        await core.delete_namespace(namespace)
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    kubeconfig = os.environ.get("SKYSCAN_TEST_KUBECONFIG")
    state = None
    if not kubeconfig:
        state = localcluster.start(Path(tempfile.mkdtemp(prefix="skyscan-bench-")), tie_to_parent=True)
        kubeconfig = state.kubeconfig
    try:
        print(json.dumps(asyncio.run(bench(kubeconfig, args)), indent=2))
    finally:
        if state:
            localcluster.stop(Path(state.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
