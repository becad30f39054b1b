"""Fixtures for operator tests: the WMS simulator and the operator as real subprocesses, scoped to
the test's namespace, with short timers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from skyscan import model
from skyscan.io import payloads
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan.model import new_scan_id
from skyscan_local import control_plane as localcluster
from skyscan_local.processes import free_port
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import TAGS as SHIM_TAGS
from tests.unit.test_crd import minimal_spec

# Short timers: every lifecycle step is a fraction of a second to a few seconds.
FAST = {
    "SKYSCAN_BACKLOG_TICK_SECONDS": "0.3",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "0.3",
    "SKYSCAN_START_RETRY_DELAY_SECONDS": "1",
    "SKYSCAN_START_TIMEOUT_SECONDS": "30",
    "SKYSCAN_TEARDOWN_DELAY_SECONDS": "1",
    "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "0.5",
    "SKYSCAN_WMS_TIMEOUT_SECONDS": "2",
    "SKYSCAN_WMS_RETRIES": "2",
    "SKYSCAN_WMS_BACKOFF_SECONDS": "0.2",
    "SKYSCAN_QUEUE_POLL_SECONDS": "0.3",
    # An interrupted start (a WMS 5xx or outage, a quota) is tried again in a second, not the default 15 s.
    "SKYSCAN_OUTAGE_RETRY_DELAY_SECONDS": "0.5",
    "SKYSCAN_OUTAGE_RETRY_MAX_DELAY_SECONDS": "4",
    "SKYSCAN_REST_ADDRESS": "http://skyscan-shim.test:8080",
    # The operator fails a scan whose tag its catalog does not list: the tests' own Scans' and those a
    # test shim (tests/integration/shim) resolves requests to.
    "SKYSCAN_TAGS": json.dumps([minimal_spec()["dockerTag"], *SHIM_TAGS]),
    "SKYSCAN_SCANNER_EPHEMERAL_STORAGE": "",  # the kwok node advertises no ephemeral storage
    # One replica, killed and started again by tests: as a Pod restarted under its name, it takes its
    # Lease back at once (a new name would stand by until the old one's Lease expired).
    "SKYSCAN_LEASE_IDENTITY": "test-operator",
}
HOLD = {"SKYSCAN_SCANNER_POD_ANNOTATIONS": json.dumps({localcluster.HOLD_ANNOTATION: "true"})}


def _read_line(stream: IO[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if line:
            return line
    raise TimeoutError("no output")


@dataclass
class Simulator:
    url: str
    process: subprocess.Popen[str]

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            r = await http.request(method, path, json=body)
            r.raise_for_status()
            return r.json()

    async def workflows(self, marker: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await self.call("GET", "/_sim/workflows"))["workflows"]
        if marker is None:
            return found
        return [
            w
            for w in found
            if w["request"]["tasks"][0]["pilot_config"]["environment"]["SKYSCAN_REQUEST_ID"] == marker
        ]

    async def requests(self) -> list[tuple[str, str]]:
        return [tuple(r) for r in (await self.call("GET", "/_sim/requests"))["requests"]]


@pytest.fixture(scope="session")
def wms_process() -> Iterator[Simulator]:
    """One simulator a worker, not one a test: each cost about 0.44 s of CPU to start (39 tests)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "skyscan_local.wms_simulator", "--port", "0", "--activation-delay", "0.5",
         "--step-delay", "0.3"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = _read_line(process.stdout, 20).strip().rsplit(" ", 1)[-1]
        yield Simulator(url, process)
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def wms(wms_process: Simulator) -> Simulator:
    """The worker's simulator, reset: no workflows, requests or faults of an earlier test, its settings
    as started (the test's operators are stopped before the next test resets it)."""
    httpx.post(f"{wms_process.url}/_sim/reset", timeout=10).raise_for_status()
    return wms_process


