"""Webhook deliveries under load (issue 32): subscriptions over scans whose state keeps changing, each
delivery timed from the status change that caused it to its arrival at a receiver, and the operator's
CPU meanwhile.

The scans are ones the operator failed (and leaves be), whose final result a writer turns on and off,
round robin, `rate` changes a second: each change puts every scan in another state (ABORTED__PRESTARTUP
or SCAN_HAS_FINAL_RESULT) that each of its subscriptions wants. The receiver (aiohttp, in this process)
answers 204 at once and notes each event's first arrival (repeats, by webhook-id, are counted apart).

    python tools/bench/webhooks_bench.py [--subscriptions 1000 --scans 100 --rate 20 --seconds 30]

Alone it starts a control plane, the WMS simulator and the operator of its own; `make bench` runs
`measure` against the suite's operator.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

from skyscan import conditions as cond
from skyscan import subscription as sub
from skyscan.io import install, kube
from skyscan.io.kube import Kube, scan_path
from skyscan.scan_record import ScanRecord
from skyscan_local.processes import free_port

GOAL_SECONDS = 1.0  # p99, status change -> delivery
FINAL = "SCAN_HAS_FINAL_RESULT"
UNKNOWN_TAG = "0.0.1"  # in no operator's catalog (`harness.start_operator`)
# What the operator needs to deliver to the receiver beside it.
OPERATOR_SETTINGS = {
    "SKYSCAN_WEBHOOK_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
    "SKYSCAN_WEBHOOK_ALLOWED_NETWORKS": json.dumps(["127.0.0.0/8"]),
    "SKYSCAN_WEBHOOK_PLAIN_HTTP": "true",
}


@dataclass(frozen=True)
class Figure:
    what: str
    figure: str
    compared: str
    goal: str
    verdict: str
    client: str = "a writer in this process (merge patches), an aiohttp receiver in this process"


@dataclass
class Receiver:
    arrived: dict[str, tuple[float, str, str]] = field(default_factory=dict)  # id -> (when, scan, state)
    repeats: int = 0

    async def hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        when = time.time()
        event_id = request.headers.get("webhook-id", "")
        if event_id in self.arrived:
            self.repeats += 1
        else:
            event = json.loads(body)
            self.arrived[event_id] = (when, event["subject"], event["data"]["scan_state"])
        return web.Response(status=204)


async def failed_scans(api: Kube, ns: str, n: int) -> list[str]:
    """`n` scans the operator has failed (an image tag not in its catalog: InvalidSpec) and then leaves
    be: their state changes only when the bench changes it."""
    names: list[str] = [""] * n

    async def one(i: int) -> None:
        names[i] = await harness.create_scan(api, ns, {**harness.scan_spec(i), "dockerTag": UNKNOWN_TAG})

    await harness.load_loop(one, n, 16)

    async def all_failed() -> bool:
        scans = await harness.scans_in(api, ns)
        failed = {s["metadata"]["name"] for s in scans if ScanRecord(s).condition_true(cond.FAILED)}
        return failed >= set(names)

    await harness.eventually(all_failed, 600, interval=0.5)
    return names


async def subscribe_all(api: Kube, ns: str, url: str, scans: list[str], n: int) -> list[str]:
    """`n` subscriptions, each to one scan (round robin), both states; their secrets in one write."""
    await install.ensure_webhook_secrets(api, ns)
    secret = sub.SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()
    stored = base64.b64encode(secret.encode()).decode()  # a Secret's data: base64
    names = [f"bench-{i}" for i in range(n)]
    await api.request(
        "PATCH",
        kube.core_path("secrets", ns, sub.SECRET_NAME),
        body={"data": dict.fromkeys(names, stored)},
        content_type=kube.MERGE_PATCH,
    )

    async def one(i: int) -> None:
        body = {
            "apiVersion": sub.API_VERSION, "kind": sub.KIND, "metadata": {"name": names[i]},
            "spec": {"url": url, "secretRef": {"key": names[i]}, "states": [FINAL, "ABORTED"],
                     "scanIds": [scans[i % len(scans)]]},
        }  # fmt: skip
        await api.request("POST", kube.path(sub.API_VERSION, sub.PLURAL, ns), body=body)

    await harness.load_loop(one, n, 16)
    return names


async def taken_up(api: Kube, ns: str, n: int, timeout: float) -> None:
    """Until the operator has written each subscription's status once (it holds them all)."""

    async def probe() -> bool:
        listed = await api.request(
            "GET", kube.path(sub.API_VERSION, sub.PLURAL, ns), params={"resourceVersion": "0"}
        )
        return sum("backlog" in (o.get("status") or {}) for o in listed["items"]) >= n

    await harness.eventually(probe, timeout, interval=0.5)


