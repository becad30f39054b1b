"""Broad finds under concurrency (issue 21, item 4): `POST /scans/find` by a classifier that a third of
the live Scans share (`classifiers.third`, i % 3, set by `harness.scan_spec`), projected to scan_id,
4 at a time, with `/healthz` probed meanwhile; and the shim's CPU time per find.

Both loads are driven by hey (loadgen: the compiled client, pinned to one CPU where there are two or
more): the finds by one hey POSTing the find's body, the probes by another at a fixed rate, stopped
(SIGINT: hey then reports what it answered) when the finds are done. The shim's CPU per find is its
CPU time over the finds, less what the probes cost (measured alone first), over the finds answered:
the figure the machine's load sways least.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import harness
import loadgen
from harness import Stats

CLASSIFIER = "third"
BODY = {"filter": {f"classifiers.{CLASSIFIER}": 1}, "manifest_projection": ["scan_id"]}
CONCURRENCY = 4
PROBES_PER_S = 100  # /healthz probes, one at a time
PROBE_ALONE_SECONDS = 2.0
CLIENT = f"{loadgen.client()}: finds {CONCURRENCY} at a time, /healthz {PROBES_PER_S}/s beside"


def expected(live: int) -> int:
    """Bench Scans 0..live-1 with classifiers.third == 1."""
    return len(range(1, live, 3))


@dataclass(frozen=True)
class Figures:
    found: int  # scans each find answered
    finds: Stats
    healthz: Stats  # while the finds ran
    healthz_alone: Stats
    cpu_ms_per_find: float  # the shim's CPU time per find
    load: str  # /proc/loadavg before and after


def command(
    url: str, concurrency: int, headers: Mapping[str, str], *, n: int = 0, rate: int = 0,
    body: Path | None = None,
) -> list[str]:  # fmt: skip
    """hey's command line: `n` requests (0: until interrupted), `concurrency` at a time, each worker at
    most `rate` a second (0: no limit), POSTing `body` (a JSON file) when given, else GETs."""
    cpu = loadgen.pinned_cpu()
    args = ["taskset", "-c", str(cpu)] if cpu is not None else []
    args += [str(loadgen.binary()), "-c", str(concurrency), "-o", "csv", "-t", "60"]
    args += ["-n", str(n)] if n else ["-z", "1h"]
    args += ["-q", str(rate)] if rate else []
    args += ["-m", "POST", "-D", str(body), "-T", "application/json"] if body else []
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    return [*args, url]


async def hey(args: list[str], stop: asyncio.Event | None = None) -> loadgen.Run:
    """Run hey to its end, or until `stop` is set (then interrupted); every answer must be a 200."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    talking = asyncio.ensure_future(proc.communicate())
    if stop is not None:
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([talking, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not talking.done():
            proc.send_signal(signal.SIGINT)
    out, err = await talking
    if proc.returncode != 0:
        raise RuntimeError(f"hey exited with {proc.returncode}: {err.decode(errors='replace')[:300]}")
    got = loadgen.parse_csv(out.decode())
    if not got.latencies or set(got.statuses) != {200}:
        raise AssertionError(f"hey {args[-1]}: {len(got.latencies)} answered, {dict(got.statuses)}")
    return got


def loadavg() -> list[str]:
    """The load average over 1, 5 and 15 minutes (/proc/loadavg)."""
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3]


def stats(run: loadgen.Run) -> Stats:
    return harness.stats(run.latencies, run.elapsed)


async def probe_alone(base: str, headers: Mapping[str, str], pid: int) -> tuple[Stats, float]:
    """/healthz probes alone for a while: their latency, and the shim's CPU seconds per probe."""
    stop = asyncio.Event()
    before = harness.cpu_seconds(pid)
    probing = asyncio.ensure_future(hey(command(f"{base}/healthz", 1, headers, rate=PROBES_PER_S), stop))
    await asyncio.sleep(PROBE_ALONE_SECONDS)
    stop.set()
    got = await probing
    return stats(got), (harness.cpu_seconds(pid) - before) / len(got.latencies)


async def measure(
    base: str, headers: Mapping[str, str], pid: int, live: int, n: int, workdir: Path
) -> Figures:
    """`n` finds (`BODY`), `CONCURRENCY` at a time, over `live` bench Scans, /healthz probed meanwhile."""
    load = loadavg()
    async with aiohttp.ClientSession(headers=dict(headers)) as http:
        async with http.post(f"{base}/scans/find", json=BODY) as r:
            answer: Any = await r.json()
        if r.status != 200 or len(answer["manifests"]) != expected(live):
            raise AssertionError(f"find {BODY}: {r.status}, {str(answer)[:200]} (expected {expected(live)})")
    body = workdir / "third-find.json"
    body.write_text(json.dumps(BODY))
    finds = command(f"{base}/scans/find", CONCURRENCY, headers, n=max(n, CONCURRENCY), body=body)
    await hey(command(f"{base}/scans/find", CONCURRENCY, headers, n=4 * CONCURRENCY, body=body))  # warm up
    healthz_alone, probe_cpu = await probe_alone(base, headers, pid)
    stop = asyncio.Event()
    probing = asyncio.ensure_future(hey(command(f"{base}/healthz", 1, headers, rate=PROBES_PER_S), stop))
    await asyncio.sleep(0.2)  # the probes under way
    before = harness.cpu_seconds(pid)
    found = await hey(finds)
    cpu = harness.cpu_seconds(pid) - before
    stop.set()
    probes = await probing
    probed = len(probes.latencies) * found.elapsed / max(probes.elapsed, found.elapsed)  # during the finds
    load += loadavg()
    return Figures(
        found=len(answer["manifests"]),
        finds=stats(found),
        healthz=stats(probes),
        healthz_alone=healthz_alone,
        cpu_ms_per_find=round(1000 * max(0.0, cpu - probed * probe_cpu) / len(found.latencies), 2),
        load=f"{' '.join(load[:3])} before, {' '.join(load[3:])} after",
    )
