"""The whole stack for end-to-end tests: `skyscan_local.stack` itself starts the WMS simulator, the shim,
the operator and the scanner simulator as real processes against the session cluster, in one namespace
of their own, with short timers. Tests talk to it as users do: REST over HTTP, and kubectl."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan_local import postgres
from skyscan_local import stack as localstack
from tests.conftest import ArchiveServer, Cluster
from tests.helpers import eventually

if TYPE_CHECKING:
    from tests.e2e.own_cluster import OwnCluster

REPO = Path(__file__).resolve().parents[2]
KUBECTL = os.environ.get("KUBECTL", "kubectl")

# Every step takes a fraction of a second; a scan runs in a few seconds.
FAST = {
    "SKYSCAN_BACKLOG_TICK_SECONDS": "0.3",
    "SKYSCAN_LOW_PRIORITY_INTERVAL_SECONDS": "0.3",
    "SKYSCAN_TEARDOWN_DELAY_SECONDS": "1",
    "SKYSCAN_WMS_POLL_INTERVAL_SECONDS": "0.5",
    "SKYSCAN_QUEUE_POLL_SECONDS": "0.3",
    "SKYSCAN_WMS_SIM_ACTIVATION_DELAY": "0.5",
    "SKYSCAN_WMS_SIM_STEP_DELAY": "0.3",
    "SKYSCAN_SCANNER_SIM_STARTUP_SECONDS": "0.2",
    "SKYSCAN_SCANNER_SIM_RECO_SECONDS": "0.2",
    "SKYSCAN_SCANNER_SIM_BATCHES_PER_NSIDE": "3",
    "SKYSCAN_SCANNER_SIM_PROGRESS_INTERVAL_SECONDS": "0.5",
    "SKYSCAN_SCANNER_SIM_RESULT_INTERVAL_SECONDS": "1",
    "SKYSCAN_SCANNER_SIM_WORKFORCE_POLL_SECONDS": "0.3",
    "SKYSCAN_SCANNER_SIM_KILL_SWITCH_SECONDS": "0.5",
    "SKYSCAN_WMS_SIM_INIT_RETRY_SECONDS": "0.3",  # workers retry a startup.json not uploaded yet
}
# Eight nsides of 3 batches of pixels at 0.2 s each: about 5 s of scanning, time enough to act mid-scan.
LONG_NSIDES = {str(2**k): 0 for k in range(1, 9)}


@dataclass(frozen=True)
class Stack:
    url: str
    user_token: str
    system_token: str
    viewer_token: str
    wms_url: str
    operator_metrics_url: str
    kubeconfig: str
    namespace: str
    settings: localstack.LocalStackSettings

    @classmethod
    def settings_for(
        cls, workdir: Path, kubeconfig: str, namespace: str, archive_dsn: str, **extra: Any
    ) -> localstack.LocalStackSettings:
        """The e2e suite's local stack (scanner simulator, fast timers, free ports) in `workdir`."""
        return localstack.LocalStackSettings(  # by the environment variables' names
            SKYSCAN_LOCAL_DIR=workdir,
            SKYSCAN_KUBECONFIG=kubeconfig,
            SKYSCAN_NAMESPACE=namespace,
            SKYSCAN_LOCAL_ARCHIVE_DSN=archive_dsn,
            SIMULATE_SCANNER=True,
            SKYSCAN_LOCAL_SHIM_PORT=0,
            SKYSCAN_LOCAL_WMS_PORT=0,
            SKYSCAN_LOCAL_READY_TIMEOUT=60,
            tie_to_parent=True,
            overrides=FAST,
            **extra,
        )

    @classmethod
    def up(cls, settings: localstack.LocalStackSettings) -> Stack:
        """Start the stack `settings` describe; what `make up` writes to .skyscan/env, as a Stack."""
        env = localstack.up(settings)
        return cls(
            url=env["SKYSCAN_URL"],
            user_token=env["SKYSCAN_USER_TOKEN"],
            system_token=env["SKYSCAN_SYSTEM_TOKEN"],
            viewer_token=env["SKYSCAN_VIEWER_TOKEN"],
            wms_url=env["SKYSCAN_WMS_URL"],
            operator_metrics_url=env["SKYSCAN_OPERATOR_METRICS_URL"],
            kubeconfig=env["KUBECONFIG"],
            namespace=env["SKYSCAN_NAMESPACE"],
            settings=settings,
        )


async def _create_namespace(kubeconfig: str, name: str) -> None:
    async with await kube.connect(kubeconfig) as api:
        body = {"metadata": {"name": name, "labels": {"skyscan.io/test": "true"}}}
        await api.request("POST", core_path("namespaces"), body=body)


async def _delete_namespace(kubeconfig: str, name: str) -> None:
    async with await kube.connect(kubeconfig) as api:
        await api.request("DELETE", core_path("namespaces", name=name))


