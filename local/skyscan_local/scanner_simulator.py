"""The scanner simulator: plays the skymap-scanner server for the held scanner Pods of a local cluster.

kwok runs no containers. The local stack (SIMULATE_SCANNER=1) makes the operator annotate scanner
Pods with `skyscan.io/kwok-hold`, so kwok keeps them Running; this process watches those Pods and,
for each, does what the real server does against the REST API (wms-and-scanner notes C and D):

1. reads the server's env and args from the Pod (REST address, scan id, token - from the Secret
   when the Job references one, read with the simulator's own client as the kubelet would - and
   `--nsides`, `--real-event`, `--client-startup-json`);
2. starts the Pod's startup.json sidecar (its native-sidecar init container): the REAL program,
   `python -m skyscan.io.sidecar`, as a subprocess with the Pod's env (the same token) and the Pod's
   `/common-space` mapped to a temporary directory of its own; restarted when it fails, terminated
   when the Pod ends, as the kubelet does;
3. GET /scan/{id}/manifest as `system` for the event (retrying like the scanner's urgent client),
   "extracts" it and writes a realistic startup.json (100-530 KB of GCD-like JSON) for the sidecar
   to upload - the WMS simulator's workers fetch it through their presigned URL before they run;
4. PATCHes its start-up progress with event_metadata and scan_metadata;
5. polls GET /scan/{id}/ewms/workforce until workers run;
6. per nside: sends out the pixels the real scanner would (`skyscan_local.skymap`: the whole sky at the
   coarsest nside, 768 pixels at nside 8, then the neighbourhood of the best fit so far, refined) with
   a forced report (PATCH + PUT), then the pixels finish in `batches_per_nside` batches, one every
   `reco_seconds`: a forced report on each nside's first, otherwise PATCH/PUT on their intervals. The
   results are in icecube-skyreader's serialization: an llh landscape around a true direction drawn
   per event, about 0.4-0.5 MB when final for the default progression;
7. PUTs the final result, PATCHes the final progress, and lifts the hold so kwok completes the Pod.

It speaks the reference's wire names, as IceCube's server does (docs/rest-api/reference-names.md): the event
is the manifest's `event_i3live_json_dict`, workers are awaited on `/ewms/workforce`, results are
PUT as `skyscan_result`, and the kill switch reads `ewms_deactivated`.

A kill switch polls GET /scan/{id}/status; a deleted or WMS-deactivated scan makes the "server" exit
130 (the Pod fails, as after SIGINT). `python -m skyscan_local.scanner_simulator`; settings
`SKYSCAN_SCANNER_SIM_*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from skyscan import names
from skyscan.io import kube
from skyscan.io.kube_errors import Gone, KubeError
from skyscan_local import control_plane as localcluster
from skyscan_local import processes, scanner_report, skymap
from skyscan_local.scanner_pod import ScannerExit, ScannerSimSettings, ServerPod, is_playable, read_server_pod
from skyscan_local.scanner_report import ScanTally

log = logging.getLogger("skyscan_local.scanner_simulator")
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
READY_LINE = "scanner simulator watching scanner pods"
BASELINE_GCD_DIR = "/cvmfs/icecube.opensciencegrid.org/users/RealTime/GCD/PoleBaseGCDs"
# What the Skyscan image's own ENV gives the sidecar besides the Pod's env (see the Dockerfile).
IMAGE_ENV = {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def startup_json(scan_id: str, event_metadata: dict[str, Any]) -> dict[str, Any]:
    """A startup.json shaped and sized like the real scanner's (100-530 KB): the baseline GCD file and
    the event's GCDQp frame packet, here a geometry of 5160 DOMs and a few thousand pulses."""
    rng = random.Random(scan_id)
    geometry = [
        [
            string,
            om,
            round(rng.uniform(-600, 600), 2),
            round(rng.uniform(-600, 600), 2),
            round(500 - 17 * om, 2),
        ]
        for string in range(1, 87)
        for om in range(1, 61)
    ]
    pulses = [
        [
            rng.randint(1, 86),
            rng.randint(1, 60),
            round(rng.uniform(9000, 20000), 1),
            round(rng.expovariate(1), 3),
        ]
        for _ in range(rng.randint(300, 7000))
    ]
    return {
        "baseline_GCD_file": f"{BASELINE_GCD_DIR}/baseline_gcd.i3",
        "GCDQp_packet": [
            {"frame_type": "G", "I3Geometry": geometry},
            {"frame_type": "C", "I3Calibration": {"start_time": 0, "dom_count": len(geometry)}},
            {"frame_type": "D", "BadDomsList": sorted(rng.sample(range(5160), 40))},
            {
                "frame_type": "Q",
                "I3EventHeader": {k: event_metadata.get(k) for k in ("run_id", "event_id", "mjd")},
            },
            {"frame_type": "P", "SplitUncleanedInIcePulses": pulses},
        ],
    }


