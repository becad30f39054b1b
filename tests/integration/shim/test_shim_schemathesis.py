"""Property-based: schemathesis drives a real shim (a `skyscan-shim serve` process against the real API
server) from its own `/openapi.json`, as a user and as the system, with real scans behind most ids.
Valid and invalid requests alike: nothing answers 5xx, and every status code, content type and body
is one the document declares."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import checks

from api_shim.auth import make_token
from tests.conftest import Cluster
from tests.integration.shim.conftest import scan_body, start_shim_process

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]
SCANS = 3


class Shim:
    def __init__(self, url: str, tokens: dict[str, str], scan_ids: list[str]) -> None:
        self.url, self.tokens, self.scan_ids = url, tokens, scan_ids


@pytest.fixture
async def running_shim(cluster: Cluster, namespace: str, tmp_path: Path) -> AsyncIterator[Shim]:
    tokens_file = tmp_path / "tokens.json"
    tokens = {role: make_token(tokens_file, f"fuzz-{role}", [role]) for role in ("user", "system")}
    proc, url = start_shim_process(
        cluster, namespace, tokens_file, tmp_path / "shim.log",
        SKYSCAN_ADD_WORKERS_TIMEOUT="0.5",  # no operator here: add-workers answers 504 quickly
        SKYSCAN_WRITE_TIMEOUT="5",
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the shim did not start"
                await asyncio.sleep(0.2)
            headers = {"Authorization": f"Bearer {tokens['user']}"}
            ids = []
            for _ in range(SCANS):
                reply = await http.post("/scan", json=scan_body(), headers=headers)
                assert reply.status_code == 200, reply.text
                ids.append(reply.json()["scan_id"])
        yield Shim(url, tokens, ids)
    finally:
        proc.terminate()
        proc.wait(10)


FUZZ = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def call(case: Any, shim: Shim, role: str) -> None:
    if "scan_id" in case.path_parameters:
        # Most ids are real scans, so the routes do their work; the rest are whatever was generated.
        generated = str(case.path_parameters["scan_id"])
        if sum(map(ord, generated)) % 4:
            case.path_parameters["scan_id"] = shim.scan_ids[len(generated) % SCANS]
    case.call_and_validate(
        base_url=shim.url, headers={"Authorization": f"Bearer {shim.tokens[role]}"}, checks=CHECKS, timeout=30
    )


@pytest.mark.parametrize("role", ["user", "system"])
def test_the_shim_keeps_its_documented_contract(running_shim: Shim, role: str) -> None:
    document = httpx.get(f"{running_shim.url}/openapi.json", timeout=30).json()
    del document["paths"]["/scan/{scan_id}/events"]  # lasts as long as its scan runs: test_events.py
    del document["paths"]["/scans/events"]  # never ends by itself: test_scans_events.py
    operations = [result.ok() for result in schemathesis.openapi.from_dict(document).get_all_operations()]
    assert len(operations) >= 20
    failures = []
    for operation, mode in itertools.product(operations, schemathesis.GenerationMode):

        @FUZZ
        @given(case=operation.as_strategy(mode))
        def fuzz(case: Any) -> None:
            call(case, running_shim, role)

        try:
            fuzz()
        except Unsatisfiable:
            assert mode is schemathesis.GenerationMode.NEGATIVE  # nothing to get wrong (e.g. /healthz)
        except (Exception, BaseExceptionGroup) as e:  # every operation tried; all failures reported
            failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {str(e)[:1500]}")
    assert not failures, "\n\n".join(failures)
