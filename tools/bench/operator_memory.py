"""Benchmark: where the operator's memory goes with N live Scans waiting in the backlog.

    python tools/bench/operator_memory.py [--scans 10000] [--env NAME=VALUE ...] [--trace 25]
                                          [--block MODULE] [--restart] [--namespace NS]

Starts the operator (the suite's settings, metrics served) under `operator_probe.py`, then stores N Scans
with their events as the suite does (the operator reconciles them as they come), waits until every
one shows its backlog hold, and reports at each stage: VmRSS and its anonymous and file-backed parts,
what glibc's malloc holds in use and free in its arenas (free but resident memory is fragmentation:
RSS the live heap does not need), Python's allocated blocks, and with `--trace` the top allocations
by file and line (tracemalloc; it costs memory of its own, so compare RSS without it). The peak RSS
is sampled every half second. `--restart` then starts a second operator over the settled Scans (the
initial listing of N objects); `--namespace` measures only that, over an existing namespace. `--env`
passes settings (e.g. PYTHONMALLOC=malloc), `--block` makes a module unimportable in the operator.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from operator_probe import BLOCK, PROBE_FILE, TRACE
from suite import OPERATOR_SETTINGS

from skyscan.io import kube
from skyscan.io.kube import Kube


async def probed(
    op: harness.Server, path: Path, stage: str, stages: dict[str, Any], sig: int = signal.SIGUSR1
) -> None:
    """`stage`'s report (SIGUSR2: after a full collection and malloc_trim)."""
    before = len(reports(path))
    os.kill(op.pid, sig)

    async def written() -> bool:
        return len(reports(path)) > before

    await harness.eventually(written, 120, 0.1)
    stages[stage] = json.loads(reports(path)[-1])


def reports(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def start_probed_operator(
    kubeconfig: str, ns: str, wms: str, path: Path, args: argparse.Namespace
) -> harness.Server:
    settings = {
        PROBE_FILE: str(path),
        TRACE: str(args.trace),
        BLOCK: ",".join(args.block),
        **OPERATOR_SETTINGS,
        **dict(e.split("=", 1) for e in args.env),
    }
    if args.trace:  # a traced report stops the event loop for seconds: the Lease must outlast it
        settings["SKYSCAN_LEASE_DURATION_SECONDS"] = "600"
    probe = [str(harness.HERE / "operator_probe.py")]
    return await harness.start_operator(kubeconfig, ns, wms, probe, **settings)


class Peak:
    """The highest VmRSS of a process, sampled every half second while entered."""

    def __init__(self, pid: int) -> None:
        self.pid, self.mib = pid, 0.0
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        while True:
            self.mib = max(self.mib, harness.rss_mib(self.pid))
            await asyncio.sleep(0.5)

    async def __aenter__(self) -> Peak:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task:
            self._task.cancel()


async def quiet(pid: int, seconds: float = 10.0, timeout: float = 1800.0) -> None:
    """Until the process used under 2 % of a core for `seconds` (its initial listing is through)."""

    async def idle() -> bool:
        return await harness.cpu_percent(pid, seconds) < 2.0

    await harness.eventually(idle, timeout, 0.0)


async def restarted(
    kubeconfig: str, ns: str, wms: str, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """An operator started over the Scans in `ns` as they are: its initial listing of all of them."""
    path = workdir / "restart.jsonl"
    stages: dict[str, Any] = {}
    async with harness.running(start_probed_operator(kubeconfig, ns, wms, path, args)) as op:
        await probed(op, path, "started", stages)
        began = time.monotonic()
        async with Peak(op.pid) as peak:
            await quiet(op.pid)
        stages["quiet_s"] = round(time.monotonic() - began)
        stages["peak_rss_mib"] = peak.mib
        await probed(op, path, "listed", stages)
        await probed(op, path, "trimmed", stages, signal.SIGUSR2)
    return stages


async def first_pass(
    api: Kube, kubeconfig: str, ns: str, wms: str, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """An operator running while `args.scans` Scans are stored, until each shows its backlog hold."""
    path = workdir / "first.jsonl"
    stages: dict[str, Any] = {}
    async with harness.running(start_probed_operator(kubeconfig, ns, wms, path, args)) as op:
        await probed(op, path, "started", stages)
        began = time.monotonic()
        async with Peak(op.pid) as peak:
            await harness.create_scans(api, ns, args.scans, concurrency=16, event=True)
            stages["stored_s"] = round(time.monotonic() - began)
            await harness.all_reconciled(api, ns, args.scans, 3600)
            await harness.all_holding(api, ns, args.scans - 1, 3600)
        stages["settled_s"] = round(time.monotonic() - began)
        stages["peak_rss_mib"] = peak.mib
        await asyncio.sleep(5)
        await probed(op, path, "settled", stages)
        await probed(op, path, "trimmed", stages, signal.SIGUSR2)
    return stages


async def run(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"scans": args.scans, "env": args.env, "block": args.block, "trace": args.trace}
    workdir = Path(tempfile.mkdtemp(prefix="skyscan-opmem-"))
    async with harness.running(harness.start_wms_simulator()) as wms:
        if args.namespace:
            out["namespace"] = args.namespace
            out["restart"] = await restarted(kubeconfig, args.namespace, wms.base, workdir, args)
        else:
            api = await kube.connect(kubeconfig)
            async with api, harness.namespace(api) as ns:
                out["first"] = await first_pass(api, kubeconfig, ns, wms.base, workdir, args)
                if args.restart:
                    out["restart"] = await restarted(kubeconfig, ns, wms.base, workdir, args)
    out["load_average_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=10_000)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the operator")
    parser.add_argument("--block", action="append", default=[], help="a module the operator may not import")
    parser.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: none)")
    parser.add_argument("--restart", action="store_true", help="then an operator over the settled Scans")
    parser.add_argument("--namespace", help="only an operator started over the Scans in NAMESPACE")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(harness.on_control_plane(lambda kc: run(kc, args))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
