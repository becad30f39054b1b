"""Benchmark: GET /scan/{id}/manifest from one shim process vs a direct API-server GET of a Scan.

Stores N Scans (default 1,000) with a reported status in a fresh namespace, starts `skyscan-shim serve`
(one process, served from its watch cache), then drives both targets with C concurrent clients for R
requests each over random ids, in alternating rounds, and prints requests/s and p50/p99 latency.

    python tools/bench/manifest_bench.py [--scans 1000] [--requests 5000] [--concurrency 16]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (needs the cached
binaries; SKYSCAN_K8S_BIN_READY as for the tests) and stops it afterwards. The load generator runs
on the same machine, so absolute numbers include its own CPU use. `make bench` runs this comparison
and more in one table (suite.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from skyscan.io import kube
from skyscan.io.kube import scan_path


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    async with api, harness.namespace(api) as ns:
        began = time.perf_counter()
        ids = await harness.create_scans(api, ns, args.scans)
        stored_s = time.perf_counter() - began
        async with harness.serving_shim(kubeconfig, ns, args.concurrency) as (shim, http):

            async def via_shim(_: int) -> None:
                async with http.get(f"{shim.base}/scan/{random.choice(ids)}/manifest") as r:
                    assert r.status == 200, r.status
                    await r.read()

            async def direct(_: int) -> None:
                await api.request("GET", scan_path(ns, random.choice(ids)))

            kinds = {
                "shim GET /scan/{id}/manifest": via_shim,
                "API server GET scan (skyscan.io.kube)": direct,
            }
            got = await harness.side_by_side(kinds, args.requests, args.concurrency)
    return {
        "scans_stored": len(ids),
        "store_seconds": round(stored_s, 1),
        "requests": args.requests,
        "concurrency": args.concurrency,
        **{name: s.as_dict() for name, s in got.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(harness.on_control_plane(lambda kc: bench(kc, args))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
