"""Benchmark: `POST /scans/find` never stalls the shim (issue 10, item 1).

Stores N Scans (default 10,000, as manifest_bench does: spec and a progress report) in a fresh
namespace, starts `skyscan-shim serve` as a subprocess against them, and measures over real HTTP:
- the first find after start (it builds the per-Scan find documents) and the find latency of a few
  filters (selective, broad with a projection, everything);
- p50/p99 of 500 finds each, one at a time, by run and event id, by run id, and by a classifier (the
  shim's find index; goal p99 < 10 ms at 10,000 Scans);
- the regexes that backtrack exponentially (`^\\w{8}(\\w+)+!` on scan_id with include_deleted,
  `^(\\w+)+!`, `(a|aa)+$`, `(.*a){20}`): each answer's status and latency, and `/healthz` latency
  measured concurrently (acceptance: each answer within 200 ms, /healthz under 50 ms);
- `GET /scan/{id}/manifest` latency from C clients for S seconds, alone and then while F clients run
  finds back to back (acceptance: p99 under 20 ms while finds run);
- finds by a classifier selecting a third of the Scans, projected to scan_id, 4 at a time, with
  `/healthz` probed meanwhile, both driven by hey (`third_finds.py`; goals p99 < 30 ms and /healthz p99
  < 5 ms), and the shim's CPU time per find. `--only-third` measures only these (after the first find).
With `--padded-scans M` (e.g. 50,000) it repeats these against a shim that serves the same N Scans
plus synthetic copies of them (renamed) up to M in its watch cache: the shim runs in-process in a
subprocess of this script (`--serve-padded`), with the real app, routes and cache; only the copies
bypass the API server. The load generator is this process, on the same machine.

    python tools/bench/find_bench.py [--scans 10000] [--padded-scans 50000] [--seconds 10]
                                     [--get-concurrency 4] [--find-concurrency 2] [--only-third]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (needs the cached
binaries; SKYSCAN_K8S_BIN_READY as for the tests) and stops it afterwards. Every phase is bounded in
time (`--seconds`, request timeouts); storing Scans takes about a minute per 10,000 here.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import third_finds

from skyscan import model
from skyscan.io import kube

REGEXES = [
    ("scan_id", r"^\w{8}(\w+)+!"),
    ("scan_id", r"^(\w+)+!"),
    ("scan_id", r"(a|aa)+$"),
    ("scan_id", r"(.*a){20}"),
    ("scanner_server_args", r"^(\w+)+!"),
    ("scanner_server_args", r"(a|aa)+$"),
    ("scanner_server_args", r"(.*a){20}"),
    ("progress.summary", r"(.*a){20}"),
]
FINDS: dict[str, dict[str, Any]] = {
    "selective (classifiers.i = 1234)": {"filter": {"classifiers.i": 1234}},
    "regex on scan_id, 1/16 match, scan_id only": {
        "filter": {"scan_id": {"$regex": "a$"}},
        "manifest_projection": ["scan_id"],
    },
    "priority = 1 (1/3 match), scan_id only": {"filter": {"priority": 1}, "manifest_projection": ["scan_id"]},
    "priority = 1 (1/3 match), full manifests": {"filter": {"priority": 1}},
    "everything, full manifests": {"filter": {}},
}
LOOPED = [FINDS[k] for k in ("selective (classifiers.i = 1234)", "priority = 1 (1/3 match), scan_id only")]
TIMEOUT = aiohttp.ClientTimeout(total=120)
HERE = str(Path(__file__).resolve())


def figures(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"n": 0}
    return {k: v for k, v in harness.stats(latencies, 1.0).as_dict().items() if k != "per_s"}


def stamp() -> str:
    return time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"


def phase(name: str) -> None:
    print(f"{stamp()} bench: {name}", file=sys.stderr)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, over all cores."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    total = sum(ticks[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


class CpuShares:
    """CPU used, in % of one core, by the shim, this load generator and the whole machine, over a phase
    (whether the shim was starved of CPU by other processes on a shared machine)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.wall = pid, time.perf_counter()
        self.shim, self.here, self.machine = harness.cpu_seconds(pid), time.process_time(), machine_busy()

    def shares(self) -> dict[str, float]:
        wall = time.perf_counter() - self.wall
        busy, total = machine_busy()
        cores = (total - self.machine[1]) / wall
        return {
            "shim %": round(100 * (harness.cpu_seconds(self.pid) - self.shim) / wall, 1),
            "load generator %": round(100 * (time.process_time() - self.here) / wall, 1),
            "machine busy % (of all cores)": round(100 * (busy - self.machine[0]) / wall, 1),
            "cores": round(cores, 1),
        }


