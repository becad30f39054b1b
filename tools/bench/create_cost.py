"""What one create costs, process by process: `POST /scan` through the shim vs a raw Scan create, as
`make bench` compares them (suite.py `creates`: 16 concurrent, interleaved rounds, the operator and the
shim running over `live` waiting Scans), with each round's CPU of the API server, etcd, the controller
manager, the operator, the shim and this process (from /proc) and the API server's requests by verb and
resource (its /metrics), per create.

Storing 10,000 Scans takes minutes, so the cluster and its Scans outlive one measurement:

    python tools/bench/create_cost.py setup --dir DIR [--live 10000]   # a cluster in DIR, Scans stored
    python tools/bench/create_cost.py measure --dir DIR [--creates 800] # operator + shim from this checkout
    python tools/bench/create_cost.py down --dir DIR                    # stops and deletes the cluster
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import suite
from harness import Server, ShimConfig

from skyscan.io import install, kube
from skyscan.io.kube import Kube, scan_path
from skyscan_local import control_plane as localcluster

CONCURRENCY = suite.CONCURRENCY
PLANE = ("kube-apiserver", "etcd", "kube-controller-manager")
REQUEST = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def requests(metrics: str) -> Counter[str]:
    """The API server's requests so far by verb, resource and subresource (clients' and its own)."""
    counts: Counter[str] = Counter()
    for line in metrics.splitlines():
        if m := REQUEST.match(line):
            labels = dict(LABEL.findall(m.group(1)))
            what = f"{labels.get('verb')} {labels.get('resource')}"
            if sub := labels.get("subresource"):
                what += f"/{sub}"
            counts[what] += round(float(m.group(2)))
    return counts


def plane_pids(workdir: Path) -> dict[str, int]:
    state = localcluster.load(workdir)
    assert state is not None, f"no cluster in {workdir}"
    return {p.name: p.pid for p in state.processes if p.name in PLANE}


async def setup(args: argparse.Namespace) -> None:
    workdir = Path(args.dir)
    state = localcluster.load(workdir) or await asyncio.to_thread(localcluster.start, workdir)
    async with await kube.connect(state.kubeconfig) as api:
        await install.install(state.kubeconfig)
        namespace = harness.namespace(api)
        ns = await namespace.__aenter__()  # never left: `down` removes the whole cluster
        (workdir / "bench-namespace").write_text(ns)
        async with harness.running(harness.start_wms_simulator()) as wms:
            op = harness.start_operator(state.kubeconfig, ns, wms.base, **suite.OPERATOR_SETTINGS)
            async with harness.running(op):
                began = time.monotonic()
                await harness.create_scans(api, ns, args.live, concurrency=CONCURRENCY, event=True)
                print(f"{args.live} Scans stored in {time.monotonic() - began:.0f} s", file=sys.stderr)
                await harness.all_holding(api, ns, args.live - 1, 1800)
                print(f"settled {time.monotonic() - began:.0f} s after the first", file=sys.stderr)


def waiting(scan: dict[str, Any]) -> bool:
    conditions = (scan.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Admitted" and c["reason"] == "LowPriorityInterval" for c in conditions)


async def quiet(pid: int, below: float = 5.0, timeout: float = 600.0) -> None:
    """Until the process uses less than `below` % of a core over 2 s."""

    async def calm() -> bool:
        return await harness.cpu_percent(pid, 2.0) < below

    await harness.eventually(calm, timeout, 0.0)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.dir)
    kubeconfig, ns = str(workdir / "kubeconfig"), (workdir / "bench-namespace").read_text()
    pids = plane_pids(workdir)
    async with await kube.connect(kubeconfig) as api:
        scans = await harness.scans_in(api, ns)
        live, started = len(scans), sum(1 for s in scans if not waiting(s))
        async with harness.running(harness.start_wms_simulator()) as wms:
            op = harness.start_operator(kubeconfig, ns, wms.base, **suite.OPERATOR_SETTINGS)
            async with harness.running(op) as operator:
                # The operator has seen every Scan (it starts one more low-priority one).
                await harness.all_holding(api, ns, live - started - 1, 1800)
                await quiet(operator.pid)
                with tempfile.TemporaryDirectory() as tmp:
                    config = ShimConfig.make(kubeconfig, ns, Path(tmp))
                    async with harness.running(harness.start_shim(config)) as shim:
                        await shim.wait_ok()
                        await quiet(shim.pid)
                        procs = {**pids, "operator": operator.pid, "shim": shim.pid, "bench": 0}
                        spies = [
                            await spy(pid, name, args.profile)
                            for name, pid in (("operator", operator.pid), ("shim", shim.pid))
                            if args.profile
                        ]
                        got = await rounds(api, ns, config, shim, procs, args)
                        for p in spies:
                            p.send_signal(2)
                            await p.wait()
                        print(json.dumps({"live": live, **got, "made": len(got["made"])}, indent=2))
                        await remove(api, ns, got.pop("made"))
    return {"live": live, **got}


async def settle(pid: int, most: float) -> None:
    """Until the operator uses under 10 % of a core over half a second, or `most` seconds."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline and await harness.cpu_percent(pid, 0.5) >= 10:
        pass


