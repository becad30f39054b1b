"""`make bench`: the issue 11 benchmark suite, one run on one machine, printed as a markdown table.

Side by side, in one run against one local control plane (or SKYSCAN_TEST_KUBECONFIG's cluster):
1. shim GET manifest and GET status vs a bare aiohttp server returning the same bytes, and vs a direct
   API-server GET of the Scan;
2. POST /scan vs a raw Scan create (create_namespaced_custom_object, what kubectl does);
3. Scan created -> its Job created (the operator and the WMS simulator running, short timers);
4. RSS and idle CPU of the shim and the operator with `live` Scans waiting;
5. shim cold start (spawn -> /healthz 200) at that size;
6. with `archived` scans COPYed into the archive: GET manifest of archived scans, and POST /scans/find
   by run/event id and by a classifier over live + archived (each is skipped with a "not available
   yet" line while the product lacks that piece);
7. 1,000 followers of 100 live scans (`GET /scan/{id}/events`; `--quick` 200 of 20): the shim's CPU idle
   and under status PATCHes, PATCH -> event delay, against as many clients polling `/status` (followers.py);
8. POST /scans/find by a classifier and by run/event id over the live scans, one at a time; and by a
   classifier selecting a third of them, projected to scan_id, 4 at a time, with /healthz probed
   meanwhile (third_finds.py: the finds and the probes driven by hey);
9. the dashboard in chromium, from the page's Performance API (dashboard_bench.py's rows): a scan
   page's skymap drawn at nside 512;
10. webhooks: 1,000 subscriptions over 100 scans changing 20 times a second (`--quick` 200 over 20),
   status change -> delivery at a receiver, and the operator's CPU (webhooks_bench.py).
The GETs of 1. are driven by hey (loadgen.py), a compiled load generator pinned to one CPU where there
are two or more, so that the client's own CPU does not flatten the ratios; the rest by aiohttp in this
process. Every figure names its load client. All of it runs on one machine: `uptime` is printed before
and after.

    python tools/bench/suite.py [--quick]     (make bench, make bench QUICK=1)

Sizes: 10,000 live and 1,000,000 archived scans; `--quick` 1,000 and 10,000 (CI's smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from skyscan.io import kube, kubeconfig
from skyscan.io.kube import Kube, scan_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_bench
import followers
import harness
import history
import loadgen
import third_finds
import webhooks_bench
from harness import Server, ShimConfig, Stats


@dataclass(frozen=True)
class Size:
    live: int
    archived: int
    requests: int  # per kind, in the side-by-side GETs
    creates: int  # per kind, POST vs raw create
    finds: int  # per kind of find or archived read
    latency_scans: int  # created one after another, each timed to its Job
    idle_seconds: float
    deadline_seconds: float  # a safety net: a quiet machine needs a third of it


# hey's rounds (a quarter of `requests` each) last seconds: a round of the bare server is not over
# before the machine's load has had a chance to change.
FULL = Size(10_000, 1_000_000, 40_000, 800, 1000, 20, 10.0, 3600.0)
QUICK = Size(1_000, 10_000, 8000, 200, 200, 5, 5.0, 600.0)
CONCURRENCY = 16
OPERATOR_SETTINGS = {
    "SKYSCAN_WORKERS": "16",  # reconciles the stored Scans in minutes, not tens of them
    "SKYSCAN_BACKLOG_TICK_SECONDS": "0.25",
    "SKYSCAN_QUEUE_POLL_SECONDS": "0.2",
    "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "5",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "36000",  # the bulk scans wait: one low-priority start
    "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",
    **webhooks_bench.OPERATOR_SETTINGS,  # a receiver beside the bench
}
ONE_AT_A_TIME = f"{loadgen.PYTHON_CLIENT}, one at a time"
IN_PROCESS = f"{loadgen.PYTHON_CLIENT}, {CONCURRENCY} at a time"
HEY = f"{loadgen.client()}, {CONCURRENCY} at a time"
GOALS = {  # the goals: upper limits
    "shim RSS, MiB": 100.0,
    "operator RSS, MiB": 100.0,
    "operator idle CPU, % of a core": 5.0,
    "shim cold start, s": 3.0,
    "archived GET manifest p99, ms": 10.0,
    "find p99 over live, ms": 10.0,
    "find of a third p99, 4 concurrent, ms": 30.0,
    "/healthz p99 while those finds run, ms": 5.0,
    "find p99 over live + archived, ms": 50.0,
}


# ---------------------------------------------------------------- the report (pure)


@dataclass(frozen=True)
class Row:
    what: str
    figure: str
    compared: str = ""
    goal: str = ""
    verdict: str = ""
    client: str = ""  # what drove the load the figure measures


def measured(what: str, value: float, unit: str, goal: str | None = None) -> Row:
    """A row for one number; with `goal` (a GOALS key) it says the limit and PASS or FAIL."""
    if goal is None:
        return Row(what, f"{value:g} {unit}")
    limit = GOALS[goal]
    return Row(
        what, f"{value:g} {unit}", goal=f"< {limit:g} {unit}", verdict="PASS" if value < limit else "FAIL"
    )


def latency(s: Stats) -> str:
    return f"{s.per_s:g}/s, p50 {s.p50_ms:g} ms, p99 {s.p99_ms:g} ms"


def ratio(a: Stats, b: Stats, b_name: str) -> str:
    """a's throughput and p99 relative to b's."""
    return f"{a.per_s / b.per_s:.2f}x the throughput of {b_name}, p99 {a.p99_ms / b.p99_ms:.1f}x"


def versus(what: str, a: Stats, b: Stats, b_name: str, at_least: float, p99_within: float | None = None,
           client: str = "") -> Row:  # fmt: skip
    """A row comparing a with b against the issue's goal: a's throughput at least `at_least` of b's
    (and its p99 at most `p99_within` times b's)."""
    goal = f"≥ {at_least:g}x" + (f", p99 ≤ {p99_within:g}x" if p99_within else "")
    met = a.per_s >= at_least * b.per_s and (p99_within is None or a.p99_ms <= p99_within * b.p99_ms)
    return Row(what, latency(a), ratio(a, b, b_name), goal=goal, verdict="PASS" if met else "FAIL",
               client=client)  # fmt: skip


def markdown(rows: list[Row]) -> str:
    lines = ["| measure | figure | compared | load client | goal | |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.what} | {r.figure} | {r.compared} | {r.client} | {r.goal} | {r.verdict} |" for r in rows]
    return "\n".join(lines)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.what}: {row.figure} {row.compared} {row.verdict}".rstrip(), file=sys.stderr)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  {text}", file=sys.stderr)

    def phase(self, name: str) -> None:
        print(f"[{time.monotonic() - self.began:6.1f} s] {name}", file=sys.stderr)

    async def section(self, name: str, measure: Awaitable[None]) -> None:
        """Run one measurement; if it breaks, say so in the table and go on with the next."""
        try:
            await measure
        except Exception as e:  # any failure of the product or the machine: a row, not a lost run
            self.add(Row(name, f"error: {type(e).__name__}: {e}"[:300]))