async def outcomes(api: Kube, ns: str) -> str:
    """What the subscriptions' statuses say (as last written: up to 15 s behind) of failed attempts, events
    given up and pending."""
    listed = await api.request("GET", kube.path(sub.API_VERSION, sub.PLURAL, ns))
    found = [sub.status_of(o) or sub.SubscriptionStatus() for o in listed["items"]]
    failures, given_up, pending = (
        sum(getattr(s, k) for s in found) for k in ("failures", "given_up", "backlog")
    )
    return f"statuses: {failures} failed attempts, {given_up} given up, {pending} pending"


async def measure(
    api: Kube, ns: str, op_pid: int, *, subscriptions: int, scans: int, rate: float, seconds: float
) -> Figure:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.hook)
    runner, port = web.AppRunner(app, access_log=None), free_port()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        names = await failed_scans(api, ns, scans)
        await subscribe_all(api, ns, f"http://127.0.0.1:{port}/hook", names, subscriptions)
        await taken_up(api, ns, subscriptions, 600)
        # A scan's failure recorded in the same second a subscription was made counts as news to it
        # (subscriptions start from their creationTimestamp, whole seconds): those arrive before the
        # clock starts.
        settle = time.monotonic()
        while time.monotonic() - settle < 60:
            before = len(receiver.arrived)
            await asyncio.sleep(2)
            if len(receiver.arrived) == before:
                break
        arrived_before = set(receiver.arrived)
        changes: dict[tuple[str, str], list[float]] = {}  # (scan, state it entered) -> when, in order
        final = dict.fromkeys(names, False)
        cpu = asyncio.create_task(harness.cpu_percent(op_pid, seconds))
        writes: list[asyncio.Task[object]] = []  # sent on time, not after the one before is answered
        began, n = time.monotonic(), 0
        while time.monotonic() - began < seconds:
            scan = names[n % len(names)]
            final[scan] = not final[scan]
            state = FINAL if final[scan] else "ABORTED__PRESTARTUP"
            at = time.time()
            result = {"isFinal": final[scan], "updatedAt": at}
            patch = api.request(
                "PATCH",
                scan_path(ns, scan, "status"),
                body={"status": {"result": result}},
                content_type=kube.MERGE_PATCH,
            )
            writes.append(asyncio.create_task(patch))
            changes.setdefault((scan, state), []).append(at)
            n += 1
            await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
        await asyncio.gather(*writes)
        operator_cpu = await cpu
        load = os.getloadavg()[0]
        expected = n * (subscriptions // scans)

        def late() -> int:
            return expected - (len(receiver.arrived) - len(arrived_before))

        with contextlib.suppress(TimeoutError):  # what is still missing then is reported missing

            async def all_in() -> bool:
                return late() <= 0

            await harness.eventually(all_in, 120, interval=0.5)
        delays = []
        for event_id, (when, scan, state) in receiver.arrived.items():
            if event_id in arrived_before or (scan, state) not in changes:
                continue
            caused = [t for t in changes[(scan, state)] if t <= when]  # the latest change into that state
            if caused:
                delays.append(when - caused[-1])
        delays.sort()
        p50, p99 = harness.percentile(delays, 50), harness.percentile(delays, 99)
        tallies = await outcomes(api, ns)
    finally:
        await runner.cleanup()
    what = (
        f"webhooks: {subscriptions:,} subscriptions over {scans} scans, {rate:g} changes/s for {seconds:g} s"
    )
    return Figure(
        what,
        f"status change → delivery p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
        f"{len(delays):,} of {expected:,} delivered, {max(0, late()):,} missing, {receiver.repeats} repeats "
        f"({tallies})",
        f"operator CPU {operator_cpu:.0f} % of a core while changing (load {load:.1f})",
        f"p99 < {GOAL_SECONDS:g} s",
        "PASS" if p99 < GOAL_SECONDS and late() <= 0 else "FAIL",
    )


async def main_async(args: argparse.Namespace) -> Figure:
    async with harness.control_plane() as kubeconfig, await kube.connect(kubeconfig) as api:
        async with (
            harness.namespace(api) as ns,
            harness.running(harness.start_wms_simulator()) as wms,
            harness.running(harness.start_operator(kubeconfig, ns, wms.base, **OPERATOR_SETTINGS)) as op,
        ):
            return await measure(
                api,
                ns,
                op.pid,
                subscriptions=args.subscriptions,
                scans=args.scans,
                rate=args.rate,
                seconds=args.seconds,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--scans", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="status changes a second (all scans)")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    before = harness.uptime()
    found = asyncio.run(main_async(args))
    print(f"before: `{before}`  \nafter: `{harness.uptime()}`\n")
    print(f"| {found.what} | {found.figure} | {found.compared} | {found.goal} | {found.verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