async def spy(pid: int, name: str, folder: str) -> asyncio.subprocess.Process:
    """py-spy sampling `pid` (raw stacks, folded) until interrupted."""
    out = Path(folder) / f"{name}.txt"
    return await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--rate",
        "200",
        "--nonblocking",
        "-o",
        str(out),
        stdout=asyncio.subprocess.DEVNULL,
    )


def cpu(procs: dict[str, int]) -> dict[str, float]:
    return {name: harness.cpu_seconds(pid or os.getpid()) for name, pid in procs.items()}


async def rounds(
    api: Kube, ns: str, config: ShimConfig, shim: Server, procs: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    made: list[str] = []
    first = 10_000_000
    async with config.session(CONCURRENCY) as http:
        kinds = harness.create_calls(http, shim.base, api, ns, first, made)
        for call in kinds.values():
            await harness.load_loop(call, 2 * CONCURRENCY, CONCURRENCY)
        per = max(1, args.creates // args.rounds)
        totals = {k: {"elapsed": 0.0, "n": 0, "lat": [], "cpu": Counter(), "req": Counter()} for k in kinds}
        if args.settled:  # every POST round, then every raw one, each with its reactions' tail
            order = ["post"] * args.rounds + ["raw"] * args.rounds
        else:  # as `make bench`: alternating, each kind's reactions falling on whichever round follows
            order = [n for r in range(args.rounds) for n in (list(kinds) if r % 2 == 0 else ["raw", "post"])]
        for round_, name in enumerate(order):
            before, reqs = cpu(procs), requests((await api.read("GET", "/metrics")).decode())
            elapsed, lat = await harness.load_loop(kinds[name], per, CONCURRENCY)
            if args.settled:
                await settle(procs["operator"], args.settled)
            after, reqs_after = cpu(procs), requests((await api.read("GET", "/metrics")).decode())
            t = totals[name]
            t["elapsed"] += elapsed
            t["n"] += per
            t["lat"] += lat
            t["cpu"].update({p: after[p] - before[p] for p in procs})
            t["req"].update(reqs_after - reqs)
            print(f"round {round_} {name}: {per / elapsed:.1f}/s, cpu "
                  + ", ".join(f"{p} {1000 * (after[p] - before[p]) / per:.1f}" for p in procs)
                  + " ms/create", file=sys.stderr)  # fmt: skip
    out: dict[str, Any] = {"made": made}
    for name, t in totals.items():
        s = harness.stats(t["lat"], t["elapsed"])
        n = t["n"]
        out[name] = {
            **s.as_dict(),
            "cpu_ms_per_create": {p: round(1000 * v / n, 2) for p, v in t["cpu"].items()},
            "cpu_ms_per_create_total": round(1000 * sum(t["cpu"].values()) / n, 2),
            "requests_per_create": {k: round(v / n, 2) for k, v in t["req"].most_common() if v / n >= 0.05},
        }
    out["post / raw throughput"] = round(out["post"]["per_s"] / out["raw"]["per_s"], 3)
    return out


async def remove(api: Kube, ns: str, made: list[str]) -> None:
    async def delete(i: int) -> None:
        await api.request("DELETE", scan_path(ns, made[i]))

    await harness.load_loop(delete, len(made), CONCURRENCY)

    async def gone() -> bool:
        return not set(made) & {s["metadata"]["name"] for s in await harness.scans_in(api, ns)}

    await harness.eventually(gone, 300, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("what", choices=("setup", "measure", "down"))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--creates", type=int, default=800, help="per kind, as `make bench`")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--settled",
        type=float,
        default=0.0,
        help="POST rounds then raw rounds, each followed by the operator's reactions "
        "(until it is quiet, at most this many seconds), counted with it",
    )
    parser.add_argument("--profile", help="py-spy the operator and the shim into this folder")
    parser.add_argument("--src", help="measure the operator and the shim of this source tree")
    args = parser.parse_args()
    if args.what == "setup":
        asyncio.run(setup(args))
    elif args.what == "measure":
        if args.src:  # the operator and the shim from another checkout (`git archive` of a commit)
            src = Path(args.src).resolve()
            os.environ["PYTHONPATH"] = os.pathsep.join(str(src / d) for d in ("operator", ".", "local"))
        asyncio.run(measure(args))
    else:
        localcluster.stop(Path(args.dir))
        localcluster.remove(Path(args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
