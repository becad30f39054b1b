"""The shim's access log on a real aiohttp server: one vetted record a request with the route template,
the method, the status, the duration and the kind of principal, never the path's query or a token."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from api_shim.access import LOGGER, AccessLogger, principal
from api_shim.app import answer_unmatched, guard, shim_runner
from api_shim.auth import SYSTEM, USER, Identity
from api_shim.bodies import BODIES, BodyBudget
from api_shim.metrics import ShimMetrics
from api_shim.plumbing import IDENTITY, Route
from skyscan import logs
from skyscan_local import processes
from tests.helpers import eventually

CALLERS = {
    "alice": Identity("alice", frozenset({USER})),
    "operator": Identity("operator", frozenset({SYSTEM})),
    "scanner": Identity("scanner", frozenset({SYSTEM}), scan_id="s1"),
}


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def status(request: web.Request) -> web.Response:
    if (caller := request.query.get("as")) is not None:
        request[IDENTITY] = CALLERS[caller]
    return web.Response(text="{}")


@pytest.fixture
async def logged() -> AsyncIterator[Logged]:
    app = web.Application()
    app.router.add_get("/scan/{scan_id}/status", status)
    async with access_logged(app) as served:
        yield served


@asynccontextmanager
async def access_logged(app: web.Application) -> AsyncIterator[Logged]:
    """A client of `app` served with the shim's access logger, and the records it logs."""
    kept, logger = Kept(), logging.getLogger(LOGGER)
    logger.addHandler(kept)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        server = TestServer(app)
        await server.start_server(access_log=logger, access_log_class=AccessLogger)
        async with TestClient(server) as client:
            yield client, kept
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)


async def test_the_shim_writes_its_own_access_log_and_never_aiohttps() -> None:
    app = web.Application()
    app.router.add_get("/scan/{scan_id}/status", status)
    ours, theirs = Kept(), Kept()
    loggers = [(logging.getLogger(LOGGER), ours), (logging.getLogger("aiohttp.access"), theirs)]
    levels = [logger.level for logger, _ in loggers]
    for logger, kept in loggers:
        logger.addHandler(kept)
        logger.setLevel(logging.INFO)
    runner = shim_runner(app)
    await runner.setup()
    try:
        port = processes.free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/scan/a1/status?x=1"):
            pass

        async def logged() -> bool:
            return len(ours.records) == 1

        await eventually(logged, timeout=5, interval=0.01)
        assert ours.records[0].getMessage().startswith("GET /scan/{scan_id}/status 200 ")
        assert theirs.records == []
    finally:
        await runner.cleanup()
        for (logger, kept), level in zip(loggers, levels, strict=True):
            logger.removeHandler(kept)
            logger.setLevel(level)


def test_principals_are_kinds_of_caller() -> None:
    assert [principal(None), *(principal(i) for i in CALLERS.values())] == [
        "anonymous", "user", "system", "scanner",
    ]  # fmt: skip
    assert principal(Identity("admin", frozenset({USER, SYSTEM}))) == "user"


Logged = tuple[TestClient[web.Request, web.Application], Kept]


async def test_one_vetted_record_a_request(logged: Logged) -> None:
    client, kept = logged
    token = "s3cr3t-tok"
    for path in ("/scan/a1/status?as=alice&signature=q9Zk", "/scan/a1/status?as=scanner", "/nowhere?token=x"):
        await client.get(path, headers={"Authorization": f"Bearer {token}"})
    await client.request("PROPFIND", "/scan/a1/status")

    async def four() -> bool:
        return len(kept.records) == 4  # written after each answer is sent

    await eventually(four, timeout=5, interval=0.01)
    records = kept.records
    assert all(type(r) is logs.CleanRecord for r in records)
    fields = [(r.method, r.route, r.status, r.principal, getattr(r, "scan_id", None)) for r in records]
    assert fields == [
        ("GET", "/scan/{scan_id}/status", 200, "user", "a1"),
        ("GET", "/scan/{scan_id}/status", 200, "scanner", "a1"),
        ("GET", "unmatched", 404, "anonymous", None),
        ("OTHER", "unmatched", 405, "anonymous", None),  # a method is a known one: the label set stays small
    ]
    first = records[0].getMessage()
    assert first.startswith("GET /scan/{scan_id}/status 200 ") and first.endswith("ms user"), first
    assert all(isinstance(r.duration_ms, float) and 0 <= r.duration_ms < 5000 for r in records)
    for formatter in (logs.TextFormatter(), logs.JsonFormatter()):
        text = "\n".join(formatter.format(r) for r in records)
        assert token not in text and "q9Zk" not in text and "token=x" not in text
    line = json.loads(logs.JsonFormatter().format(records[1]))
    assert {k: line[k] for k in ("method", "route", "status", "principal", "scan_id")} == {
        "method": "GET", "route": "/scan/{scan_id}/status", "status": 200, "principal": "scanner",
        "scan_id": "a1",
    }  # fmt: skip


async def test_the_shims_catch_all_is_logged_as_unmatched() -> None:
    """The shim answers what no route takes by a catch-all route: logged as no route matched, with no
    scan id (its path may name none)."""
    counted = ShimMetrics()
    app = web.Application()
    app[BODIES] = BodyBudget(1 << 20, 1 << 20, 1.0)
    path = "/scan/{scan_id}/status"
    app.router.add_get(path, guard(Route("GET", path, status, "", None, None), counted))
    answer_unmatched(app, counted)
    async with access_logged(app) as (client, kept):
        for method, asked in (("GET", "/scan/a1/status"), ("GET", "/scan/a1"), ("PUT", "/scan/a1/status")):
            await client.request(method, asked)

        async def three() -> bool:
            return len(kept.records) == 3

        await eventually(three, timeout=5, interval=0.01)
    fields = [tuple(vars(r).get(k) for k in ("method", "route", "status", "scan_id")) for r in kept.records]
    assert fields == [
        ("GET", "/scan/{scan_id}/status", 200, "a1"),
        ("GET", "unmatched", 404, None),
        ("PUT", "unmatched", 405, None),
    ]