class Rest:
    """The scanner's two REST behaviours: urgent calls retry, non-urgent ones are fire-and-forget."""

    def __init__(self, http: httpx.AsyncClient, settings: ScannerSimSettings) -> None:
        self.http, self.settings = http, settings

    async def urgent(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + self.settings.urgent_retry_seconds
        delay = 0.3
        while True:
            try:
                r = await self.http.request(method, path, json=body)
                if r.status_code not in RETRY_STATUSES:
                    if r.is_error:
                        raise ScannerExit(1, f"{method} {path}: HTTP {r.status_code} {r.text[:300]}")
                    return r.json()
                why = f"HTTP {r.status_code}"
            except httpx.TransportError as e:
                why = repr(e)
            if time.monotonic() + delay > deadline:
                raise ScannerExit(1, f"{method} {path} kept failing: {why}")
            log.warning("%s %s failed (%s); retrying in %.1fs", method, path, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def nonurgent(self, method: str, path: str, body: Any = None) -> None:
        try:
            r = await self.http.request(method, path, json=body)
        except httpx.HTTPError as e:  # the real scanner logs and carries on
            log.warning("%s %s failed, ignored: %r", method, path, e)
            return
        if r.is_error:
            log.warning("%s %s failed, ignored: HTTP %d %s", method, path, r.status_code, r.text[:300])

    async def get(self, path: str) -> Any:
        """The workforce and kill-switch polls: the non-urgent client's one retry (after 0.6 s), then
        the error is the server's, as the real one's."""
        for retry in (True, False):
            try:
                r = await self.http.get(path)
                if r.status_code not in RETRY_STATUSES or not retry:
                    r.raise_for_status()
                    return r.json()
            except httpx.TransportError:
                if not retry:
                    raise
            await asyncio.sleep(0.6)


async def run_sidecar(pod: ServerPod, settings: ScannerSimSettings) -> None:
    """The native sidecar for the Pod's lifetime: the real program, restarted when it fails (the
    kubelet's restartPolicy Always), terminated with SIGTERM when cancelled (the Pod ended)."""
    assert pod.sidecar is not None
    settle = settings.sidecar_settle_seconds
    argv = [sys.executable, "-m", "skyscan.io.sidecar", *pod.sidecar.args,
            "--settle-seconds", str(settle), "--poll-seconds", str(settle / 5)]  # fmt: skip
    while True:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env={**IMAGE_ENV, **pod.sidecar.env},
            stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=processes.die_with_parent,  # a Pod's containers end with it, even on a SIGKILL
        )
        try:
            code = await proc.wait()
        except asyncio.CancelledError:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            raise
        log.warning("pod %s: sidecar exited %d; restarting it", pod.pod_name, code)
        await asyncio.sleep(settings.sidecar_restart_seconds)


class ScannerServer:
    """One simulated scanner server run, for one Pod."""

    def __init__(self, pod: ServerPod, rest: Rest, settings: ScannerSimSettings) -> None:
        self.pod, self.rest, self.settings = pod, rest, settings
        self.scan = f"/scan/{pod.scan_id}"
        self.tally = ScanTally(
            nsides=pod.args.nsides,
            estimates=skymap.estimated_pixels(pod.args.nsides),
            position_variations=settings.position_variations,
            started=time.time(),
        )
        self.event_metadata: dict[str, Any] = {}
        self.sky: skymap.ScanSky | None = None  # once the event is known
        self.last_patch = self.last_put = 0.0

    async def run(self) -> None:
        manifest = await self.rest.urgent("GET", f"{self.scan}/manifest")
        event = manifest.get("event_i3live_json_dict")  # the real server's name (SKYSCAN_SCANNER_NAMES)
        if not isinstance(event, dict):
            raise ScannerExit(1, "the manifest holds no event (is the token a `system` one?)")
        self.event_metadata = scanner_report.event_metadata(event, self.pod.args.real_event)
        truth = skymap.true_event(self.event_metadata)
        self.sky = skymap.ScanSky(truth, self.pod.scan_id, self.pod.args.nsides)
        log.info(
            "scan %s: event fetched (run %s); extracting", self.pod.scan_id, self.event_metadata["run_id"]
        )
        await asyncio.sleep(self.settings.startup_seconds)
        # The workers' startup.json: the sidecar uploads it; the scanner itself goes on at once.
        data = json.dumps(startup_json(self.pod.scan_id, self.event_metadata)).encode()
        self.pod.startup_json.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.pod.startup_json.write_bytes, data)
        log.info("scan %s: wrote %s (%d bytes)", self.pod.scan_id, self.pod.startup_json, len(data))
        # The kill switch runs beside the scan and ends it (the real server SIGINTs itself).
        scan = asyncio.create_task(self.play())
        kill_switch = asyncio.create_task(self.kill_switch())
        try:
            done, _ = await asyncio.wait({scan, kill_switch}, return_when=asyncio.FIRST_COMPLETED)
            for task in (kill_switch, scan):
                if task in done:
                    task.result()  # re-raises the ScannerExit (or crash) that ended it
        finally:
            for task in (scan, kill_switch):
                task.cancel()
            await asyncio.gather(scan, kill_switch, return_exceptions=True)

    async def play(self) -> None:
        await self.report("The Skymap Scanner has started up.", "", put=False)
        await self.wait_for_workers()
        log.info("scan %s: workers are running; scanning %s", self.pod.scan_id, list(self.tally.nsides))
        sky = self.sky
        assert sky is not None
        for nside in self.tally.nsides:
            sent = sky.send(nside)  # chosen around the best fit of the nsides before
            self.tally.send(nside, sent)
            await self.report(
                f"The Skymap Scanner has sent out {sent} pixels and is waiting to receive recos.",
                "I will report back when I start getting recos." if not self.tally.done_pixels else "",
                put=True,
            )
            batches = min(self.settings.batches_per_nside, sent)
            for batch in range(batches):
                await asyncio.sleep(self.settings.reco_seconds)
                count = sent * (batch + 1) // batches - sent * batch // batches
                sky.finish(nside, count)
                first = self.tally.recos_done(nside, count, time.time())
                await self.report(
                    "The Skymap Scanner is busy scanning pixels.",
                    f"I will report back again in {self.settings.progress_interval_seconds:g} seconds "
                    "if I have an update.",
                    put=True,
                    forced=first,
                )
        final = sky.result(self.event_metadata, final=True)
        await self.rest.urgent("PUT", f"{self.scan}/result", {"skyscan_result": final, "is_final": True})
        body = self.manifest_patch("The Skymap Scanner has finished.", "", final=True)
        await self.rest.urgent("PATCH", f"{self.scan}/manifest", body)
        log.info("scan %s: final result sent (%d pixels)", self.pod.scan_id, self.tally.done_pixels)

    async def wait_for_workers(self) -> None:
        """Poll the workforce, as the real server does (the REST API is its only view of the WMS)."""
        while True:
            workforce = await self.rest.get(f"{self.scan}/ewms/workforce")
            if workforce.get("n_running"):
                return
            await asyncio.sleep(self.settings.workforce_poll_seconds)

    def manifest_patch(self, summary: str, epilogue: str, *, final: bool = False) -> dict[str, Any]:
        progress = scanner_report.progress(
            self.tally,
            time.time(),
            summary,
            epilogue,
            final=final,
            threshold=self.pod.args.predictive_scanning_threshold,
        )
        return {
            "progress": progress,
            "event_metadata": self.event_metadata,
            "scan_metadata": scanner_report.scan_metadata(
                self.pod.scan_id, self.tally.nsides, self.tally.position_variations
            ),
        }

    async def report(self, summary: str, epilogue: str, *, put: bool, forced: bool = True) -> None:
        """A PATCH (and a PUT) now when forced, else only when its interval has passed."""
        now = time.monotonic()
        if forced or now - self.last_patch >= self.settings.progress_interval_seconds:
            self.last_patch = now
            await self.rest.nonurgent(
                "PATCH", f"{self.scan}/manifest", self.manifest_patch(summary, epilogue)
            )
        if put and (forced or now - self.last_put >= self.settings.result_interval_seconds):
            self.last_put = now
            partial = self.sky.result(self.event_metadata, final=False) if self.sky else {}
            await self.rest.nonurgent(
                "PUT", f"{self.scan}/result", {"skyscan_result": partial, "is_final": False}
            )

    async def kill_switch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.kill_switch_seconds)
            try:
                status = await self.rest.get(f"{self.scan}/status")
            except httpx.HTTPError as e:
                log.warning("scan %s: kill-switch check failed: %r", self.pod.scan_id, e)
                continue
            if status.get("is_deleted") or status.get("ewms_deactivated"):
                raise ScannerExit(130, "kill switch: the scan is deleted or its workflow deactivated")


