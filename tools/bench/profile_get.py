"""Profile: where one shim process spends its CPU under GET /scan/{id}/manifest load, by py-spy.

Stores N Scans (default 1,000) with their events and a reported status, starts `skyscan-shim serve` as
the bench does (log level INFO: an access line a request, to a file), drives GET manifest of one scan
with hey (loadgen) for `--seconds`, and samples the shim meanwhile with py-spy (`pip install py-spy`).
Prints the share of the shim's CPU samples in each part of a request: the access log (aiohttp's
`log_access` and below), the metrics (the innermost shim frame in api_shim/metrics.py), and the top
functions by inclusive share; `--raw FILE` keeps py-spy's collapsed stacks.

    python tools/bench/profile_get.py [--scans 1000] [--seconds 20] [--concurrency 16] [--raw FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import loadgen

from skyscan import kube

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


async def profile(kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    async with await kube.connect(kubeconfig) as api, harness.namespace(api) as ns:
        ids = await harness.create_scans(api, ns, args.scans, event=True)
        with tempfile.TemporaryDirectory() as tmp:
            config = harness.ShimConfig.make(kubeconfig, ns, Path(tmp))
            async with harness.running(harness.start_shim(config)) as shim:
                await shim.wait_ok()
                url = f"{shim.base}/scan/{ids[0]}/manifest"
                await loadgen.run(url, 2 * args.concurrency, args.concurrency, config.headers)  # warm
                raw = Path(tmp) / "profile.txt"
                spying = await asyncio.create_subprocess_exec(
                    spy, "record", "--pid", str(shim.pid), "--duration", str(args.seconds), "--rate", "250",
                    "--nonblocking", "--format", "raw", "--output", str(raw),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                answered, spied = 0, asyncio.ensure_future(spying.wait())
                while not spied.done():  # rounds of hey until py-spy has its seconds
                    got = await loadgen.run(url, 2000, args.concurrency, config.headers)
                    answered += len(got.latencies)
                await spied
                text = raw.read_text()
    if args.raw:
        Path(args.raw).write_text(text)  # noqa: ASYNC240
    return {"scans": args.scans, "requests": answered, "client": loadgen.client(), **shares(samples(text))}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scans", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--raw", help="keep py-spy's collapsed stacks in this file")
    args = parser.parse_args()
    before = harness.uptime()
    result = asyncio.run(harness.on_control_plane(lambda kc: profile(kc, args)))
    result["uptime_before"], result["uptime_after"] = before, harness.uptime()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