@contextlib.contextmanager
def stack_of_its_own(
    cluster: Cluster,
    archive_server: ArchiveServer,
    workdir: Path,
    prefix: str,
    component_overrides: Callable[[str], dict[str, dict[str, str]]] = lambda namespace: {},
) -> Iterator[Stack]:
    """The e2e stack on the session's cluster, in a namespace (`prefix-…`) and an archive database of
    its own, taken down after; `component_overrides` of the namespace it gets."""
    namespace = f"{prefix}-{secrets.token_hex(4)}"
    asyncio.run(_create_namespace(cluster.kubeconfig, namespace))
    database = f"{prefix}_{secrets.token_hex(4)}"
    archive_dsn = asyncio.run(postgres.create_database(archive_server.admin_dsn, database))
    settings = Stack.settings_for(
        workdir,
        cluster.kubeconfig,
        namespace,
        archive_dsn,
        component_overrides=component_overrides(namespace),
    )
    try:
        yield Stack.up(settings)
    finally:
        records = localstack.load_state(settings.dir).get("components", {})
        localstack.down(settings)
        assert not [name for name, r in records.items() if localstack.alive(r)], "down left processes"
        for log in sorted((settings.dir / "logs").glob("*.log")):
            print(f"--- {log.name} (shown when a test fails) ---\n{localstack.tail(log, 4000)}")
        asyncio.run(_delete_namespace(cluster.kubeconfig, namespace))
        asyncio.run(postgres.drop_database(archive_server.admin_dsn, database))


@pytest.fixture(scope="session")
def stack(
    cluster: Cluster, archive_server: ArchiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the e2e session (scans are independent by id, so tests share it)."""
    with stack_of_its_own(cluster, archive_server, tmp_path_factory.mktemp("stack"), "e2e") as stack:
        yield stack


@contextlib.contextmanager
def workers_held(stack: Stack) -> Iterator[None]:
    """The stack's WMS simulator keeps taskforces from starting (its steps an hour apart), so scans wait
    mid-way for their workers however long a test's checks take on a busy machine; then as it was."""
    with httpx.Client(base_url=stack.wms_url, timeout=10) as wms:
        before = wms.patch("/_sim/config", json={}).json()["step_delay"]
        wms.patch("/_sim/config", json={"step_delay": 3600}).raise_for_status()
        try:
            yield
        finally:
            wms.patch("/_sim/config", json={"step_delay": before}).raise_for_status()


@dataclass
class Rest:
    """REST calls as a user (default) or as the scanner (`as_="system"`), redirects not followed."""

    stack: Stack
    http: httpx.AsyncClient

    async def call(self, method: str, path: str, *, as_: str = "user", **kwargs: Any) -> httpx.Response:
        token = self.stack.user_token if as_ == "user" else self.stack.system_token
        headers = {"Authorization": f"Bearer {token}"}
        return await self.http.request(method, path, headers=headers, **kwargs)

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        r = await self.call(method, path, **kwargs)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    async def launch(self, **changes: Any) -> str:
        manifest = await self.ok("POST", "/scan", json=scan_request(**changes))
        return str(manifest["scan_id"])

    async def status(self, scan_id: str) -> dict[str, Any]:
        got: dict[str, Any] = await self.ok("GET", f"/scan/{scan_id}/status")
        return got

    async def wait_status(self, scan_id: str, check: Any, timeout: float = 60) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            status = await self.status(scan_id)
            return status if check(status) else None

        return await eventually(probe, timeout=timeout, interval=0.1)


@pytest.fixture
async def rest(stack: Stack) -> AsyncIterator[Rest]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        yield Rest(stack, http)


@pytest.fixture
async def own_rest(own: OwnCluster) -> AsyncIterator[Rest]:
    """REST calls to the stack of the requesting module's `own` fixture (an `own_cluster`)."""
    async with httpx.AsyncClient(base_url=own.stack.url, timeout=30) as http:
        yield Rest(own.stack, http)


def scan_request(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "docker_tag": "latest",
        "reco_algo": "millipede_wilks",
        "nsides": {"8": 0, "64": 12, "512": 24},
        "real_or_simulated_event": "real",
        "max_pixel_reco_time": 600,
        "request_clusters": {"osg": 2},
        "priority": 100,
        "classifiers": {"test": "e2e"},
        "event_live_json": {"value": {"data": {"run_id": 123456, "event_id": 42, "mjd": 60000.5}}},
    }
    body.update(changes)
    return body


async def kubectl(stack: Stack, *args: str) -> str:
    """Run kubectl against the stack's cluster and namespace; returns stdout, fails on a non-zero exit."""
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", stack.kubeconfig, "-n", stack.namespace, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


async def wms_workflow(stack: Stack, workflow_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as http:
        r = await http.get(f"/v1/workflows/{workflow_id}")
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc


async def follow_states(rest: Rest, scan_id: str, into: list[str], until: str, timeout: float = 60) -> None:
    """Record each distinct REST scan_state, polling quickly, until `until` is reached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = (await rest.status(scan_id))["scan_state"]
        if not into or into[-1] != state:
            into.append(state)
        if state == until:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"scan {scan_id} did not reach {until}; states seen: {into}")
