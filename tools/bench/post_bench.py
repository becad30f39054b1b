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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from skyscan.io import kube

RAW, POST = "raw Scan create (skyscan.io.kube)", "POST /scan through the shim"


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    async with api, harness.namespace(api) as ns:
        async with harness.serving_shim(kubeconfig, ns, args.concurrency) as (shim, http):

            async def post(_: int) -> None:
                async with http.post(f"{shim.base}/scan", json=harness.POST_REQUEST) as r:
                    assert r.status == 200, (r.status, await r.text())
                    await r.read()

            async def raw(i: int) -> None:
                await harness.create_scan(api, ns, harness.scan_spec(i))

            got = await harness.side_by_side(
                {RAW: raw, POST: post}, args.scans, args.concurrency, args.rounds
            )
    return {
        "scans_per_kind": got[RAW].n,
        "concurrency": args.concurrency,
        "results": {name: s.as_dict() for name, s in got.items()},
        "POST /scan relative to a raw create": round(got[POST].per_s / got[RAW].per_s, 3),
        "load_average": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    result = asyncio.run(asyncio.wait_for(harness.on_control_plane(lambda kc: bench(kc, args)), 900))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