# ---------------------------------------------------------------- the run


@dataclass
class Bench:
    size: Size
    api: Kube
    kubeconfig: str
    ns: str
    workdir: Path
    report: Report
    live: list[str] = field(default_factory=list)

    def session(self, config: ShimConfig) -> aiohttp.ClientSession:
        return config.session(CONCURRENCY)


async def get_ok(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url) as r:
        body = await r.read()
        if r.status != 200:
            raise AssertionError(f"GET {url}: {r.status} {body[:200]!r}")
        return body


async def find(http: aiohttp.ClientSession, base: str, flt: dict[str, Any]) -> list[dict[str, Any]]:
    async with http.post(f"{base}/scans/find", json={"filter": flt}) as r:
        body = await r.json()
        if r.status != 200:
            raise AssertionError(f"find {flt}: {r.status} {body}")
        return list(body["manifests"])


def api_get(b: Bench, scan: str) -> tuple[harness.Measure, str]:
    """GETs of `scan` straight from the API server, and their load client: hey with the kubeconfig's
    bearer token, else (a client certificate, a plugin) skyscan.io.kube from this process."""
    endpoint = kubeconfig.endpoint(b.kubeconfig)
    url = endpoint.server.rstrip("/") + scan_path(b.ns, scan)
    if endpoint.token:
        auth = {"Authorization": f"Bearer {endpoint.token}"}
        return harness.hey_get(url, CONCURRENCY, auth), HEY

    async def direct(_: int) -> None:
        await b.api.request("GET", scan_path(b.ns, scan))

    return harness.looped(direct, CONCURRENCY), f"skyscan.io.kube, {IN_PROCESS}"