class PodPlayer:
    """Watches scanner Pods and runs one `ScannerServer` per held, running Pod."""

    def __init__(self, api: kube.Kube, settings: ScannerSimSettings) -> None:
        self.api, self.settings = api, settings
        self.pods = kube.core_path("pods", settings.namespace)
        self.running: dict[str, asyncio.Task[None]] = {}
        self.finished: set[str] = set()

    async def watch_pods(self, ready: asyncio.Event | None = None) -> None:
        version = ""
        while True:
            try:
                if not version:
                    listed = await self.api.request(
                        "GET", self.pods, params={"labelSelector": names.SCANNER_SELECTOR}
                    )
                    version = listed["metadata"]["resourceVersion"]
                    for pod in listed["items"]:
                        self.consider("ADDED", pod)
                    if ready is not None and not ready.is_set():
                        print(f"{READY_LINE} in namespace {self.settings.namespace}", flush=True)
                        ready.set()
                params: kube.Params = {
                    "labelSelector": names.SCANNER_SELECTOR, "resourceVersion": version,
                    "timeoutSeconds": 300, "allowWatchBookmarks": True,
                }  # fmt: skip
                async for event in self.api.watch(self.pods, params):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = "" if obj.get("code") == 410 else version
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.consider(event["type"], obj)
            except KubeError as e:
                if isinstance(e, Gone):
                    version = ""
                log.warning("pod watch: %s; re-listing", e)
                await asyncio.sleep(1)
            except (TimeoutError, OSError, aiohttp.ClientError) as e:
                # The API server restarting cuts the stream mid-chunk (a ClientPayloadError): watch again.
                log.warning("pod watch interrupted: %r", e)
                await asyncio.sleep(1)

    def consider(self, event_type: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if event_type == "DELETED" or (pod["metadata"].get("deletionTimestamp")):
            self.finished.discard(uid)
            if task := self.running.pop(uid, None):
                task.cancel()
            return
        if is_playable(pod) and uid not in self.running and uid not in self.finished:
            self.running[uid] = asyncio.create_task(self.play(pod))

    async def play(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        code = 0
        workdir = Path(tempfile.mkdtemp(prefix=f"skyscan-sim-{name}-"))  # the Pod's /common-space
        sidecar: asyncio.Task[None] | None = None
        try:
            server_pod = await read_server_pod(self.api, self.settings.namespace, pod, self.settings, workdir)
            if server_pod.sidecar is not None:  # native sidecars start before the Pod's containers
                sidecar = asyncio.create_task(run_sidecar(server_pod, self.settings))
            else:
                log.warning("pod %s has no startup.json sidecar: workers cannot get startup.json", name)
            headers = {"Content-Type": "application/json"}
            if server_pod.token:
                headers["Authorization"] = f"Bearer {server_pod.token}"
            async with httpx.AsyncClient(
                base_url=server_pod.address, headers=headers, timeout=self.settings.request_timeout_seconds
            ) as http:
                log.info("pod %s: playing the scanner server of scan %s", name, server_pod.scan_id)
                await ScannerServer(server_pod, Rest(http, self.settings), self.settings).run()
        except ScannerExit as e:
            code = e.code
            log.warning("pod %s: scanner server exits %d: %s", name, code, e)
        except asyncio.CancelledError:
            log.info("pod %s: deleted while scanning", name)
            raise
        except Exception:
            log.exception("pod %s: scanner server crashed", name)
            code = 1
        finally:
            self.running.pop(pod["metadata"]["uid"], None)
            if sidecar is not None:
                sidecar.cancel()
                await asyncio.gather(sidecar, return_exceptions=True)
            shutil.rmtree(workdir, ignore_errors=True)
        self.finished.add(pod["metadata"]["uid"])
        await self.end_pod(name, code)

    async def end_pod(self, name: str, code: int) -> None:
        """Exit 0 lifts the hold (kwok completes the Pod); otherwise kwok fails it with `code`."""
        if code == 0:
            patch: Any = [
                {
                    "op": "remove",
                    "path": "/metadata/annotations/" + localcluster.HOLD_ANNOTATION.replace("/", "~1"),
                }
            ]
            content_type = "application/json-patch+json"
        else:
            fail = localcluster.FAIL_LABEL
            patch = {
                "metadata": {
                    "labels": {fail: "true"},
                    "annotations": {
                        f"{fail}/reason": "Error",
                        f"{fail}/exit-code": str(code),
                        f"{fail}/message": "the scanner server exited",
                    },
                }
            }
            content_type = "application/merge-patch+json"
        for delay in (0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8):  # the API server may be restarting: a minute
            try:
                await self.api.request("PATCH", f"{self.pods}/{name}", body=patch, content_type=content_type)
                return
            except KubeError as e:
                if e.status in (404, 422):  # gone already, or the hold already lifted
                    return
                if e.status < 500:
                    raise
            except (OSError, TimeoutError, aiohttp.ClientError) as e:
                log.warning("pod %s: cannot end it yet (%r); retrying in %ss", name, e, delay)
            await asyncio.sleep(delay)


async def serve(settings: ScannerSimSettings) -> None:
    async with await kube.connect(settings.kubeconfig) as api:
        await PodPlayer(api, settings).watch_pods(asyncio.Event())


def main(argv: list[str] | None = None) -> int:
    if argv or (argv is None and len(sys.argv) > 1):
        print(__doc__, "\nSettings:", file=sys.stderr)
        for name, f in ScannerSimSettings.model_fields.items():
            print(
                f"  SKYSCAN_SCANNER_SIM_{name.upper()} (default {f.default!r}): {f.description}",
                file=sys.stderr,
            )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(ScannerSimSettings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
