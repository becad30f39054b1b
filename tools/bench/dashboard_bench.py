"""The dashboard measured in a real browser (issue 31, item 6): Debian's chromium driven by Playwright,
against a running shim, each figure read from the page's own Performance API.

Rows so far:
- a scan page's skymap drawn at nside 512: navigation start -> the end of the skymap's draw (the page's
  `skyscan:skymap:drawn` mark), for a scan whose stored result is the default progression 8:0 64:12
  512:24 (about 3,000 pixels, 0.5 MB of JSON); the median of a few fresh browser contexts (no cache).
  Goal: under 1 s.
- the scans table's first rows: navigation start -> the page's `skyscan:scans:rows` mark, over the live
  scans of the namespace (10,000 in `make bench`). Goal: under 500 ms.
- the shim's CPU with 20 scans pages open and idle, each holding its one rows stream. Goal: under 2 %.

Adding a row is one function: `async def row(d: Dashboard) -> Figure` that prepares what it needs
(scans in `d.ns` through `d.api`), opens pages with `d.open(route)` and reads their performance
entries, and returns its figure; then list it in ROWS. `make bench` (tools/bench/suite.py) runs ROWS
against its shim over its live scans; alone, this file starts a control plane and a shim of its own:

    python tools/bench/dashboard_bench.py [--runs 5]

Where there is no chromium, every row says so (skipped), as the browser tests do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from skyscan import model
from skyscan.io import kube, payloads
from skyscan.io.kube import Kube, scan_path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
CLIENT = "chromium (Playwright), one page at a time"
VIEWPORT = {"width": 1280, "height": 800}
WAIT_MS = 60_000  # a page that has not drawn by then is a failure, not a figure


@dataclass(frozen=True)
class Figure:
    """One row's measurement: `value` in `unit`, its goal an upper `limit` (None: no goal); or, with no
    value, a `note` saying why not (skipped, failed)."""

    what: str
    value: float | None
    unit: str = ""
    limit: float | None = None
    compared: str = ""
    client: str = CLIENT
    note: str = ""

    @property
    def figure(self) -> str:
        return self.note if self.value is None else f"{self.value:g} {self.unit}".rstrip()

    @property
    def goal(self) -> str:
        return "" if self.limit is None else f"< {self.limit:g} {self.unit}".rstrip()

    @property
    def verdict(self) -> str:
        if self.limit is None or self.value is None:
            return ""
        return "PASS" if self.value < self.limit else "FAIL"


@dataclass
class Dashboard:
    """What a row measures with: the shim (its address, pid, a user's token), the API server and the
    namespace the shim serves, the browser, and how many runs make a figure."""

    base: str
    token: str
    shim_pid: int
    api: Kube
    ns: str
    browser: Any  # playwright.async_api.Browser
    runs: int = 5
    problems: list[str] = field(default_factory=list)  # console errors of the pages opened

    async def open(self, route: str) -> Any:
        """A fresh browser context (no cache) holding the token as a login leaves it (session storage),
        at /ui/#/`route`; console errors are kept in `problems`. Close it with `page.context.close()`."""
        context = await self.browser.new_context(viewport=VIEWPORT)
        await context.add_init_script(f"sessionStorage.setItem('skyscan.token', {json.dumps(self.token)})")
        page = await context.new_page()
        page.on("console", lambda m: self.problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(str(e)))
        await page.goto(f"{self.base}/ui/#/{route}")
        return page


Row = Callable[[Dashboard], Awaitable[Figure]]


# ---------------------------------------------------------------- rows


async def stored_scan_with_result(api: Kube, ns: str, nsides: dict[int, int]) -> tuple[str, int, int]:
    """A Scan with a partial result covering `nsides` (every pixel of each reconstructed), stored as the
    shim stores a scanner's PUT: the payload, then `status.result`. (name, pixels, result bytes)."""
    from skyscan_local import skymap

    i = 9_000_000 + int(time.time()) % 100_000
    name = await harness.create_scan(api, ns, harness.scan_spec(i), status=harness.scan_status(i), event=True)
    metadata = {"run_id": 100_000 + i // 10, "event_id": i, "event_type": "bench", "mjd": 60000.0}
    sky = skymap.ScanSky(skymap.true_event(metadata), name, nsides)
    for nside in nsides:
        sky.finish(nside, sky.send(nside))
    result = sky.result(metadata, final=False)
    scan = await api.request("GET", scan_path(ns, name))
    await payloads.write_result(api, ns, scan, await payloads.encode_async(result, "scan result"))
    status = model.ScanStatus(result=model.ResultStatus(is_final=False, updated_at=time.time())).to_patch()
    await api.request("PATCH", scan_path(ns, name, "status"), body={"status": status},
                      content_type=kube.MERGE_PATCH)  # fmt: skip
    pixels = sum(len(part["data"]) for part in result.values())
    return name, pixels, len(json.dumps(result, separators=(",", ":")))


# From the page's Performance API, in ms from navigation start: the skymap drawn (its mark), the draw
# itself, the page's modules all loaded, and the GET of the scan with its result (start, end).
DRAWN = """() => {
  const mark = (name) => performance.getEntriesByName(name)[0];
  const resources = performance.getEntriesByType("resource");
  const read = resources.find((r) => /\\/scan\\/[^/?]+\\?include_deleted/.test(r.name));
  const modules = resources.filter((r) => r.name.endsWith(".js")).map((r) => r.responseEnd);
  return {
    drawn: mark("skyscan:skymap:drawn").startTime, draw: mark("skyscan:skymap:draw").duration,
    modules: Math.max(0, ...modules),
    read_start: read ? read.startTime : NaN,
    read_end: read ? read.responseEnd : NaN,
  };
}"""


async def skymap_drawn(d: Dashboard) -> Figure:
    """Navigation start -> the skymap drawn, on a scan page whose result reaches nside 512."""
    name, pixels, size = await stored_scan_with_result(d.api, d.ns, {8: 0, 64: 12, 512: 24})
    got: list[dict[str, float]] = []
    for _ in range(d.runs):
        page = await d.open(f"scan/{name}")
        try:
            await page.locator(f'canvas.skymap[data-pixels="{pixels}"]').wait_for(timeout=WAIT_MS)
            got.append(await page.evaluate(DRAWN))
        finally:
            await page.context.close()

    def median(key: str) -> float:
        return statistics.median(g[key] for g in got)

    runs = ", ".join(f"{g['drawn']:.0f}" for g in got)
    compared = (
        f"median of {len(got)} fresh pages ({runs} ms): modules loaded at {median('modules'):.0f} ms, "
        f"GET /scan/{{id}} ({size / 1e6:.2f} MB of result) from {median('read_start'):.0f} "
        f"to {median('read_end'):.0f} ms, "
        f"the draw itself {median('draw'):.0f} ms"
    )
    what = f"scan page: navigation → skymap drawn, nside 512 ({pixels:,} pixels)"
    return Figure(what, round(median("drawn")), "ms", 1000.0, compared)


FIRST_ROWS = """() => performance.getEntriesByName("skyscan:scans:rows")[0].startTime"""
IDLE_PAGES, IDLE_SECONDS = 20, 10.0


async def live_scans(d: Dashboard) -> int:
    return len(await harness.scans_in(d.api, d.ns))


async def scans_table_first_rows(d: Dashboard) -> Figure:
    """Navigation start -> the scans table's first rows (a page of the newest, from GET /scans)."""
    live, got = await live_scans(d), []
    for _ in range(d.runs):
        page = await d.open("scans")
        try:
            await page.locator("table.scans tbody tr").first.wait_for(timeout=WAIT_MS)
            got.append(await page.evaluate(FIRST_ROWS))
        finally:
            await page.context.close()
    runs = ", ".join(f"{g:.0f}" for g in got)
    what = f"scans page: navigation → first rows, {live:,} live scans"
    return Figure(
        what, round(statistics.median(got)), "ms", 500.0, f"median of {len(got)} fresh pages ({runs} ms)"
    )


async def streams_open(d: Dashboard, n: int) -> bool:
    """Whether the shim serves at least `n` event streams (its gauge)."""
    async with aiohttp.ClientSession() as http, http.get(f"{d.base}/metrics") as r:
        text = await r.text()
    gauge = next(line for line in text.splitlines() if line.startswith("skyscan_shim_event_streams "))
    return float(gauge.split()[1]) >= n


async def idle_dashboards(d: Dashboard) -> Figure:
    """The shim's CPU while `IDLE_PAGES` scans pages stay open, each following its rows (one stream)."""
    pages = []
    try:
        for _ in range(IDLE_PAGES):
            page = await d.open("scans")
            await page.locator("table.scans tbody tr").first.wait_for(timeout=WAIT_MS)
            pages.append(page)
        await harness.eventually(lambda: streams_open(d, IDLE_PAGES), 60, interval=0.2)
        cpu = await harness.cpu_percent(d.shim_pid, IDLE_SECONDS)
    finally:
        for page in pages:
            await page.context.close()
    what = f"shim CPU, {IDLE_PAGES} scans pages open and idle (one stream each), over {IDLE_SECONDS:g} s"
    return Figure(what, round(cpu, 2), "% of a core", 2.0, f"{await live_scans(d):,} live scans")


ROWS: list[Row] = [skymap_drawn, scans_table_first_rows, idle_dashboards]


# ---------------------------------------------------------------- running the rows


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            await browser.close()


async def measure(base: str, token: str, shim_pid: int, api: Kube, ns: str, runs: int,
                  rows: list[Row] = ROWS) -> list[Figure]:  # fmt: skip
    """Each of `rows` against the shim at `base`; a row that fails is a figure saying so (NaN), the
    others still run. Without chromium, one skipped figure per row."""
    if not HAVE_CHROMIUM:
        return [Figure(f"dashboard: {row.__name__}", None, note="skipped: no chromium") for row in rows]
    figures = []
    async with chromium() as browser:
        d = Dashboard(base, token, shim_pid, api, ns, browser, runs)
        for row in rows:
            try:
                figures.append(await row(d))
            except Exception as e:  # the product or the machine failed: a row that says so
                note = f"error: {type(e).__name__}: {e}"[:300]
                figures.append(Figure(f"dashboard: {row.__name__}", None, note=note))
            if d.problems:  # the page is to have none (issue 31, item 4)
                what = f"dashboard: {row.__name__}: errors in the browser's console"
                figures.append(Figure(what, len(d.problems), limit=1, compared="; ".join(d.problems)[:300]))
                d.problems.clear()
    return figures


async def alone(runs: int) -> list[Figure]:
    async with harness.control_plane() as kubeconfig, await kube.connect(kubeconfig) as api:
        async with harness.namespace(api) as ns:
            with tempfile.TemporaryDirectory(prefix="skyscan-bench-") as tmp:
                config = harness.ShimConfig.make(kubeconfig, ns, Path(tmp))
                async with harness.running(harness.start_shim(config)) as shim:
                    await shim.wait_ok()
                    return await measure(shim.base, config.token, shim.pid, api, ns, runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh pages per figure (the median)")
    args = parser.parse_args()
    before = harness.uptime()
    figures = asyncio.run(alone(args.runs))
    print(f"before: `{before}`  \nafter: `{harness.uptime()}`\n")
    print("| measure | figure | compared | load client | goal | |\n|---|---|---|---|---|---|")
    for f in figures:
        print(f"| {f.what} | {f.figure} | {f.compared} | {f.client} | {f.goal} | {f.verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