class Driver:
    def __init__(self, http: aiohttp.ClientSession, base: str, ids: list[str], pid: int) -> None:
        self.http, self.base, self.ids, self.pid = http, base, ids, pid

    async def find(self, body: dict[str, Any]) -> tuple[int, float, int]:
        start = time.perf_counter()
        async with self.http.post(f"{self.base}/scans/find", json=body) as r:
            payload = await r.json()
        elapsed = time.perf_counter() - start
        return r.status, elapsed, len(payload.get("manifests", [])) if r.status == 200 else -1

    async def get_manifest(self) -> float:
        start = time.perf_counter()
        async with self.http.get(f"{self.base}/scan/{random.choice(self.ids)}/manifest") as r:
            assert r.status == 200, r.status
            await r.read()
        return time.perf_counter() - start

    async def healthz(self) -> float:
        start = time.perf_counter()
        async with self.http.get(f"{self.base}/healthz") as r:
            await r.read()
        return time.perf_counter() - start

    async def repeat(
        self, call: Callable[[], Awaitable[float]], until: asyncio.Event, pause: float = 0
    ) -> list[float]:
        latencies: list[float] = []
        while not until.is_set():
            latencies.append(await call())
            if pause:
                await asyncio.sleep(pause)
        return latencies

    async def regexes(self) -> dict[str, Any]:
        stop = asyncio.Event()
        prober = asyncio.create_task(self.repeat(self.healthz, stop, pause=0.002))
        await asyncio.sleep(0.1)
        answers = []
        for field, pattern in REGEXES:
            body = {"filter": {field: {"$regex": pattern}}, "include_deleted": True}
            status, elapsed, found = await self.find(body)
            ms = round(elapsed * 1000, 1)
            answers.append({"field": field, "pattern": pattern, "status": status, "found": found, "ms": ms})
        stop.set()
        return {"answers": answers, "healthz meanwhile": figures(await prober)}

    async def selective_finds(self, n: int = 500) -> dict[str, Any]:
        """p50/p99 of `n` finds, one at a time, by run and event id, by run id, and by a classifier, each
        for a random bench Scan (`harness.scan_status`: run id 100,000 + i // 10, event id i)."""
        kinds: dict[str, Callable[[int], dict[str, Any]]] = {
            "run_id + event_id": lambda i: {
                "event_metadata.run_id": 100_000 + i // 10,
                "event_metadata.event_id": i,
            },
            "run_id (10 scans)": lambda i: {"event_metadata.run_id": 100_000 + i // 10},
            "classifiers.i": lambda i: {"classifiers.i": i},
        }
        out: dict[str, Any] = {}
        for name, make in kinds.items():
            runs = [await self.find({"filter": make(random.randrange(len(self.ids)))}) for _ in range(n)]
            out[name] = {"found": sorted({r[2] for r in runs}), **figures([r[1] for r in runs])}
        return out

    async def find_latencies(self, repeat: int = 3) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, body in FINDS.items():
            runs = [await self.find(body) for _ in range(repeat)]
            out[name] = {
                "found": runs[0][2],
                "status": runs[0][0],
                **{k: v for k, v in figures([r[1] for r in runs]).items() if k != "p99_ms"},
            }
        return out

    async def gets_with_finds(self, seconds: float, gets: int, finds: int) -> dict[str, Any]:
        stop = asyncio.Event()
        getters = [asyncio.create_task(self.repeat(self.get_manifest, stop)) for _ in range(gets)]
        bodies = iter(LOOPED * 1_000_000)

        async def one_find() -> float:
            return (await self.find(next(bodies)))[1]

        finders = [asyncio.create_task(self.repeat(one_find, stop)) for _ in range(finds)]
        cpu = CpuShares(self.pid)
        await asyncio.sleep(seconds)
        stop.set()
        get_lat = [x for t in getters for x in await t]
        find_lat = [x for t in finders for x in await t]
        return {
            "GET manifest": {**figures(get_lat), "per_s": round(len(get_lat) / seconds, 1)},
            "finds": {**figures(find_lat), "per_s": round(len(find_lat) / seconds, 2)} if finds else None,
            "CPU": cpu.shares(),
        }


async def third(shim: harness.Server, config: harness.ShimConfig, live: int, finds: int) -> dict[str, Any]:
    phase("finds of a third, 4 at a time, /healthz meanwhile")
    with tempfile.TemporaryDirectory() as tmp:
        got = await third_finds.measure(shim.base, config.headers, shim.pid, live, finds, Path(tmp))
    return {
        "found": got.found,
        "finds": got.finds.as_dict(),
        "/healthz meanwhile": got.healthz.as_dict(),
        "/healthz alone": got.healthz_alone.as_dict(),
        "shim CPU ms per find": got.cpu_ms_per_find,
        "load average": got.load,
        "load client": third_finds.CLIENT,
    }


async def measure(
    shim: harness.Server, config: harness.ShimConfig, ids: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    await shim.wait_ok(timeout=600)
    base, pid = shim.base, shim.pid
    async with aiohttp.ClientSession(headers=config.headers, timeout=TIMEOUT) as http:
        driver = Driver(http, base, ids, pid)
        phase("first find")
        result: dict[str, Any] = {
            "load before": harness.uptime(),
            "shim RSS MB before finds": harness.rss_mib(pid),
        }
        _, first, found = await driver.find({"filter": {}, "manifest_projection": ["scan_id"]})
        result["scans served"] = found
        result["first find after start (builds documents), ms"] = round(first * 1000, 1)
        result["shim RSS MB after"] = harness.rss_mib(pid)
        padded = found != len(ids)  # its copies hold the classifiers of the Scans they copy
        if args.only_third and not padded:
            result["finds of a third, 4 at a time"] = await third(shim, config, len(ids), 400)
            return result
        phase("regexes")
        result["regex acceptance"] = await driver.regexes()
        phase("find latency")
        result["find latency"] = await driver.find_latencies()
        phase("selective find latency")
        result["selective find latency (one at a time)"] = await driver.selective_finds()
        phase("GET manifest alone")
        alone = await driver.gets_with_finds(args.seconds, args.get_concurrency, 0)
        result["GET manifest alone"] = {**alone["GET manifest"], "CPU": alone["CPU"]}
        phase("GET manifest while finds run")
        result["while finds run"] = await driver.gets_with_finds(
            args.seconds, args.get_concurrency, args.find_concurrency
        )
        phase("GET manifest while 8 finds run")
        result["while 8 finds run (more than the shim's 2 turns)"] = await driver.gets_with_finds(
            args.seconds, args.get_concurrency, 8
        )
        if not padded:
            result["finds of a third, 4 at a time"] = await third(shim, config, len(ids), 400)
        phase("done")
        result["load after"] = harness.uptime()
        return result


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    api = await kube.connect(kubeconfig)
    out: dict[str, Any] = {}
    async with api, harness.namespace(api) as namespace:
        began = time.perf_counter()
        ids = await harness.create_scans(api, namespace, args.scans)
        out["scans stored in the API server"] = len(ids)
        out["store seconds"] = round(time.perf_counter() - began, 1)
        with tempfile.TemporaryDirectory() as tmp:
            config = harness.ShimConfig.make(kubeconfig, namespace, Path(tmp))
            async with harness.running(harness.start_shim(config)) as shim:
                out[f"shim over the API server ({args.scans} Scans)"] = await measure(shim, config, ids, args)
            if args.padded_scans > args.scans:
                padded = harness.start_shim(config, [HERE, "--serve-padded", str(args.padded_scans)])
                async with harness.running(padded) as shim:
                    key = f"shim with its cache padded to {args.padded_scans} Scans"
                    out[key] = await measure(shim, config, ids, args)
    return out


def serve_padded(total: int) -> None:
    """The real shim app (settings from SKYSCAN_*), its cache padded with renamed copies of its Scans."""
    from api_shim.app import create_app
    from api_shim.plumbing import SHIM
    from api_shim.settings import ShimSettings

    tickers: list[asyncio.Task[None]] = []

    async def padded_app() -> web.Application:
        settings = ShimSettings()
        app = await create_app(settings)

        async def pad(app: web.Application) -> None:
            cache = app[SHIM].cache
            real = list(cache)
            base = time.time() - 30 * 86400  # older than the real ones
            for i in range(total - len(real)):
                obj = copy.deepcopy(real[i % len(real)])
                obj["metadata"]["name"] = model.new_scan_id(base + i, secrets.token_hex(10))
                cache.observe(obj)

        async def watch_loop(app: web.Application) -> None:
            """Each second, on stderr: the longest the event loop went without turning, in wall time
            and in this process's CPU time (the part the shim's own work held it; the rest is the
            machine's scheduler running other processes)."""

            async def ticker() -> None:
                worst, worst_cpu, second = 0.0, 0.0, time.monotonic() + 1
                while True:
                    wall, cpu = time.perf_counter(), time.thread_time()
                    await asyncio.sleep(0.001)
                    worst = max(worst, time.perf_counter() - wall - 0.001)
                    worst_cpu = max(worst_cpu, time.thread_time() - cpu)
                    if time.monotonic() >= second:
                        print(
                            f"{stamp()} shim: loop lag max {worst * 1000:.1f} ms wall,"
                            f" {worst_cpu * 1000:.1f} ms CPU",
                            file=sys.stderr,
                        )
                        worst, worst_cpu, second = 0.0, 0.0, time.monotonic() + 1

            tickers.append(asyncio.create_task(ticker()))

        app.on_startup.append(pad)
        app.on_startup.append(watch_loop)
        return app

    started = [0.0]

    def gc_pause(phase: str, info: dict[str, int]) -> None:  # stderr: the collector's long pauses
        if phase == "start":
            started[0] = time.perf_counter()
        elif (pause := time.perf_counter() - started[0]) > 0.01:
            print(f"{stamp()} shim: gc gen {info['generation']}: {pause * 1000:.0f} ms", file=sys.stderr)

    gc.callbacks.append(gc_pause)
    settings = ShimSettings()
    web.run_app(padded_app(), host=settings.host, port=settings.port, access_log=None, print=None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=10_000)
    parser.add_argument("--padded-scans", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--get-concurrency", type=int, default=4)
    parser.add_argument("--find-concurrency", type=int, default=2)
    parser.add_argument("--only-third", action="store_true", help="only the finds of a third, 4 at a time")
    parser.add_argument("--serve-padded", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_padded:
        serve_padded(args.serve_padded)
        return 0
    print(json.dumps(asyncio.run(harness.on_control_plane(lambda kc: bench(kc, args))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
