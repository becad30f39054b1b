"""Benchmark: `POST /scan` through one shim process vs a raw Scan create on the API server.

Both create the same number of scans at the same concurrency in one run, alternating rounds, and the
result is printed as a ratio (the issue's goal: POST at least 40 % of a raw create at concurrency 16).
POST stores a small sensor event with each scan, as clients do; the raw create writes the Scan alone.

    python tools/bench/post_bench.py [--scans 400] [--rounds 4] [--concurrency 16]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (cached binaries) and stops
it afterwards. The load generator runs on the same machine.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifest_bench import spec

from api_shim.auth import make_token
from skyscan import install, kube, model
from skyscan_local import control_plane as localcluster

REQUEST = {
    "docker_tag": "latest",
    "reco_algo": "millipede_wilks",
    "nsides": {"8": 0, "64": 12, "512": 24},
    "real_or_simulated_event": "real",
    "max_pixel_reco_time": 600,
    "request_clusters": {"osg": 10},
    "classifiers": {"origin": "bench"},
    "event_live_json": {"value": {"data": {"run_id": 1, "event_id": 2, "pulses": "x" * 2000}}},
}


Create = Callable[[int], Awaitable[None]]


async def run(create: Create, n: int, concurrency: int) -> tuple[float, list[float]]:
    todo = iter(range(n))
    latencies: list[float] = []

    async def worker() -> None:
        for i in todo:
            start = time.perf_counter()
            await create(i)
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began, latencies


def figures(elapsed: float, latencies: list[float]) -> dict[str, float]:
    latencies = sorted(latencies)
    return {
        "creates_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000, 1),
    }


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    await install.install(kubeconfig)
    api = await kube.api_client(kubeconfig)
    namespace = f"bench-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})
    objs = client.CustomObjectsApi(api)
    shim: asyncio.subprocess.Process | None = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            token_file = Path(tmp) / "tokens.json"
            token = make_token(token_file, "bench", ["user"])
            port = localcluster.free_port()
            env = {**os.environ, "SKYSCAN_NAMESPACE": namespace, "SKYSCAN_KUBECONFIG": kubeconfig,
                   "SKYSCAN_TOKEN_FILE": str(token_file), "SKYSCAN_HOST": "127.0.0.1",
                   "SKYSCAN_PORT": str(port), "SKYSCAN_TAGS": '["latest"]'}  # fmt: skip
            shim = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "api_shim.app", "serve", env=env
            )
            base = f"http://127.0.0.1:{port}"
            connector = aiohttp.TCPConnector(limit=args.concurrency)
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=headers, connector=connector) as http:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        async with http.get(f"{base}/healthz") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError("shim did not become ready")
                    await asyncio.sleep(0.2)

                async def post(_: int) -> None:
                    async with http.post(f"{base}/scan", json=REQUEST) as r:
                        assert r.status == 200, (r.status, await r.text())
                        await r.read()

                async def raw(i: int) -> None:
                    name = model.new_scan_id(time.time(), secrets.token_hex(10))
                    body = {"apiVersion": model.API_VERSION, "kind": model.KIND,
                            "metadata": {"name": name}, "spec": spec(i)}  # fmt: skip
                    await objs.create_namespaced_custom_object(
                        **kube.SCAN_RESOURCE, namespace=namespace, body=body
                    )

                kinds = {"raw Scan create (kubernetes_asyncio)": raw, "POST /scan through the shim": post}
                for create in kinds.values():  # warm up
                    await run(create, 2 * args.concurrency, args.concurrency)
                totals = {name: (0.0, []) for name in kinds}
                per_round = args.scans // args.rounds
                for round_ in range(args.rounds):
                    for name in list(kinds) if round_ % 2 == 0 else reversed(kinds):
                        elapsed, latencies = await run(kinds[name], per_round, args.concurrency)
                        totals[name] = (totals[name][0] + elapsed, totals[name][1] + latencies)
        results = {name: figures(*totals[name]) for name in kinds}
        raw_rate = results["raw Scan create (kubernetes_asyncio)"]["creates_per_s"]
        return {
            "scans_per_kind": per_round * args.rounds,
            "concurrency": args.concurrency,
            "results": results,
            "POST /scan relative to a raw create": round(
                results["POST /scan through the shim"]["creates_per_s"] / raw_rate, 3
            ),
            "load_average": os.getloadavg(),
        }
    finally:
        if shim:
            shim.terminate()
            await asyncio.wait_for(shim.wait(), 10)
        await core.delete_namespace(namespace)
        await api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    kubeconfig = os.environ.get("SKYSCAN_TEST_KUBECONFIG")
    state = None
    if not kubeconfig:
        state = localcluster.start(Path(tempfile.mkdtemp(prefix="skyscan-bench-")), tie_to_parent=True)
        kubeconfig = state.kubeconfig
    try:
        print(json.dumps(asyncio.run(asyncio.wait_for(bench(kubeconfig, args), 900)), indent=2))
    finally:
        if state:
            localcluster.stop(Path(state.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
