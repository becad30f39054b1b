"""Fixtures running the shim against the session cluster, in the test's namespace, over real HTTP.

The operator does not run here: tests play its part by writing the status keys it owns (backlog,
workflow, workforce, workerRequests), which is the contract between the two, not a mock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from api_shim import auth
from api_shim.app import create_app
from api_shim.plumbing import SERVER_OPTIONS, SHIM, Shim
from api_shim.settings import ShimSettings
from api_shim.wire_names import Names
from skyscan.io.kube import Kube, scan_path
from skyscan_local.processes import free_port
from tests.conftest import Cluster
from tests.helpers import eventually

TAGS = ["4.1.0", "4.2.3", "4.2.10", "3.1.5", "gcd-handling-fe8ecee"]
LOGS = "https://grafana.test/d?var-namespace={namespace}&var-container=skyscan-server-{scan_id}"
TOKENS = {
    "user": auth.Identity("alice", frozenset({auth.USER})),
    "system": auth.Identity("scanner", frozenset({auth.SYSTEM})),
    "viewer": auth.Identity("shifter", frozenset({auth.VIEWER})),
    # SkyDriver's clients and IceCube's scanner: answered in the reference's names.
    "icecube": auth.Identity("skydriver-client", frozenset({auth.USER}), names=Names.REFERENCE),
    "icecube-system": auth.Identity("skymap-scanner", frozenset({auth.SYSTEM}), names=Names.REFERENCE),
}


def scan_body(**changes: Any) -> dict[str, Any]:
    """A valid POST /scan body."""
    body: dict[str, Any] = {
        "docker_tag": "latest",
        "reco_algo": "millipede_wilks",
        "nsides": {"1": 2, "3": 4},
        "real_or_simulated_event": "real",
        "max_pixel_reco_time": 600,
        "request_clusters": {"osg": 10},
        "event_live_json": {"run": 1, "value": {"data": "x" * 50}},
        "classifiers": {"origin": "test"},
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not None}


@dataclass
class Reply:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]


@dataclass
class ShimUnderTest:
    url: str
    session: aiohttp.ClientSession
    app: web.Application
    api: Kube
    namespace: str
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def state(self) -> Shim:
        return self.app[SHIM]

    async def call(
        self,
        method: str,
        path: str,
        *,
        as_: str | None = "user",
        json_body: Any = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        hdrs = dict(headers or {})
        if as_:
            hdrs["Authorization"] = f"Bearer {self.tokens.get(as_, as_)}"
        async with self.session.request(
            method,
            self.url + path,
            json=json_body,
            data=data,
            params=params,
            headers=hdrs,
            allow_redirects=False,
        ) as response:
            raw = await response.read()
            body = json.loads(raw) if raw and response.content_type == "application/json" else raw
            return Reply(response.status, body, response.headers)

    async def launch(self, **changes: Any) -> dict[str, Any]:
        reply = await self.call("POST", "/scan", json_body=scan_body(**changes))
        assert reply.status == 200, reply.body
        manifest: dict[str, Any] = reply.body
        return manifest

    async def operator_writes(self, scan_id: str, status: dict[str, Any]) -> None:
        """Play the operator: merge its status keys into the Scan."""
        await self.api.request(
            "PATCH",
            scan_path(self.namespace, scan_id, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    async def kube_scan(self, scan_id: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self.api.request("GET", scan_path(self.namespace, scan_id))
        return obj


MakeShim = Callable[..., Awaitable[ShimUnderTest]]


@pytest.fixture
async def make_shim(cluster: Cluster, api: Kube, namespace: str) -> AsyncIterator[MakeShim]:
    servers: list[TestServer] = []
    sessions: list[aiohttp.ClientSession] = []

    async def make(**overrides: Any) -> ShimUnderTest:
        settings = ShimSettings(
            **{
                "namespace": namespace,
                "kubeconfig": cluster.kubeconfig,
                "tags": TAGS,
                "logs_url_template": LOGS,
                "add_workers_timeout": 5.0,
                **overrides,
            }
        )
        tokens = {role: f"token-{role}-{namespace}" for role in TOKENS}
        static = auth.StaticTokens({auth.token_hash(tokens[r]): ident for r, ident in TOKENS.items()})
        app = await create_app(settings, [static])
        server = TestServer(app)
        await server.start_server(**SERVER_OPTIONS)
        servers.append(server)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return ShimUnderTest(str(server.make_url("")).rstrip("/"), session, app, api, namespace, tokens)

    yield make
    for session in sessions:
        await session.close()
    for server in servers:
        await server.close()


@pytest.fixture
async def shim(make_shim: MakeShim) -> ShimUnderTest:
    return await make_shim()


def start_shim_process(
    cluster: Cluster, namespace: str, token_file: Path, log: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A `skyscan-shim serve` process (the program a Pod runs) appending to `log`, and its URL."""
    port = free_port()
    env = {
        **os.environ,
        "SKYSCAN_NAMESPACE": namespace,
        "SKYSCAN_KUBECONFIG": cluster.kubeconfig,
        "SKYSCAN_TOKEN_FILE": str(token_file),
        "SKYSCAN_HOST": "127.0.0.1",
        "SKYSCAN_PORT": str(port),
        "SKYSCAN_TAGS": json.dumps(TAGS),
        "SKYSCAN_SHUTDOWN_DELAY_SECONDS": "0",
        **settings,
    }
    command = [sys.executable, "-m", "api_shim.app", "serve"]
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    return process, f"http://127.0.0.1:{port}"


@dataclass(frozen=True)
class RunningShim:
    pid: int
    url: str
    log: Path
    token: str  # a user's


@asynccontextmanager
async def shim_process(
    cluster: Cluster, namespace: str, tmp_path: Path, **settings: str
) -> AsyncIterator[RunningShim]:
    """A `skyscan-shim serve` process with a user's static token, once it answers /healthz 200 (its
    log shown if it dies first); terminated on the way out."""
    tokens, log = tmp_path / "tokens.json", tmp_path / "shim.log"
    token = auth.make_token(tokens, "alice", ["user"])
    process, url = start_shim_process(cluster, namespace, tokens, log, **settings)
    try:
        async with httpx.AsyncClient(base_url=url) as http:

            async def serving() -> bool:
                assert process.poll() is None, log.read_text()
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(serving, timeout=60)
        yield RunningShim(process.pid, url, log, token)
    finally:
        process.terminate()
        process.wait(10)
