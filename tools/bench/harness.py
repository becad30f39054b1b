"""The benchmarks' shared harness: a control plane, Scans stored straight in the API server, the shim,
the operator and the WMS simulator as real processes, a concurrent load loop, latency percentiles, and
a process's RSS and CPU read from /proc.

Every bench script imports it (`sys.path` has this folder when a script runs). It is also a small
command: `python harness.py serve-bytes PORT FILE` serves FILE's bytes at every GET path, the bare
aiohttp server the shim is compared with.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import loadgen
from aiohttp import web

from api_shim.auth import make_token
from skyscan import model, names
from skyscan.io import install, kube, payloads
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan_local import control_plane as localcluster
from skyscan_local import processes

HERE = Path(__file__).resolve().parent
TIMEOUT = aiohttp.ClientTimeout(total=120)
SHIM = "skyscan-shim"  # the shim's field manager
T = TypeVar("T")
Call = Callable[[int], Awaitable[None]]  # one request of a load loop, given its index

# ---------------------------------------------------------------- figures (pure)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of values sorted ascending: the smallest value
    with at least q % of all values at or below it (p99 of 100 values is the 99th, not the largest)."""
    if not ordered:
        raise ValueError("no values")
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} is not in (0, 100]")
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Stats:
    """Latencies of one measured kind of request, in milliseconds, and its throughput."""

    n: int
    per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "per_s": self.per_s, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms,
                "max_ms": self.max_ms}  # fmt: skip


def stats(latencies: Sequence[float], elapsed: float) -> Stats:
    """Stats of latencies (seconds) measured over `elapsed` wall seconds."""
    ordered = sorted(latencies)
    ms = [round(percentile(ordered, q) * 1000, 2) for q in (50, 99, 100)]
    return Stats(len(ordered), round(len(ordered) / elapsed, 1) if elapsed > 0 else 0.0, *ms)


# ---------------------------------------------------------------- /proc


def rss_mib(pid: int) -> float:
    """Resident memory of a running process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise ValueError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (the comm field may hold spaces: split after it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_percent(pid: int, seconds: float) -> float:
    """CPU a process uses over the next `seconds`, in % of one core."""
    before, began = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return round(100 * (cpu_seconds(pid) - before) / (time.monotonic() - began), 1)


def uptime() -> str:
    """`uptime`'s line (time, up, users, load average)."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


# ---------------------------------------------------------------- load


async def load_loop(call: Call, n: int, concurrency: int) -> tuple[float, list[float]]:
    """`call(i)` for i in range(n) from `concurrency` concurrent workers; (elapsed seconds, each
    call's latency in seconds)."""
    todo = iter(range(n))
    latencies: list[float] = []

    async def worker() -> None:
        for i in todo:
            start = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began, latencies


Measure = Callable[[int], Awaitable[tuple[float, list[float]]]]  # n requests: (elapsed s, latencies s)


def looped(call: Call, concurrency: int) -> Measure:
    """`call` from `concurrency` workers in this process (load_loop)."""

    async def measure(n: int) -> tuple[float, list[float]]:
        return await load_loop(call, n, concurrency)

    return measure


def hey_get(
    url: str, concurrency: int, headers: Mapping[str, str] | None = None, body: str | None = None
) -> Measure:
    """GETs of `url` (POSTs of the JSON `body`) by hey (loadgen), `concurrency` at a time."""

    async def measure(n: int) -> tuple[float, list[float]]:
        got = await loadgen.run(url, n, concurrency, headers, body)
        return got.elapsed, got.latencies

    return measure


