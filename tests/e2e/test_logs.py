"""Structured logs (issue 12, item 2) over a whole stack with `SKYSCAN_LOG_FORMAT=json`: a scan runs to its
final result through REST; then every line the shim and the operator wrote is a JSON object with the
documented fields, every line naming the scan carries its scan_id, the access log has route, status and
duration, and no credential in play appears anywhere in their logs."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from skyscan import logs, names
from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan_local import processes
from skyscan_local import stack as localstack
from skyscan_local.task_manager_simulator import startup_url_of
from tests.e2e.conftest import LONG_NSIDES, Rest, Stack
from tests.e2e.own_cluster import OwnCluster, own_cluster
from tests.helpers import eventually

COMPONENTS = ("wms-simulator", "shim", "operator", "scanner-simulator")
LOGGED = ("shim", "operator")
FIELDS = {"timestamp", "level", "logger", "message"}


@pytest.fixture
def own(tmp_path: Path, archive_dsn: str) -> Iterator[OwnCluster]:
    overrides = {component: {"SKYSCAN_LOG_FORMAT": "json"} for component in COMPONENTS}
    with own_cluster(tmp_path, overrides, archive_dsn=archive_dsn) as cluster:
        yield cluster


async def scanner_token(stack: Stack, scan_id: str) -> str:
    """The scanner's per-scan token, from its Secret (there while the scan runs)."""
    async with await kube.connect(stack.kubeconfig) as api:

        async def read() -> str | None:
            name = names.scanner_token_secret_name(scan_id)
            secret = await api.request("GET", core_path("secrets", stack.namespace, name))
            token = (secret.get("data") or {}).get(names.SCANNER_TOKEN_KEY)
            return base64.b64decode(token).decode() if token else None

        return await eventually(read, timeout=30, interval=0.1)


async def presigned_signature(stack: Stack, workflow_id: str) -> str:
    """The signature of the startup.json URL the WMS simulator's workers were given."""
    async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as http:
        r = await http.get("/_sim/workflows")
        r.raise_for_status()
    (workflow,) = [w for w in r.json()["workflows"] if w["workflow_id"] == workflow_id]
    url = startup_url_of(workflow["request"]["tasks"][0]["init_args"])
    assert url is not None
    return parse_qs(urlsplit(url).query)["signature"][0]


def json_lines(log: Path) -> list[dict[str, Any]]:
    # Every line but the supervisor's own start markers (`make up` appends each run after one).
    text = log.read_text().splitlines()
    lines = [line for line in text if line.strip() and not line.startswith(processes.START_MARKER)]
    assert lines, f"{log.name} is empty"
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"{log.name}: not a JSON line: {line!r}") from None
    return parsed


@pytest.mark.timeout(240)
async def test_json_logs_of_a_full_scan_name_it_and_hold_no_credential(
    own: OwnCluster, own_rest: Rest
) -> None:
    rest, stack = own_rest, own.stack
    scan_id = await rest.launch(nsides=LONG_NSIDES)
    scanner = await scanner_token(stack, scan_id)
    await rest.wait_status(scan_id, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=120)
    await rest.ok("GET", f"/scan/{scan_id}/result")
    workflow_id = (await rest.ok("GET", f"/scan/{scan_id}/wms/workflow-id"))["workflow_id"]
    signature = await presigned_signature(stack, workflow_id)

    logs_dir = stack.settings.dir / "logs"
    env = stack.settings.overrides_for("operator")
    dsn_password = urlsplit(localstack.load_state(stack.settings.dir)["archive_dsn"]).password
    credentials = {
        "user token": stack.user_token,
        "system token": stack.system_token,
        "scanner token": scanner,
        "presign key": (stack.settings.dir / localstack.PRESIGN_KEY_FILE).read_text().strip(),
        "presigned signature": signature,
        "archive DSN password": dsn_password,
    }
    assert all(credentials.values()), credentials  # each one is in play on this stack
    if secret := env.get("SKYSCAN_WMS_CLIENT_SECRET"):  # the local stack's WMS asks for none
        credentials["WMS client secret"] = secret
    for component in LOGGED:
        text = (logs_dir / f"{component}.log").read_text()
        assert logs.REDACTED not in text, (
            f"the {component} logged a credential (masked)"
        )  # the sources are clean
        for what, value in credentials.items():
            assert value not in text, f"the {what} is in the {component}'s log"

    by_component = {component: json_lines(logs_dir / f"{component}.log") for component in LOGGED}
    for component, lines in by_component.items():
        for line in lines:
            assert FIELDS <= set(line), (component, line)
            if scan_id in json.dumps(line):
                assert line.get("scan_id") == scan_id, (component, line)
    operator_lines = [line for line in by_component["operator"] if line.get("scan_id") == scan_id]
    assert operator_lines, "the operator logged nothing about the scan"

    access = [line for line in by_component["shim"] if line["logger"] == "api_shim.access"]
    created = [line for line in access if (line["method"], line["route"]) == ("POST", "/scan")]
    assert created and created[0]["status"] == 200
    status_reads = [line for line in access if line["route"] == "/scan/{scan_id}/status"]
    assert status_reads, access[:5]
    for line in status_reads:
        assert (line["method"], line["status"], line["scan_id"]) == ("GET", 200, scan_id)
        assert isinstance(line["duration_ms"], float) and 0 <= line["duration_ms"] < 30_000
    presigned = [line for line in access if line["route"] == "/scan/{scan_id}/startup.json"]
    assert any(line["status"] == 200 and line["method"] == "GET" for line in presigned), presigned
    assert not [line for line in access if line["route"] and scan_id in line["route"]]