class RestartableWMS(Simulator):
    """A simulator that can really go away: killed (SIGKILL, connections refused) and started again
    on the same port, remembering its workflows in a state file as the real WMS does."""

    def __init__(self, state_file: Path) -> None:
        self.port, self.state_file = free_port(), state_file
        super().__init__(f"http://127.0.0.1:{self.port}", self._spawn())

    def _spawn(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "skyscan_local.wms_simulator", "--port", str(self.port),
             "--activation-delay", "0.5", "--step-delay", "0.3", "--state-file", str(self.state_file)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert process.stdout is not None
        _read_line(process.stdout, 20)  # listening
        return process

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def restart(self) -> None:
        self.process = self._spawn()


@pytest.fixture
def restartable_wms(tmp_path: Path) -> Iterator[RestartableWMS]:
    sim = RestartableWMS(tmp_path / "wms-state.json")
    try:
        yield sim
    finally:
        sim.process.terminate()
        sim.process.wait(10)


@dataclass
class Operator:
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    logs: list[IO[bytes]] = field(default_factory=list)

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.logs.append(log)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skyscan_operator.handlers"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crashed or evicted operator."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        for log in self.logs:
            log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


OperatorFactory = Callable[..., Operator]


@pytest.fixture
def operator(cluster: Cluster, namespace: str, wms: Simulator, tmp_path: Path) -> Iterator[OperatorFactory]:
    """`operator(**env)` starts the operator for this test's namespace; extra settings as env."""
    started: list[Operator] = []

    def start(**overrides: str) -> Operator:
        env = {
            **os.environ,
            **FAST,
            "SKYSCAN_KUBECONFIG": cluster.kubeconfig,
            "SKYSCAN_NAMESPACE": namespace,
            "SKYSCAN_WMS_ADDRESS": wms.url,
            "SKYSCAN_LOG_LEVEL": "INFO",
            **{k if k.startswith("SKYSCAN_") else f"SKYSCAN_{k.upper()}": v for k, v in overrides.items()},
        }
        op = Operator(env=env, log_path=tmp_path / f"operator-{len(started)}.log")
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()
        print(f"--- {op.log_path.name} (shown when the test fails) ---\n{op.output()[-6000:]}")


# --- helpers for the tests ---


def scan_body(name: str, **spec_changes: Any) -> dict[str, Any]:
    return {"apiVersion": model.API_VERSION, "kind": "Scan", "metadata": {"name": name},
            "spec": minimal_spec(**spec_changes)}  # fmt: skip


def fresh_id() -> str:
    time.sleep(0.002)  # ids sort by creation in ms
    return new_scan_id(time.time(), os.urandom(10).hex())


EVENT = payloads.encode({"value": {"data": {"run_id": 1, "event_id": 2}}}, "event")


async def create_scan(
    api: Kube, namespace: str, name: str | None = None, *, event: bool = True, **spec: Any
) -> str:
    """A Scan and (unless `event` is False) its sensor event owned by it, as `POST /scan` writes them;
    the event id is the scan's name unless `sensorEventId` is given (an existing event is shared)."""
    name = name or fresh_id()
    spec.setdefault("sensorEventId", name)
    scan = await api.request("POST", scan_path(namespace), body=scan_body(name, **spec))
    if event:
        try:
            await payloads.create_event(api, namespace, spec["sensorEventId"], EVENT, owners=[scan])
        except KubeError as e:
            if e.status != 409:
                raise
            await payloads.add_event_owner(api, namespace, spec["sensorEventId"], scan)
    return name


async def get_scan(api: Kube, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = await api.request("GET", scan_path(namespace, name))
    return got


def st(scan: dict[str, Any]) -> dict[str, Any]:
    """The scan's status ({} before the operator wrote one)."""
    return scan.get("status") or {}


def condition(scan: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (scan.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


async def wait_scan(
    api: Kube,
    namespace: str,
    name: str,
    check: Callable[[dict[str, Any]], Any],
    timeout: float = 30,
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        scan = await get_scan(api, namespace, name)
        return scan if check(scan) else None

    found = await eventually(probe, timeout=timeout)
    assert found is not None
    return found


async def scan_events(api: Kube, namespace: str, name: str, *wanted: str) -> list[str]:
    """The reasons of the scan's Kubernetes Events, once all of `wanted` are among them (posted async)."""

    async def probe() -> list[str] | None:
        selector = {"fieldSelector": f"involvedObject.name={name}"}
        events = await api.request("GET", core_path("events", namespace), params=selector)
        reasons = [e["reason"] for e in events["items"]]
        return reasons if set(wanted) <= set(reasons) else None

    found = await eventually(probe, timeout=15)
    assert found is not None
    return found


async def scan_pod(api: Kube, namespace: str, name: str) -> dict[str, Any]:
    selector = {"labelSelector": f"skyscan.io/scan-id={name}"}
    pods = await api.request("GET", core_path("pods", namespace), params=selector)
    assert pods["items"], f"no pod for scan {name}"
    pod: dict[str, Any] = pods["items"][0]
    return pod


async def release_pod(api: Kube, namespace: str, name: str) -> None:
    """Lift the kwok hold: the scanner pod completes."""
    pod = await eventually(lambda: scan_pod(api, namespace, name))
    await api.request(
        "PATCH", core_path("pods", namespace, pod["metadata"]["name"]),
        body=[{"op": "remove", "path": "/metadata/annotations/skyscan.io~1kwok-hold"}],
        content_type="application/json-patch+json",
    )  # fmt: skip


async def watch_admissions(api: Kube, namespace: str, into: dict[str, float]) -> None:
    """Record (test clock) when each scan of the namespace is first seen admitted."""
    version = ""
    while True:
        try:
            async for event in api.watch(
                scan_path(namespace), {"resourceVersion": version, "timeoutSeconds": 120}
            ):
                scan = event["object"]
                if event["type"] == "ERROR":
                    version = ""
                    break
                version = scan["metadata"]["resourceVersion"]
                admitted = condition(scan, "Admitted").get("reason") in ("Admitted", "Started")
                if admitted and scan["metadata"]["name"] not in into:
                    into[scan["metadata"]["name"]] = time.monotonic()
        except KubeError:
            await asyncio.sleep(0.2)


async def running_scan(api: Kube, namespace: str, **spec: Any) -> dict[str, Any]:
    """A scan whose scanner pod is running (the operator must hold pods)."""
    name = await create_scan(api, namespace, **spec)
    return await wait_scan(
        api, namespace, name, lambda s: condition(s, "ScannerRunning").get("status") == "True"
    )