async def reads(b: Bench, config: ShimConfig, shim: Server) -> None:
    """1. GET manifest and status of one scan: the shim vs a bare server with the same bytes vs the API
    server, all driven by hey (one URL each: hey repeats one request)."""
    b.report.phase("GET manifest and status: shim, bare aiohttp, API server; a find of that scan")
    scan = b.live[0]
    one = json.dumps({"filter": live_filters(b, "run", 1, [0])[0]})  # the run and event ids of live[0]
    async with b.session(config) as http:
        manifest = await get_ok(http, f"{shim.base}/scan/{scan}/manifest")
        status = await get_ok(http, f"{shim.base}/scan/{scan}/status")
        if [m["scan_id"] for m in await find(http, shim.base, json.loads(one)["filter"])] != [scan]:
            raise AssertionError(f"the find {one} does not answer {scan} alone")
    async with (
        harness.running(harness.start_bare_server(manifest, b.workdir)) as bare_m,
        harness.running(harness.start_bare_server(status, b.workdir)) as bare_s,
    ):
        api, api_client = api_get(b, scan)
        path, user = f"/scan/{scan}", config.headers
        kinds = {
            "shim manifest": harness.hey_get(f"{shim.base}{path}/manifest", CONCURRENCY, user),
            "bare manifest": harness.hey_get(f"{bare_m.base}{path}/manifest", CONCURRENCY),
            "shim status": harness.hey_get(f"{shim.base}{path}/status", CONCURRENCY, user),
            "bare status": harness.hey_get(f"{bare_s.base}{path}/status", CONCURRENCY),
            "shim find one": harness.hey_get(f"{shim.base}/scans/find", CONCURRENCY, user, one),
            "api": api,
        }
        got = await harness.interleaved(kinds, b.size.requests, 2 * CONCURRENCY)
    versus_api = HEY if api_client == HEY else f"shim: {HEY}; API server: {api_client}"
    add = b.report.add
    add(versus(f"shim GET /scan/{{id}}/manifest ({len(manifest)} B)", got["shim manifest"],
               got["bare manifest"], "bare aiohttp", 0.8, 2, HEY))  # fmt: skip
    add(Row("", "", ratio(got["shim manifest"], got["api"], "an API-server GET"), client=versus_api))
    add(versus(f"shim GET /scan/{{id}}/status ({len(status)} B)", got["shim status"],
               got["bare status"], "bare aiohttp", 0.9, 2, HEY))  # fmt: skip
    add(Row("", "", ratio(got["shim status"], got["api"], "an API-server GET"), client=versus_api))
    add(versus("shim POST /scans/find of that scan by run_id + event_id (indexed)", got["shim find one"],
               got["shim manifest"], "a shim GET of its manifest", 0.5, client=HEY))  # fmt: skip
    add(Row("bare aiohttp server, manifest bytes", latency(got["bare manifest"]), client=HEY))
    add(Row("API-server GET of the Scan", latency(got["api"]), client=api_client))


async def timed_finds(
    http: aiohttp.ClientSession, base: str, filters: list[dict[str, Any]], n: int
) -> tuple[Stats, int]:
    """`n` finds over `filters` round robin, one at a time; (latencies, finds with no answer)."""
    empty = 0

    async def one(i: int) -> None:
        nonlocal empty
        empty += not await find(http, base, filters[i % len(filters)])

    elapsed, lat = await harness.load_loop(one, n, 1)
    return harness.stats(lat, elapsed), empty


