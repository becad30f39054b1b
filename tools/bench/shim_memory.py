"""Benchmark: the shim's cold start (spawn to `/healthz` 200) and memory (VmRSS) over N live Scans.

Stores N Scans (default 10,000; `harness.create_scans`: spec and reported status, 32 at a time), then
spawns the shim R times (default 3) and reports for each start the seconds to `/healthz` 200, the
shim's own CPU seconds by then (less sensitive to other load on the machine than the wall time),
VmRSS once synced, and VmRSS after a `/scans/find` that reads every Scan's manifest (what the shim
then keeps for later finds).

    python tools/bench/shim_memory.py [--scans 10000] [--starts 3] [--namespace NS]

`--namespace` measures an existing namespace as it is (or fills it if empty) and keeps it, so a
second run skips the minutes the Scans take to store. `measure_shim` is one start, for the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness

from skyscan.io import kube
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError

FIND_NOTHING = {"filter": {"priority": -1}}  # matched against every manifest, answers none


async def measure_shim(config: harness.ShimConfig) -> dict[str, float]:
    """One shim start over `config.namespace`: cold start (wall and the shim's CPU) and VmRSS."""
    async with harness.running(harness.start_shim(config)) as shim, config.session(1) as http:
        cold_start = await shim.wait_ok()
        cold_cpu = harness.cpu_seconds(shim.pid)
        await asyncio.sleep(1.0)  # the watch's first events, the allocator settling
        synced = harness.rss_mib(shim.pid)
        async with http.post(f"{shim.base}/scans/find", json=FIND_NOTHING) as r:
            assert r.status == 200, await r.text()
        return {
            "cold_start_s": round(cold_start, 2),
            "cold_start_cpu_s": round(cold_cpu, 2),
            "rss_synced_mib": synced,
            "rss_after_find_mib": harness.rss_mib(shim.pid),
        }


async def count_scans(api: Kube, ns: str) -> int:
    listed = await api.request("GET", scan_path(ns), params={"limit": 1})
    return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    try:
        ns = args.namespace
        if ns:
            try:
                await api.request("POST", core_path("namespaces"), body={"metadata": {"name": ns}})
            except KubeError as e:
                if e.status != 409:
                    raise
            return await measure_namespace(api, kubeconfig, ns, args)
        async with harness.namespace(api) as ns:
            return await measure_namespace(api, kubeconfig, ns, args)
    finally:
        await api.close()


async def measure_namespace(api: Kube, kubeconfig: str, ns: str, args: argparse.Namespace) -> dict[str, Any]:
    if not await count_scans(api, ns):
        await harness.create_scans(api, ns, args.scans, concurrency=32)
    figures: dict[str, Any] = {"scans": await count_scans(api, ns), "starts": []}
    with tempfile.TemporaryDirectory() as tmp:
        config = harness.ShimConfig.make(kubeconfig, ns, Path(tmp))
        for _ in range(args.starts):
            figures["starts"].append(await measure_shim(config))
    figures["uptime"] = harness.uptime()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=10_000)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--namespace", help="measure this namespace (filled if empty) and keep it")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(harness.on_control_plane(lambda k: bench(k, args))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
