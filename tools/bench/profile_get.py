"""Profile: where one shim process spends its CPU under GET /scan/{id}/manifest (or status) load.

Stores N Scans (default 1,000) with their events and a reported status, starts `skyscan-shim serve` as
the bench does (log level INFO: an access line a request, to a file) and the bench's bare aiohttp
servers of the same bytes, then:

- CPU per request: the CPU time (all threads, from /proc/<pid>/task/*/schedstat) each server spends
  over `--requests` GETs by hey (loadgen), for the shim and the bare server, manifest and status, in
  `--rounds` interleaved rounds (the median is printed). On a machine shared with other work this is
  the steadier figure: a throughput ratio moves with whatever else runs, a process's own CPU time less.
- Shares: drives GET `--kind` of one scan with hey for `--seconds` and samples the shim meanwhile with
  py-spy (`pip install py-spy`); prints the share of the shim's CPU samples in each part of a request:
  the access log (aiohttp's `log_access` and below), the metrics (the innermost shim frame in
  api_shim/metrics.py), and the top functions by inclusive share; `--raw FILE` keeps py-spy's
  collapsed stacks. `--seconds 0` leaves py-spy out.

    python tools/bench/profile_get.py [--scans 1000] [--seconds 20] [--concurrency 16] [--raw FILE]
        [--kind manifest|status] [--requests 8000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import aiohttp
import harness
import loadgen

from skyscan.io import kube

PRODUCT = ("api_shim/", "skyscan/")
# A part of a request: a test of one sample's frames (outermost first), each "function (file:line)".
PARTS = {
    "access log": lambda frames: any(function(f).endswith("log_access") for f in frames),
    "metrics": lambda frames: innermost_shim_file(frames) == "api_shim/metrics.py",
}


def samples(raw: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: each stack's frames, outermost first, and its sample count."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield stack.split(";"), int(count)


def function(frame: str) -> str:
    """`RequestHandler.log_access (aiohttp/web_protocol.py:541)` -> `RequestHandler.log_access`."""
    return frame.rpartition(" (")[0]


def frame_file(frame: str) -> str:
    """`f (path/to/api_shim/x.py:12)` -> `api_shim/x.py` (the path from its package on)."""
    path = frame.rpartition(" (")[2].rstrip(")").rpartition(":")[0]
    for package in PRODUCT:
        if package in path:
            return package + path.split(package, 1)[1]
    return path


def innermost_shim_file(frames: list[str]) -> str | None:
    files = [frame_file(f) for f in frames]
    return next((f for f in reversed(files) if f.startswith(PRODUCT)), None)


def shares(stacks: Iterable[tuple[list[str], int]], top: int = 15) -> dict[str, Any]:
    """Each part's share of all samples (%), the `top` functions by their own share (the innermost
    frame), and the `top` functions of the product (api_shim, skyscan) by inclusive share."""
    total, parts, own, inclusive = 0, Counter[str](), Counter[str](), Counter[str]()
    for frames, count in stacks:
        total += count
        for name, test in PARTS.items():
            if test(frames):
                parts[name] += count
        unlined = [f"{function(f)} ({frame_file(f)})" for f in frames]  # whatever the line
        own[unlined[-1]] += count
        for frame in {f for f in unlined if f.endswith(".py)") and f.split(" (")[-1].startswith(PRODUCT)}:
            inclusive[frame] += count

    def pct(n: int) -> float:
        return round(100 * n / total, 1) if total else 0.0

    return {
        "samples": total,
        "parts_pct": {name: pct(parts[name]) for name in PARTS},
        "top_own_pct": {f: pct(n) for f, n in own.most_common(top)},
        "top_product_inclusive_pct": {f: pct(n) for f, n in inclusive.most_common(top)},
    }


async def body_of(url: str, headers: Mapping[str, str]) -> bytes:
    async with aiohttp.ClientSession(headers=headers) as http, http.get(url) as r:
        if r.status != 200:
            raise AssertionError(f"GET {url}: {r.status}")
        return await r.read()


def run_ns(pid: int) -> int:
    """Nanoseconds all threads of process `pid` have run so far, as the scheduler counts them (exact,
    where /proc/<pid>/stat's user and system times are sampled at the clock tick)."""
    return sum(
        int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()
    )


async def cpu_us(pid: int, url: str, n: int, concurrency: int, headers: Mapping[str, str]) -> float:
    """Microseconds of CPU process `pid` spends a GET of `url`, over `n` GETs by hey."""
    before = run_ns(pid)
    got = await loadgen.run(url, n, concurrency, headers)
    return (run_ns(pid) - before) / 1000 / len(got.latencies)


async def cpu_per_request(
    servers: Mapping[str, tuple[int, str, Mapping[str, str]]], n: int, rounds: int, concurrency: int
) -> dict[str, float]:
    """Each server's median CPU per request (µs) over `rounds` interleaved rounds of `n` GETs."""
    got: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, (pid, url, headers) in servers.items():
            got[name].append(await cpu_us(pid, url, n, concurrency, headers))
    return {name: round(statistics.median(us), 1) for name, us in got.items()}


async def spied(pid: int, url: str, args: argparse.Namespace, headers: Mapping[str, str], tmp: Path) -> str:
    """py-spy's collapsed stacks of process `pid` over `args.seconds` of GETs of `url`."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = tmp / "profile.txt"
    spying = await asyncio.create_subprocess_exec(
        spy, "record", "--pid", str(pid), "--duration", str(args.seconds), "--rate", "250",
        "--nonblocking", "--format", "raw", "--output", str(raw),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    done = asyncio.ensure_future(spying.wait())
    while not done.done():  # rounds of hey until py-spy has its seconds
        await loadgen.run(url, 2000, args.concurrency, headers)
    await done
    return raw.read_text()


async def profile(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    async with await kube.connect(kubeconfig) as api, harness.namespace(api) as ns:
        ids = await harness.create_scans(api, ns, args.scans, event=True)
        with tempfile.TemporaryDirectory() as tmp:
            config = harness.ShimConfig.make(kubeconfig, ns, Path(tmp))
            async with harness.running(harness.start_shim(config)) as shim:
                await shim.wait_ok()
                path, user = f"/scan/{ids[0]}", config.headers
                urls = {kind: f"{shim.base}{path}/{kind}" for kind in ("manifest", "status")}
                bodies = {}
                for kind, url in urls.items():  # warm
                    await loadgen.run(url, 2 * args.concurrency, args.concurrency, user)
                    bodies[kind] = await body_of(url, user)
                async with (
                    harness.running(harness.start_bare_server(bodies["manifest"], Path(tmp))) as bare_m,
                    harness.running(harness.start_bare_server(bodies["status"], Path(tmp))) as bare_s,
                ):
                    servers = {
                        "shim manifest": (shim.pid, urls["manifest"], user),
                        "bare manifest": (bare_m.pid, f"{bare_m.base}{path}/manifest", {}),
                        "shim status": (shim.pid, urls["status"], user),
                        "bare status": (bare_s.pid, f"{bare_s.base}{path}/status", {}),
                    }
                    for _, url, headers in servers.values():  # warm
                        await loadgen.run(url, 2 * args.concurrency, args.concurrency, headers)
                    cpu = await cpu_per_request(servers, args.requests, args.rounds, args.concurrency)
                text = await spied(shim.pid, urls[args.kind], args, user, Path(tmp)) if args.seconds else ""
    if args.raw:
        Path(args.raw).write_text(text)  # noqa: ASYNC240
    result: dict[str, Any] = {"scans": args.scans, "client": loadgen.client(), "cpu_us_per_request": cpu}
    return result | ({"kind": args.kind, **shares(samples(text))} if args.seconds else {})


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--raw", help="keep py-spy's collapsed stacks in this file")
    parser.add_argument("--kind", choices=("manifest", "status"), default="manifest", help="what py-spy sees")
    parser.add_argument("--requests", type=int, default=8000, help="GETs a round, for CPU per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before = harness.uptime()
    result = asyncio.run(harness.on_control_plane(lambda kc: profile(kc, args)))
    result["uptime_before"], result["uptime_after"] = before, harness.uptime()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
