"""The benchmarks' compiled HTTP load client: hey (github.com/rakyll/hey), built from the Go module proxy
by `tools/k8s/build.sh --bench` into the binaries' cache, and pinned with taskset to one CPU where the
machine has more than one. A Python client on the same cores spends as much CPU per request as the
server it measures and flattens every ratio; hey spends a fraction of it.

hey's `-o csv` gives one row per answered request (its latency and its start offset, in seconds with
four decimals: 0.1 ms steps); a round's elapsed time is the last answer's end.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HEY = "hey"
PYTHON_CLIENT = "aiohttp in the bench process"


@dataclass(frozen=True)
class Run:
    """One hey run: each answered request's latency (s), its status code, and the run's wall time (s)."""

    latencies: list[float]
    statuses: Counter[int]
    elapsed: float


def parse_csv(text: str) -> Run:
    """hey's `-o csv` output."""
    rows = list(csv.DictReader(io.StringIO(text)))
    latencies = [float(r["response-time"]) for r in rows]
    ends = [float(r["offset"]) + t for r, t in zip(rows, latencies, strict=True)]
    return Run(latencies, Counter(int(r["status-code"]) for r in rows), max(ends, default=0.0))


def binary() -> Path:
    """hey in the binaries' cache (SKYSCAN_K8S_BIN_READY, as `make bench` sets it), else on PATH."""
    cached = Path(os.environ.get("SKYSCAN_K8S_BIN_READY", "/nonexistent")) / HEY
    if cached.is_file():
        return cached
    if found := shutil.which(HEY):
        return Path(found)
    raise FileNotFoundError("no hey: run `bash tools/k8s/build.sh --bench` (make bench does)")


def pinned_cpu() -> int | None:
    """The CPU hey runs on: the last one this process may use, when taskset exists and there are two
    or more (on one CPU pinning changes nothing)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1] if len(cpus) > 1 and shutil.which("taskset") else None


def client() -> str:
    """What the figures measured with hey name as their load client."""
    cpu = pinned_cpu()
    return f"hey, pinned to CPU {cpu}" if cpu is not None else "hey (not pinned: one CPU)"


def command(
    url: str, n: int, concurrency: int, headers: Mapping[str, str], body: str | None = None
) -> list[str]:
    """hey's command line: `n` GETs of `url` (POSTs of the JSON `body`), `concurrency` at a time, with
    `headers`."""
    cpu = pinned_cpu()
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    args = [str(binary()), "-n", str(n), "-c", str(concurrency), "-o", "csv"]
    if body is not None:
        args += ["-m", "POST", "-T", "application/json", "-d", body]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    return [*pin, *args, url]


def sent(n: int, concurrency: int) -> int:
    """How many requests hey sends when asked for `n`: each of its `concurrency` workers sends
    n // concurrency (hey refuses n < concurrency)."""
    if n < concurrency:
        raise ValueError(f"hey sends nothing for {n} requests at concurrency {concurrency}")
    return n - n % concurrency


async def run(
    url: str, n: int, concurrency: int, headers: Mapping[str, str] | None = None, body: str | None = None
) -> Run:
    """`sent(n, concurrency)` GETs of `url` (POSTs of `body`) by hey; every one must answer 200."""
    expected = sent(n, concurrency)
    proc = await asyncio.create_subprocess_exec(
        *command(url, n, concurrency, headers or {}, body),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"hey exited with {proc.returncode}: {err.decode(errors='replace')[:300]}")
    got = parse_csv(out.decode())
    if len(got.latencies) != expected or set(got.statuses) != {200}:
        # hey leaves failed requests (refused, timed out) out of its rows
        raise AssertionError(
            f"hey {'POST' if body else 'GET'} {url}: {len(got.latencies)} of {expected} answered, "
            f"{dict(got.statuses)}"
        )
    return got
