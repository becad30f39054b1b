"""Benchmark: 1,000 concurrent followers of live scans on one shim (`GET /scan/{id}/events`).

In one run against one real shim process, with `--scans` Scans followed by `--followers` streams each:
- the shim's CPU (% of a core) with no client, with every follower connected and nothing changing, and
  while the Scans change (`--rate` status PATCHes per second through the API server, round robin);
- the delay from sending a PATCH to the API server to its event reaching each follower (p50/p99; a
  follower that skipped the version, coalesced under a newer one, counts as `skipped`), next to the
  delay to the same change on a watch of the API server's own (what any watcher gets at best);
- the baseline: as many clients polling `GET /scan/{id}/status` once a second each, the shim's CPU
  they cost, and the polls per second they got through (on a busy machine the clients, in this one
  process, fall short of one a second each: the CPU is also given per 1,000 polls/s, linearly);
- the shim's RSS without and with the streams open, and with them open, the seconds from SIGTERM
  until every stream is closed and until the shim has exited (and, for comparison, the exit of a
  shim with no stream).

    python tools/bench/followers.py [--scans 100] [--followers 10] [--seconds 10] [--rate 20]

Uses SKYSCAN_TEST_KUBECONFIG when set, else starts the local control plane (cached binaries). The
clients run in this process, on the same machine: `uptime` is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from harness import Server, ShimConfig

from skyscan.io import kube

RUNNING = {
    "workflow": {"id": "wf-bench", "address": "http://wms.bench"},
    "job": {"name": "j", "state": "Running"},
}


@dataclass
class Arrivals:
    """When each follower received each version of its scan: (scan, resourceVersion) -> times."""

    seen: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    first: int = 0  # followers that received their first message

    def delays(self, sent: list[tuple[str, int, float]], followers: int) -> tuple[list[float], int]:
        """Seconds from each PATCH to each of its followers' event; and how many never got that version."""
        delays, skipped = [], 0
        for scan, version, at in sent:
            times = self.seen.get((scan, version), [])
            delays += [t - at for t in times]
            skipped += followers - len(times)
        return delays, skipped


async def read_stream(http: aiohttp.ClientSession, url: str, scan: str, arrivals: Arrivals) -> None:
    """Follow one scan until cancelled, noting when each message's `id:` arrives."""
    async with http.get(url) as r:
        if r.status != 200:
            raise AssertionError(f"GET {url}: {r.status} {await r.text()}")
        first = True
        async for line in r.content:
            if line.startswith(b"id: "):
                arrivals.seen[(scan, int(line[4:]))].append(time.perf_counter())
                if first:
                    arrivals.first += 1
                    first = False


@asynccontextmanager
async def followers(
    shim: Server, config: ShimConfig, scans: list[str], per_scan: int
) -> AsyncIterator[tuple[Arrivals, list[asyncio.Task[None]]]]:
    """`per_scan` streams on each scan, connected (each has its first message) while inside."""
    arrivals = Arrivals()
    n = len(scans) * per_scan
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(headers=config.headers, connector=connector, timeout=timeout) as http:
        tasks = [
            asyncio.create_task(read_stream(http, f"{shim.base}/scan/{scan}/events", scan, arrivals))
            for scan in scans
            for _ in range(per_scan)
        ]

        async def connected() -> bool:
            for task in tasks:
                if task.done():
                    task.result()  # a stream that failed fails the bench
            return arrivals.first == n

        try:
            await harness.eventually(connected, 120, 0.2)
            yield arrivals, tasks
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def change(
    k: kube.Kube, ns: str, scans: list[str], rate: float, seconds: float
) -> list[tuple[str, int, float]]:
    """Status PATCHes (the scanner's progress rate) at `rate` per second for `seconds`, round robin over
    `scans`; each as (scan, its new resourceVersion, when it was sent)."""
    sent: list[tuple[str, int, float]] = []
    began, i = time.perf_counter(), 0
    pending: set[asyncio.Task[None]] = set()

    async def patch(scan: str, n: int) -> None:
        body = {
            "status": {
                "progress": {"processing_stats": {"rate": {"pixels/s": n}}},
                "lastUpdated": time.time(),
            }
        }
        at = time.perf_counter()
        obj = await k.request(
            "PATCH", kube.scan_path(ns, scan, "status"), body=body, content_type=kube.MERGE_PATCH
        )
        sent.append((scan, int(obj["metadata"]["resourceVersion"]), at))

    while (due := began + i / rate) < began + seconds:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        task = asyncio.create_task(patch(scans[i % len(scans)], i))
        pending.add(task)
        task.add_done_callback(pending.discard)
        i += 1
    await asyncio.gather(*pending)
    return sent


async def polling(
    shim: Server, config: ShimConfig, scans: list[str], clients: int, seconds: float
) -> tuple[float, float]:
    """`clients` clients each GET /scan/{id}/status once a second: (shim CPU %, requests answered/s)."""
    connector = aiohttp.TCPConnector(limit=0)
    answered = 0
    async with aiohttp.ClientSession(
        headers=config.headers, connector=connector, timeout=harness.TIMEOUT
    ) as http:

        async def client(scan: str) -> None:
            nonlocal answered
            next_at = time.perf_counter() + random.random()  # spread over the second
            while True:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += 1.0
                async with http.get(f"{shim.base}/scan/{scan}/status") as r:
                    await r.read()
                    answered += r.status == 200

        tasks = [asyncio.create_task(client(scans[i % len(scans)])) for i in range(clients)]
        try:
            await asyncio.sleep(3)  # every client connected and in its rhythm
            before = answered
            cpu = await harness.cpu_percent(shim.pid, seconds)
            rate = (answered - before) / seconds
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return cpu, round(rate, 1)


