"""Operator benchmark (not a test): admission latency, memory and idle CPU with many Scans.

    SKYSCAN_K8S_BIN_READY=~/.cache/skyscan/k8s/v1.33.13 .venv/bin/python tools/bench/operator_bench.py

Starts a local control plane (or uses --kubeconfig), the WMS simulator and the operator as real
processes, then measures:
1. latency: Scan created -> Job created, for --latency-scans scans created one after another
   (median and p90; the backlog tick, the WMS queue activation delay and the queue poll interval
   are printed with the result since they dominate it);
2. memory: the operator's RSS once --scans Scans exist and each has been reconciled (they wait in
   the backlog: low priority, one start per interval), and how long reconciling them took;
3. idle CPU: the operator's CPU time over --idle-seconds while those scans wait and nothing happens
   (as a percentage of one core), with the load average it was measured under.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from skyscan.io import kube

TIMERS = {
    "SKYSCAN_BACKLOG_TICK_SECONDS": "1",
    "SKYSCAN_QUEUE_POLL_SECONDS": "0.5",
    "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "5",
    "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "3600",
}
ACTIVATION_DELAY = 0.5


async def run(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    async with (
        api,
        harness.namespace(api) as ns,
        harness.running(harness.start_wms_simulator(ACTIVATION_DELAY)) as wms,
        harness.running(harness.start_operator(kubeconfig, ns, wms.base, **TIMERS)) as operator,
    ):
        idle_rss = harness.rss_mib(operator.pid)
        took = await harness.created_to_job(api, ns, args.latency_scans, 0)
        began = time.monotonic()
        await harness.create_scans(api, ns, args.scans, event=True, first=args.latency_scans)
        await harness.all_reconciled(api, ns, args.scans + args.latency_scans, 1800)
        reconcile_seconds = time.monotonic() - began
        settle_seconds = await harness.all_holding(api, ns, args.scans - 1, 1800)  # the first low one starts
        rss = harness.rss_mib(operator.pid)
        await asyncio.sleep(5)  # a few backlog ticks and polls with everything present
        rss_later = harness.rss_mib(operator.pid)
        idle_cpu = await harness.cpu_percent(operator.pid, args.idle_seconds)
        load = os.getloadavg()
        rss_idle = harness.rss_mib(operator.pid)
    took.sort()
    return {
        "settings": {**TIMERS, "wms_activation_delay_s": ACTIVATION_DELAY},
        "created_to_job_s": {
            "n": len(took),
            "median": round(harness.percentile(took, 50), 3),
            "p90": round(harness.percentile(took, 90), 3),
            "min": round(took[0], 3),
            "max": round(took[-1], 3),
        },
        "scans_present": args.scans + args.latency_scans,
        "seconds_to_reconcile_all_new_scans": round(reconcile_seconds, 1),
        "seconds_until_all_show_their_hold": round(settle_seconds, 1),
        "operator_rss_mib": {
            "idle": idle_rss,
            "with_scans": rss,
            "with_scans_5s_later": rss_later,
            "after_idle": rss_idle,
        },
        "operator_idle_cpu_percent": idle_cpu,
        "idle_seconds": args.idle_seconds,
        "load_average_1_5_15": [round(x, 2) for x in load],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kubeconfig", help="an existing cluster; default: start the local control plane")
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--latency-scans", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.kubeconfig:
        os.environ["SKYSCAN_TEST_KUBECONFIG"] = args.kubeconfig  # harness.control_plane uses it
    print(json.dumps(asyncio.run(harness.on_control_plane(lambda kc: run(kc, args))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