async def interleaved(kinds: Mapping[str, Measure], n: int, warm: int, rounds: int = 4) -> dict[str, Stats]:
    """Each kind `n` times in all, in alternating rounds (a drift in the machine's load hits every kind
    alike), after a warm-up of `warm` requests of each."""
    for measure in kinds.values():
        await measure(warm)
    elapsed = dict.fromkeys(kinds, 0.0)
    latencies: dict[str, list[float]] = {name: [] for name in kinds}
    for round_ in range(rounds):
        for name in list(kinds) if round_ % 2 == 0 else list(reversed(list(kinds))):
            took, lat = await kinds[name](max(1, n // rounds))
            elapsed[name] += took
            latencies[name] += lat
    return {name: stats(latencies[name], elapsed[name]) for name in kinds}


async def side_by_side(
    kinds: Mapping[str, Call], n: int, concurrency: int, rounds: int = 4
) -> dict[str, Stats]:
    """interleaved() of calls made by this process, `concurrency` at a time."""
    measures = {name: looped(call, concurrency) for name, call in kinds.items()}
    return await interleaved(measures, n, 2 * concurrency, rounds)


async def eventually(probe: Callable[[], Awaitable[Any]], timeout: float, interval: float = 0.05) -> Any:
    """`probe()`'s first truthy answer, polled every `interval` seconds for at most `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        if answer := await probe():
            return answer
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer within {timeout} s")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------- control plane and Scans


@asynccontextmanager
async def control_plane() -> AsyncIterator[str]:
    """A kubeconfig with the CRD installed: SKYSCAN_TEST_KUBECONFIG's cluster when set, else a local
    control plane from the cached binaries, stopped afterwards."""
    if external := os.environ.get("SKYSCAN_TEST_KUBECONFIG"):
        await install.install(external)
        yield external
        return
    workdir = Path(tempfile.mkdtemp(prefix="skyscan-bench-"))
    state = await asyncio.to_thread(localcluster.start, workdir, tie_to_parent=True)
    try:
        await install.install(state.kubeconfig)
        yield state.kubeconfig
    finally:
        await asyncio.to_thread(localcluster.stop, workdir)
        await asyncio.to_thread(localcluster.remove, workdir)


async def on_control_plane(bench: Callable[[str], Awaitable[T]]) -> T:
    """`bench(kubeconfig)` on control_plane()."""
    async with control_plane() as kubeconfig:
        return await bench(kubeconfig)


@asynccontextmanager
async def namespace(api: Kube) -> AsyncIterator[str]:
    """A fresh namespace, ready for the operator's scanner Jobs; deleted afterwards."""
    name = f"bench-{secrets.token_hex(3)}"
    await api.request("POST", core_path("namespaces"), body={"metadata": {"name": name}})

    async def account() -> bool:
        try:
            await api.request("GET", core_path("serviceaccounts", name, "default"))
        except KubeError:
            return False
        return True

    try:
        await eventually(account, 30, 0.2)
        await install.ensure_scanner_account(api, name)
        yield name
    finally:
        await api.request("DELETE", core_path("namespaces", name=name))


def scan_spec(i: int, *, priority: int = 0) -> dict[str, Any]:
    """The spec of bench Scan `i` (its own sensor event, classifiers varied by i; `third`, i % 3, is
    shared by a third of them)."""
    return {
        "dockerTag": "4.1.0",
        "recoAlgo": "millipede_wilks",
        "sensorEventId": f"{i:032x}",
        "nsides": {"8": 0, "64": 12, "512": 24},
        "realOrSimulatedEvent": "real",
        "maxPixelRecoTime": 600,
        "requestClusters": [{"location": "osg", "nWorkers": 100}],
        "classifiers": {"origin": "bench", "i": i, "third": i % 3},
        "priority": priority,
    }


def scan_status(i: int) -> dict[str, Any]:
    """What a running scanner has reported for Scan `i`: progress and the event's run and event ids."""
    return {
        "progress": {
            "summary": "s" * 200,
            "epilogue": "",
            "tallies": {"a": 1},
            "processing_stats": {"start": {}, "runtime": {}},
        },
        "eventMetadata": {
            "runId": 100_000 + i // 10,
            "eventId": i,
            "eventType": "bench",
            "mjd": 60000.0,
            "isRealEvent": True,
        },
    }


def new_scan_name() -> str:
    return str(model.new_scan_id(time.time(), secrets.token_hex(10)))


POST_REQUEST = {  # what a client POSTs to /scan: a small sensor event with it, as clients send
    "docker_tag": "latest",
    "reco_algo": "millipede_wilks",
    "nsides": {"8": 0, "64": 12, "512": 24},
    "real_or_simulated_event": "real",
    "max_pixel_reco_time": 600,
    "request_clusters": {"osg": 10},
    "classifiers": {"origin": "bench-post"},
    "event_live_json": {"value": {"data": {"run_id": 1, "event_id": 2, "pulses": "x" * 2000}}},
}
EVENT = payloads.encode({"value": {"data": {"run_id": 1, "event_id": 2, "pulses": "x" * 500}}}, "event")


async def create_scan(
    api: Kube, ns: str, spec: dict[str, Any], *, status: dict[str, Any] | None = None,
    event: bool = False,
) -> str:  # fmt: skip
    """A Scan made straight in the API server (a raw create, as kubectl does); with its reported status
    and, when `event`, its sensor event owned by it, as `POST /scan` stores it, under the shim's field
    manager (the operator adds its own when it runs). Returns its name."""
    name = new_scan_name()
    body = {"apiVersion": model.API_VERSION, "kind": model.KIND, "metadata": {"name": name}, "spec": spec}
    scan = await api.request("POST", scan_path(ns), body=body)
    if status:
        await api.request(
            "PATCH", scan_path(ns, name, "status"), body={"status": status}, content_type=kube.MERGE_PATCH
        )
    if event:
        await payloads.create_event(api, ns, spec["sensorEventId"], EVENT, owners=[scan])
    return name


def create_calls(
    http: aiohttp.ClientSession, shim_url: str, api: Kube, ns: str, first: int, made: list[str]
) -> dict[str, Call]:
    """The two creates the benches compare, as load-loop calls: "post", `POST /scan` through the shim
    (the Scan and its event), and "raw", a Scan made straight in the API server (numbered from `first`).
    Each made Scan's name is appended to `made`."""

    async def post(_: int) -> None:
        async with http.post(f"{shim_url}/scan", json=POST_REQUEST) as r:
            if r.status != 200:
                raise AssertionError(f"POST /scan: {r.status} {await r.text()}")
            made.append((await r.json())["scan_id"])

    async def raw(i: int) -> None:
        made.append(await create_scan(api, ns, scan_spec(first + i)))

    return {"post": post, "raw": raw}


async def create_scans(
    api: Kube, ns: str, n: int, *, concurrency: int = 16, event: bool = False, first: int = 0
) -> list[str]:
    """Scans first..first+n-1 (scan_spec, scan_status), created concurrently; their names in order."""
    names: list[str] = [""] * n

    async def one(i: int) -> None:
        names[i] = await create_scan(
            api, ns, scan_spec(first + i), status=scan_status(first + i), event=event
        )

    await load_loop(one, n, concurrency)
    return names


async def scans_in(api: Kube, ns: str) -> list[dict[str, Any]]:
    """The Scans in `ns`, from the API server's watch cache (resourceVersion 0: no etcd read)."""
    listed = await api.request("GET", scan_path(ns), params={"resourceVersion": "0"})
    return list(listed["items"])


async def all_reconciled(api: Kube, ns: str, total: int, timeout: float) -> float:
    """Seconds until `total` Scans in `ns` have been seen by the operator (status.observedGeneration)."""
    began = time.monotonic()

    async def done() -> bool:
        seen = sum(1 for s in await scans_in(api, ns) if (s.get("status") or {}).get("observedGeneration"))
        return seen >= total

    await eventually(done, timeout, 5.0)
    return time.monotonic() - began


async def all_holding(api: Kube, ns: str, total: int, timeout: float) -> float:
    """Seconds until `total` Scans show the backlog's hold (Admitted=False, LowPriorityInterval): the
    operator has written everything it had to, and from then on nothing happens."""
    began = time.monotonic()

    async def done() -> bool:
        holding = 0
        async for page in kube.list_scans(api, ns):
            for scan in page:
                admitted = [
                    c for c in (scan.get("status") or {}).get("conditions") or [] if c["type"] == "Admitted"
                ]
                holding += bool(admitted) and admitted[0].get("reason") == "LowPriorityInterval"
        return holding >= total

    await eventually(done, timeout, 5.0)
    return time.monotonic() - began


async def created_to_job(api: Kube, ns: str, n: int, first: int) -> list[float]:
    """Seconds from creating a high-priority Scan (and its event) to its Job, for n Scans one after
    another (scan_spec first..first+n-1)."""
    took: list[float] = []
    for i in range(first, first + n):
        start = time.perf_counter()
        name = await create_scan(api, ns, scan_spec(i, priority=100), event=True)

        async def job(name: str = name) -> bool:
            jobs = await api.request(
                "GET",
                kube.path("batch/v1", "jobs", ns),
                params={"labelSelector": f"{names.SCAN_ID_LABEL}={name}"},
            )
            return bool(jobs["items"])

        await eventually(job, 60, 0.02)
        took.append(time.perf_counter() - start)
    return took


# ---------------------------------------------------------------- processes


def external_archive_dsn() -> str | None:
    """SKYSCAN_BENCH_ARCHIVE_DSN: an empty database of one's own for the archive benchmarks."""
    return os.environ.get("SKYSCAN_BENCH_ARCHIVE_DSN") or None


@asynccontextmanager
async def postgres() -> AsyncIterator[str]:
    """A DSN of an empty database: SKYSCAN_BENCH_ARCHIVE_DSN's, else a throw-away local PostgreSQL
    (skyscan_local.postgres, fsync off as in the tests), stopped and removed afterwards."""
    if dsn := external_archive_dsn():
        yield dsn
        return
    from skyscan_local import postgres as pg

    root = Path(tempfile.mkdtemp(prefix="skyscan-bench-pg-"))  # under /tmp: the server's user passes
    try:
        server = await asyncio.to_thread(pg.start, root, durable=False, tie_to_parent=True)
        try:
            yield await pg.create_database(server.dsn(), "bench")
        finally:
            await asyncio.to_thread(pg.stop, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Server:
    """A process of ours serving HTTP on 127.0.0.1:`port`."""

    proc: asyncio.subprocess.Process
    port: int
    started_at: float  # time.monotonic() at spawn

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_ok(self, path: str = "/healthz", timeout: float = 120.0) -> float:
        """Seconds from spawn until GET `path` answers 200 (polled every 10 ms)."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:

            async def ok() -> bool:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"pid {self.pid} exited with {self.proc.returncode} during start-up")
                try:
                    async with http.get(self.base + path) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(ok, timeout, 0.01)
        return time.monotonic() - self.started_at

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def spawn(
    args: Sequence[str], env: Mapping[str, str], port: int = 0, log: Path | None = None
) -> Server:
    """`python args...` with `env` over ours; killed if we die; its stdout discarded (banners), its
    stderr (the log) to `log` when given, as the local stack keeps it, else to ours."""
    with open(log, "ab") if log is not None else nullcontext() as stderr:  # noqa: ASYNC230 (no wait)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *args, env={**os.environ, **env}, stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr, preexec_fn=processes.die_with_parent,
        )  # fmt: skip
    return Server(proc, port, time.monotonic())


@dataclass(frozen=True)
class ShimConfig:
    """What a bench shim runs against, and the bearer token of its one user."""

    kubeconfig: str
    namespace: str
    token_file: Path
    token: str
    extra: Mapping[str, str]

    @classmethod
    def make(cls, kubeconfig: str, ns: str, workdir: Path, **extra: str) -> ShimConfig:
        token_file = workdir / "tokens.json"
        token = make_token(token_file, "bench", ["user"])
        return cls(kubeconfig, ns, token_file, token, extra)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def session(self, concurrency: int) -> aiohttp.ClientSession:
        """A client of the shim as its user, with up to `concurrency` connections."""
        connector = aiohttp.TCPConnector(limit=concurrency)
        return aiohttp.ClientSession(headers=self.headers, connector=connector, timeout=TIMEOUT)


def shim_env(config: ShimConfig, port: int) -> dict[str, str]:
    """The settings of a bench shim serving on 127.0.0.1:`port`."""
    return {
        "SKYSCAN_NAMESPACE": config.namespace,
        "SKYSCAN_KUBECONFIG": config.kubeconfig,
        "SKYSCAN_TOKEN_FILE": str(config.token_file),
        "SKYSCAN_HOST": "127.0.0.1",
        "SKYSCAN_PORT": str(port),
        "SKYSCAN_TAGS": '["latest"]',
        **config.extra,
    }


async def start_shim(config: ShimConfig, args: Sequence[str] = ("-m", "api_shim.app", "serve")) -> Server:
    """`skyscan-shim serve` (or `python args...` serving the shim app) on a free port, its log (an
    access line a request at INFO) in a file beside the token file; not waited for: `wait_ok` times its
    cold start."""
    port = processes.free_port()
    return await spawn(args, shim_env(config, port), port, config.token_file.parent / f"shim-{port}.log")


@asynccontextmanager
async def serving_shim(
    kubeconfig: str, ns: str, concurrency: int
) -> AsyncIterator[tuple[Server, aiohttp.ClientSession]]:
    """A shim over `ns`, answering /healthz, and a session of its user."""
    with tempfile.TemporaryDirectory() as tmp:
        config = ShimConfig.make(kubeconfig, ns, Path(tmp))
        async with running(start_shim(config)) as shim, config.session(concurrency) as http:
            await shim.wait_ok()
            yield shim, http


async def start_wms_simulator(activation_delay: float = 0.0) -> Server:
    port = processes.free_port()
    args = [
        "-m",
        "skyscan_local.wms_simulator",
        "--port",
        str(port),
        "--activation-delay",
        str(activation_delay),
    ]
    server = await spawn(args, {}, port)
    await listening(server)
    return server


async def listening(server: Server, timeout: float = 30.0) -> None:
    """Wait until `server` accepts connections."""

    async def up() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        except OSError:
            return False
        writer.close()
        return True

    await eventually(up, timeout, 0.05)


async def start_operator(
    kubeconfig: str,
    ns: str,
    wms: str,
    program: Sequence[str] = ("-m", "skyscan_operator.handlers"),
    **settings: str,
) -> Server:
    """The operator on namespace `ns` (`python program...`, the operator by default), its liveness
    endpoint on a free port (waited for)."""
    port = processes.free_port()
    env = {
        "SKYSCAN_KUBECONFIG": kubeconfig,
        "SKYSCAN_NAMESPACE": ns,
        "SKYSCAN_WMS_ADDRESS": wms,
        "SKYSCAN_LOG_LEVEL": "WARNING",
        "SKYSCAN_LIVENESS_ENDPOINT": f"http://127.0.0.1:{port}/healthz",
        "SKYSCAN_METRICS_PORT": str(processes.free_port()),  # served, as in production; never a taken port
        # The tags of the bench's Scans (`scan_spec`) and of its shim's (it stores `latest` as given):
        # the operator fails a scan whose tag is not in its catalog.
        "SKYSCAN_TAGS": json.dumps([scan_spec(0)["dockerTag"], "latest"]),
        **settings,
    }
    server = await spawn(program, env, port)
    await server.wait_ok(timeout=120)
    return server


@asynccontextmanager
async def running(start: Awaitable[Server]) -> AsyncIterator[Server]:
    server = await start
    try:
        yield server
    finally:
        await server.stop()


async def start_bare_server(body: bytes, workdir: Path) -> Server:
    """The bare aiohttp server (this file's `serve-bytes`) answering every GET with `body`."""
    path = workdir / f"bare-{secrets.token_hex(4)}.json"
    path.write_bytes(body)
    port = processes.free_port()
    server = await spawn([str(HERE / "harness.py"), "serve-bytes", str(port), str(path)], {}, port)
    await server.wait_ok("/", timeout=30)
    return server


def serve_bytes(port: int, path: Path) -> None:
    body = path.read_bytes()

    async def answer(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve-bytes"]:
        serve_bytes(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} serve-bytes PORT FILE")