def live_filters(b: Bench, kind: str, n: int, picks: list[int] | None = None) -> list[dict[str, Any]]:
    """Finds of one live scan each (the `picks`-th, else `n` at random), by its run and event ids or by
    its classifier."""
    picks = picks or random.sample(range(b.size.live), min(n, b.size.live))
    if kind == "run":
        return [{"event_metadata.run_id": 100_000 + i // 10, "event_metadata.event_id": i} for i in picks]
    return [{"classifiers.i": i} for i in picks]


async def live_finds(b: Bench, config: ShimConfig, shim: Server) -> None:
    b.report.phase("find over live scans")
    async with b.session(config) as http:
        for kind, label in (("run", "run_id + event_id"), ("classifier", "a classifier")):
            filters = live_filters(b, kind, 200)
            await timed_finds(http, shim.base, filters[:10], 10)  # warm up: the shim builds its index
            got, empty = await timed_finds(http, shim.base, filters, b.size.finds)
            if empty:
                b.report.note(f"find by {label}: {empty} of {got.n} finds found nothing (expected one)")
            row = measured(f"POST /scans/find by {label}, {b.size.live:,} live", got.p99_ms, "ms",
                           "find p99 over live, ms")  # fmt: skip
            b.report.add(Row(row.what, f"p99 {row.figure}, p50 {got.p50_ms:g} ms", goal=row.goal,
                             verdict=row.verdict, client=ONE_AT_A_TIME))  # fmt: skip


async def broad_finds(b: Bench, config: ShimConfig, shim: Server) -> None:
    """Finds selecting a third of the live scans, projected to scan_id, 4 at a time; /healthz meanwhile."""
    b.report.phase("finds selecting a third of the live scans, 4 at a time, /healthz meanwhile")
    got = await third_finds.measure(shim.base, config.headers, shim.pid, b.size.live, b.size.finds, b.workdir)
    what = (f"POST /scans/find by a classifier selecting a third, projected to scan_id, "
            f"{third_finds.CONCURRENCY} concurrent, {b.size.live:,} live")  # fmt: skip
    row = measured(what, got.finds.p99_ms, "ms", "find of a third p99, 4 concurrent, ms")
    compared = f"{got.found:,} scans each; shim CPU {got.cpu_ms_per_find:g} ms a find; load {got.load}"
    b.report.add(replace(row, figure=f"p99 {row.figure}, p50 {got.finds.p50_ms:g} ms, {got.finds.per_s:g}/s",
                         compared=compared, client=third_finds.CLIENT))  # fmt: skip
    healthz_goal = "/healthz p99 while those finds run, ms"
    row = measured("/healthz p99 meanwhile", got.healthz.p99_ms, "ms", healthz_goal)
    alone = got.healthz_alone
    b.report.add(replace(row, figure=f"p99 {row.figure}, p50 {got.healthz.p50_ms:g} ms",
                         compared=f"alone: p99 {alone.p99_ms:g} ms, p50 {alone.p50_ms:g} ms",
                         client=third_finds.CLIENT))  # fmt: skip


async def creates(b: Bench, config: ShimConfig, shim: Server) -> None:
    """2. POST /scan vs a raw Scan create. The scans made here are deleted again: the operator then
    sees exactly `live` waiting Scans."""
    b.report.phase("POST /scan vs raw create")
    made: list[str] = []
    async with b.session(config) as http:
        calls = harness.create_calls(http, shim.base, b.api, b.ns, b.size.live, made)
        got = await harness.side_by_side(calls, b.size.creates, CONCURRENCY)
    b.report.add(versus("POST /scan through the shim (scan + its event)", got["post"], got["raw"],
                        "a raw Scan create", 0.5, client=IN_PROCESS))  # fmt: skip
    b.report.add(Row("raw Scan create (POST to the API server)", latency(got["raw"]), client=IN_PROCESS))

    async def delete(i: int) -> None:
        await b.api.request("DELETE", scan_path(b.ns, made[i]))

    await harness.load_loop(delete, len(made), CONCURRENCY)

    async def gone() -> bool:
        return len(await harness.scans_in(b.api, b.ns)) == len(b.live)

    await harness.eventually(gone, 120, 1.0)


COLD_STARTS = 3  # one start is one sample of a noisy machine: the median of three is the figure


async def cold_start(b: Bench, config: ShimConfig, label: str) -> Server:
    """5. Spawn the shim; seconds to /healthz 200 (the median of COLD_STARTS; the last one stays up)."""
    b.report.phase(f"shim cold start, {label}")
    took: list[float] = []
    for _ in range(COLD_STARTS - 1):
        shim = await harness.start_shim(config)
        took.append(await shim.wait_ok())
        await shim.stop()
    shim = await harness.start_shim(config)
    took.append(await shim.wait_ok())
    median = round(statistics.median(took), 2)
    row = measured(f"shim cold start to /healthz 200, {label}", median, "s", "shim cold start, s")
    b.report.add(replace(row, compared=f"median of {', '.join(f'{t:.2f}' for t in took)} s"))
    return shim


async def settled(b: Bench) -> None:
    b.report.phase("waiting until every Scan shows its backlog hold (nothing left to do)")
    await harness.all_holding(b.api, b.ns, b.size.live - 1, 900)  # the first low-priority one starts


async def idle(b: Bench, shim: Server, op: Server) -> None:
    """4. RSS and idle CPU of both processes with every Scan waiting."""
    await settled(b)
    b.report.phase(f"idle CPU over {b.size.idle_seconds:g} s")
    shim_cpu, op_cpu = await asyncio.gather(
        harness.cpu_percent(shim.pid, b.size.idle_seconds),
        harness.cpu_percent(op.pid, b.size.idle_seconds),
    )
    live = f"{b.size.live:,} live"
    b.report.add(measured(f"shim RSS, {live}", harness.rss_mib(shim.pid), "MiB", "shim RSS, MiB"))
    b.report.add(measured(f"shim idle CPU, {live}", shim_cpu, "% of a core"))
    b.report.add(measured(f"operator RSS, {live}", harness.rss_mib(op.pid), "MiB", "operator RSS, MiB"))
    b.report.add(measured(f"operator idle CPU, {live} waiting", op_cpu, "% of a core",
                          "operator idle CPU, % of a core"))  # fmt: skip


async def job_latency(b: Bench) -> None:
    """3. Scan created -> its Job created, one high-priority scan after another."""
    b.report.phase("Scan created -> Job created")
    took = await harness.created_to_job(b.api, b.ns, b.size.latency_scans, 2 * b.size.live)
    got = harness.stats(took, sum(took))
    tick, poll = (
        OPERATOR_SETTINGS["SKYSCAN_BACKLOG_TICK_SECONDS"],
        OPERATOR_SETTINGS["SKYSCAN_QUEUE_POLL_SECONDS"],
    )
    b.report.add(Row(f"Scan created → Job created ({got.n} scans, one at a time)",
                     f"p50 {got.p50_ms / 1000:.2f} s, max {got.max_ms / 1000:.2f} s",
                     f"backlog tick {tick} s, WMS queue activation 0 s, queue poll {poll} s"))  # fmt: skip


async def add_workers(b: Bench, config: ShimConfig, shim: Server, wms: Server) -> None:
    """add-workers answered at once whatever the scan's workflow is doing (a 200 from the WMS, or a
    422 saying why not), each state timed through the shim with the operator running."""
    b.report.phase("add-workers by workflow state")

    async def scan_where(i: int, ready: str) -> str:
        spec = harness.scan_spec(3 * b.size.live + i, priority=100)
        name = await harness.create_scan(b.api, b.ns, spec, event=True)

        async def reached() -> bool:
            conds = (await b.api.request("GET", scan_path(b.ns, name))).get("status", {}).get("conditions")
            return any(c["type"] == "WorkflowReady" and c["reason"] == ready for c in conds or [])

        await harness.eventually(reached, 60, 0.05)
        return name

    async def sim_config(**settings: float) -> None:
        async with aiohttp.ClientSession() as http, http.patch(f"{wms.base}/_sim/config", json=settings) as r:
            r.raise_for_status()

    async def still_waiting() -> str:
        """A live scan with no workflow yet: the last stored, as the backlog starts the oldest first
        (the first ones may have been started by now)."""
        for name in reversed(b.live):
            if not (await b.api.request("GET", scan_path(b.ns, name))).get("status", {}).get("workflow"):
                return name
        raise AssertionError("no live scan is still waiting")

    await sim_config(activation_delay=3600)  # this scan's queues stay inactive
    waiting = await scan_where(0, "WaitingForQueues")
    await sim_config(activation_delay=0)
    running = await scan_where(1, "QueuesActivated")
    took: dict[str, float] = {}
    async with b.session(config) as http:

        async def ask(what: str, scan: str, expected: int) -> None:
            start = time.perf_counter()
            body = {"n_workers": 2, "cluster_location": "osg"}
            async with http.post(f"{shim.base}/scan/{scan}/actions/add-workers", json=body) as r:
                if r.status != expected:
                    raise AssertionError(f"add-workers, {what}: {r.status} {await r.text()}")
            took[f"{what} {expected}"] = time.perf_counter() - start

        await ask("in the backlog", await still_waiting(), 422)
        await ask("waiting for its queues", waiting, 200)
        await ask("running", running, 200)
        async with http.delete(f"{shim.base}/scan/{running}") as r:
            r.raise_for_status()
        await ask("deleted", running, 422)
    worst = max(took.values())
    each = ", ".join(f"{k}: {v:.2f} s" for k, v in took.items())
    verdict = "PASS" if worst < 1 else "FAIL"
    b.report.add(Row("add-workers answer, by the scan's state", f"max {worst:.2f} s ({each})",
                     goal="< 1 s", verdict=verdict, client=ONE_AT_A_TIME))  # fmt: skip


async def follow(b: Bench, config: ShimConfig, shim: Server) -> None:
    """7. Followers of live scans against as many clients polling GET /status once a second."""
    scans = b.live[: min(100, b.size.live // 50)]
    b.report.phase(f"{len(scans) * 10:,} followers of {len(scans)} scans")
    async with await kube.connect(b.kubeconfig) as k:
        got = await followers.measure(k, shim, config, b.ns, scans, 10, b.size.idle_seconds, 20.0)
    n, poll, changes = got["followers"], got["baseline_polling"], got["changing"]

    def cpu(figure: float) -> str:
        return f"{figure:g} % of a core"

    def delays(p: dict[str, float]) -> str:
        return f"p50 {p['p50_ms']:g} ms, p99 {p['p99_ms']:g} ms" if p else "no event arrived"

    what = f"shim CPU, {n:,} followers of {len(scans)} scans (GET /scan/{{id}}/events)"
    polled = f"{poll['shim_cpu_pct']:g} % ({poll['status_answered_per_s']:g} polls/s got through)"
    client = loadgen.PYTHON_CLIENT

    def add(what: str, figure: str, compared: str) -> None:
        b.report.add(Row(what, figure, compared, client=client))

    add(f"{what}, nothing changing", cpu(got["shim_cpu_following_idle_pct"]),
        f"{n:,} clients polling /status once a second: {polled}")  # fmt: skip
    add(f"{what}, 20 status PATCHes/s", cpu(got["shim_cpu_following_changing_pct"]),
        f"{changes['events_received']} of {changes['events_expected']} events")  # fmt: skip
    add("status PATCH on the API server → its event at each follower", delays(got["patch_to_event"]),
        f"to a watch of the API server: {delays(got['patch_to_api_server_watch_event'])}")  # fmt: skip
    add(f"shim RSS, {n:,} streams open", f"{got['shim_rss_following_mib']:g} MiB",
        f"{got['shim_rss_no_clients_mib']:g} MiB before")  # fmt: skip


async def dashboard(b: Bench, config: ShimConfig, shim: Server) -> None:
    """9. The dashboard's rows, in chromium, against the shim over the live scans."""
    b.report.phase("the dashboard in chromium")
    runs = 3 if b.size is QUICK else 7
    for f in await dashboard_bench.measure(shim.base, config.token, shim.pid, b.api, b.ns, runs):
        b.report.add(Row(f.what, f.figure, f.compared, goal=f.goal, verdict=f.verdict, client=f.client))


async def webhooks(b: Bench, op: Server) -> None:
    """10. Webhook deliveries: subscriptions over scans whose state keeps changing (webhooks_bench.py)."""
    b.report.phase("webhook deliveries")
    quick = b.size is QUICK
    f = await webhooks_bench.measure(
        b.api, b.ns, op.pid, subscriptions=200 if quick else 1000, scans=20 if quick else 100, rate=20,
        seconds=10 if quick else 30,
    )  # fmt: skip
    b.report.add(Row(f.what, f.figure, f.compared, goal=f.goal, verdict=f.verdict, client=f.client))


# ---------------------------------------------------------------- the archive


def archive_missing() -> str | None:
    """Why the archive benchmarks cannot run yet, or None."""
    if importlib.util.find_spec("skyscan.io.archive") is None:
        return "skyscan.io.archive (the archive) is not available yet"
    if importlib.util.find_spec("skyscan_local.postgres") is None and not harness.external_archive_dsn():
        return "skyscan_local.postgres (a local PostgreSQL) is not available yet"
    return None


async def sample(dsn: str, n: int) -> list[dict[str, Any]]:
    """About `n` archived scans picked at random: scan_id, run_id, event_id, classifier i."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT scan_id, run_id, event_id, (classifiers->>'i')::bigint AS i FROM scans"
            " ORDER BY random() LIMIT $1",
            n,
        )
    finally:
        await conn.close()
    return [dict(r) for r in rows]


async def archived(b: Bench, config: ShimConfig) -> None:
    """6. Archived reads and finds, `b.size.archived` scans COPYed into the archive."""
    if why := archive_missing():
        b.report.add(Row(f"archived reads and finds, {b.size.archived:,} archived", f"skipped: {why}"))
        return
    from skyscan.io.archive import Archive

    async with harness.postgres() as dsn:
        b.report.phase(f"COPY {b.size.archived:,} archived scans")
        archive = await Archive.connect(dsn)
        await archive.close()
        took = await history.load(dsn, b.ns, b.size.archived)
        b.report.note(f"archive load ({b.size.archived:,} scans, COPY): {json.dumps(took)}")
        picks = await sample(dsn, 500)
        with_archive = ShimConfig(
            **{**config.__dict__, "extra": {**config.extra, "SKYSCAN_ARCHIVE_DSN": dsn}}
        )
        label = f"{b.size.live:,} live + {b.size.archived:,} archived"
        async with harness.running(cold_start(b, with_archive, label)) as shim, b.session(config) as http:
            await archived_reads(b, http, shim, picks)
            await archived_finds(b, http, shim, picks, label)
            b.report.add(measured(f"shim RSS, {label}", harness.rss_mib(shim.pid), "MiB", "shim RSS, MiB"))


async def archived_reads(
    b: Bench, http: aiohttp.ClientSession, shim: Server, picks: list[dict[str, Any]]
) -> None:
    b.report.phase("GET manifest of archived scans")
    what = f"shim GET /scan/{{id}}/manifest of archived scans, {b.size.archived:,} archived"
    async with http.get(f"{shim.base}/scan/{picks[0]['scan_id']}/manifest") as r:
        if r.status != 200:
            b.report.add(Row(what, f"skipped: not available yet (the shim answers {r.status})"))
            return

    async def one(_: int) -> None:
        await get_ok(http, f"{shim.base}/scan/{random.choice(picks)['scan_id']}/manifest")

    elapsed, lat = await harness.load_loop(one, b.size.finds, 1)
    got = harness.stats(lat, elapsed)
    row = measured(what, got.p99_ms, "ms", "archived GET manifest p99, ms")
    b.report.add(Row(what, f"p99 {row.figure}, p50 {got.p50_ms:g} ms", goal=row.goal, verdict=row.verdict,
                     client=ONE_AT_A_TIME))  # fmt: skip


async def archived_finds(
    b: Bench, http: aiohttp.ClientSession, shim: Server, picks: list[dict[str, Any]], label: str
) -> None:
    b.report.phase("find over live + archived")
    if not await find(http, shim.base, {"classifiers.i": picks[0]["i"]}):
        b.report.add(
            Row(f"POST /scans/find over {label}", "skipped: not available yet (no archived answers)")
        )
        return
    for kind, text in (("run", "run_id + event_id"), ("classifier", "a classifier")):
        if kind == "run":
            old = [
                {"event_metadata.run_id": p["run_id"], "event_metadata.event_id": p["event_id"]}
                for p in picks
            ]
        else:
            old = [{"classifiers.i": p["i"]} for p in picks]
        filters = [f for pair in zip(live_filters(b, kind, len(old)), old, strict=False) for f in pair]
        got, empty = await timed_finds(http, shim.base, filters, b.size.finds)
        if empty:
            b.report.note(f"find by {text} over {label}: {empty} of {got.n} finds found nothing")
        row = measured(f"POST /scans/find by {text}, {label} (half each)", got.p99_ms, "ms",
                       "find p99 over live + archived, ms")  # fmt: skip
        b.report.add(Row(row.what, f"p99 {row.figure}, p50 {got.p50_ms:g} ms", goal=row.goal,
                         verdict=row.verdict, client=ONE_AT_A_TIME))  # fmt: skip


# ---------------------------------------------------------------- main


async def store_live(b: Bench) -> None:
    """The live Scans, created straight in the API server, and the time the operator took to see them."""
    n, limit = b.size.live, b.size.deadline_seconds / 3
    b.report.phase(f"storing {n:,} Scans with their events and reported status")
    began = time.monotonic()
    b.live = await harness.create_scans(b.api, b.ns, n, concurrency=CONCURRENCY, event=True)
    b.report.note(f"{n:,} Scans stored in {time.monotonic() - began:.0f} s")
    try:
        await harness.all_reconciled(b.api, b.ns, n, limit)
        b.report.note(f"the operator had seen them all {time.monotonic() - began:.0f} s after the first")
    except TimeoutError:
        b.report.note(f"the operator had not seen all {n:,} Scans {limit:.0f} s after they were stored")


async def run(size: Size, report: Report) -> None:
    # Without hey, stop now rather than after minutes of setting up.
    report.note(f"GET load client: {loadgen.client()} ({loadgen.binary()})")
    report.phase("control plane")
    async with AsyncExitStack() as stack:
        kubeconfig = await stack.enter_async_context(harness.control_plane())
        api = await stack.enter_async_context(await kube.connect(kubeconfig))
        ns = await stack.enter_async_context(harness.namespace(api))
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="skyscan-bench-")))
        b = Bench(size, api, kubeconfig, ns, workdir, report)
        config = ShimConfig.make(kubeconfig, ns, workdir)
        async with AsyncExitStack() as live:
            # The operator runs from the start: it reconciles the Scans while they are stored.
            wms = await live.enter_async_context(harness.running(harness.start_wms_simulator()))
            op = harness.start_operator(kubeconfig, ns, wms.base, **OPERATOR_SETTINGS)
            operator = await live.enter_async_context(harness.running(op))
            report.note(f"operator settings: {json.dumps(OPERATOR_SETTINGS)}")
            await store_live(b)
            # At rest, as a restarted shim finds 10,000 waiting scans (not racing the operator's
            # first pass over them on the same two cores).
            await settled(b)
            shim = await live.enter_async_context(
                harness.running(cold_start(b, config, f"{size.live:,} live"))
            )
            await report.section("GET manifest and status", reads(b, config, shim))
            await report.section("POST /scans/find over live scans", live_finds(b, config, shim))
            await report.section("POST /scans/find of a third, 4 at a time", broad_finds(b, config, shim))
            await report.section("POST /scan vs raw create", creates(b, config, shim))
            await report.section("RSS and idle CPU", idle(b, shim, operator))
            await report.section("Scan created → Job created", job_latency(b))
            await report.section("add-workers by workflow state", add_workers(b, config, shim, wms))
            await report.section("followers of live scans", follow(b, config, shim))
            await report.section("the dashboard in chromium", dashboard(b, config, shim))
            await report.section("webhook deliveries", webhooks(b, operator))
        await report.section("archived reads and finds", archived(b, config))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 live and 10,000 archived scans")
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # killed: still stop what we started
    before = harness.uptime()
    report = Report()
    try:
        asyncio.run(asyncio.wait_for(run(size, report), size.deadline_seconds))
    finally:
        after = harness.uptime()
        print(f"## Skyscan benchmarks ({'quick' if args.quick else 'full'}: {size.live:,} live, "
              f"{size.archived:,} archived; {time.monotonic() - report.began:.0f} s)\n")  # fmt: skip
        print(f"before: `{before}`  \nafter: `{after}`\n")
        print(markdown(report.rows))
        if report.notes:
            print("\n" + "\n".join(f"- {n}" for n in report.notes))
    return 0  # a goal missed is a finding (FAIL in the table), not a broken run


if __name__ == "__main__":
    sys.exit(main())