def percentiles(delays: list[float]) -> dict[str, float]:
    ordered = sorted(delays)
    return {f"p{q}_ms": round(harness.percentile(ordered, q) * 1000, 1) for q in (50, 99, 100)}


async def measure(
    k: kube.Kube,
    shim: Server,
    config: ShimConfig,
    ns: str,
    scans: list[str],
    per_scan: int,
    seconds: float,
    rate: float,
) -> dict[str, Any]:
    """Every figure but the shutdown, on a running shim whose cache holds `scans`."""
    n = len(scans) * per_scan
    figures: dict[str, Any] = {"followers": n, "scans_followed": len(scans), "followers_per_scan": per_scan}
    figures["shim_cpu_no_clients_pct"] = await harness.cpu_percent(shim.pid, seconds)
    figures["shim_rss_no_clients_mib"] = harness.rss_mib(shim.pid)
    async with followers(shim, config, scans, per_scan) as (arrivals, _):
        figures["shim_rss_following_mib"] = harness.rss_mib(shim.pid)
        # At least one round of keepalives (one a stream every 15 s) falls in the idle measurement.
        figures["shim_cpu_following_idle_pct"] = await harness.cpu_percent(shim.pid, max(seconds, 16.0))
        watched = Arrivals()
        watcher = asyncio.create_task(watch(k, ns, watched))
        await asyncio.sleep(1)  # the watch is open before the first change
        cpu_task = asyncio.create_task(harness.cpu_percent(shim.pid, seconds))
        sent = await change(k, ns, scans, rate, seconds)
        figures["shim_cpu_following_changing_pct"] = await cpu_task
        await asyncio.sleep(2)  # the last events arrive
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        delays, skipped = arrivals.delays(sent, per_scan)
        direct, _ = watched.delays(sent, 1)
    figures["changing"] = {
        "patches_per_s": rate,
        "patches": len(sent),
        "events_expected": len(sent) * per_scan,
        "events_received": len(delays),
        "skipped": skipped,
    }
    figures["patch_to_event"] = percentiles(delays) if delays else {}
    figures["patch_to_api_server_watch_event"] = percentiles(direct) if direct else {}
    # Last: the polls' connections would weigh in the RSS with streams open.
    cpu, answered = await polling(shim, config, scans, n, seconds)
    figures["baseline_polling"] = {
        "clients": n,
        "shim_cpu_pct": cpu,
        "status_answered_per_s": answered,
        "shim_cpu_pct_per_1000_polls_per_s": round(cpu * 1000 / answered, 1) if answered else None,
    }
    return figures


async def watch(k: kube.Kube, ns: str, arrivals: Arrivals) -> None:
    """A watch of the namespace's Scans on the API server from now on, noting when each change arrives.
    From the current resourceVersion: a watch from none first replays every Scan as ADDED (10,000 in
    the full bench: longer to read than the changes take to come, which then never arrived in time)."""
    listed = await k.request("GET", kube.scan_path(ns), params={"limit": "1"})
    params = {"resourceVersion": listed["metadata"]["resourceVersion"]}
    async for event in k.watch(kube.scan_path(ns), params):
        if event.get("type") == "MODIFIED":
            meta = event["object"]["metadata"]
            arrivals.seen[(meta["name"], int(meta["resourceVersion"]))].append(time.perf_counter())


async def stop_with_streams(
    shim: Server, config: ShimConfig, scans: list[str], per_scan: int
) -> dict[str, float]:
    """Seconds from SIGTERM, every stream open, until the last stream closed and until the shim exited."""
    async with followers(shim, config, scans, per_scan) as (_, tasks):
        began = time.monotonic()
        stopping = asyncio.create_task(shim.stop())
        await asyncio.wait(tasks)
        closed = time.monotonic() - began
        await stopping
        return {"streams_closed_s": round(closed, 2), "exited_s": round(time.monotonic() - began, 2)}


async def bench(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    async with await kube.connect(kubeconfig) as k, harness.namespace(k) as ns:
        scans = await harness.create_scans(k, ns, args.scans, concurrency=16)
        for scan in scans:
            await k.request(
                "PATCH",
                kube.scan_path(ns, scan, "status"),
                body={"status": RUNNING},
                content_type=kube.MERGE_PATCH,
            )
        with tempfile.TemporaryDirectory() as tmp:
            config = ShimConfig.make(kubeconfig, ns, Path(tmp))
            shim = await harness.start_shim(config)
            try:
                await shim.wait_ok()
                figures = await measure(k, shim, config, ns, scans, args.followers, args.seconds, args.rate)
                figures["shim_stop_with_streams_open"] = await stop_with_streams(
                    shim, config, scans, args.followers
                )
            finally:
                await shim.stop()
            async with harness.running(harness.start_shim(config)) as idle:  # the same stop, no stream
                await idle.wait_ok()
                began = time.monotonic()
                await idle.stop()
                figures["shim_stop_without_streams_s"] = round(time.monotonic() - began, 2)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=100)
    parser.add_argument("--followers", type=int, default=10, help="streams per scan")
    parser.add_argument("--seconds", type=float, default=10.0, help="each CPU measurement")
    parser.add_argument("--rate", type=float, default=20.0, help="status PATCHes per second while changing")
    args = parser.parse_args()
    before = harness.uptime()
    result = asyncio.run(asyncio.wait_for(harness.on_control_plane(lambda kc: bench(kc, args)), 900))
    result["uptime_before"], result["uptime_after"] = before, harness.uptime()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
