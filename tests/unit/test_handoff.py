"""The worker hand-off as the operator builds it: the presigned URL in the workers' init command, and the
startup.json sidecar in the scanner Pod."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from aiohttp import web

from skyscan import model, presign
from skyscan_local import scanner_simulator
from skyscan_local import wms_simulator as simulator
from skyscan_local.task_manager_simulator import startup_url_of
from skyscan_local.wms_rules import validate_workflow_request
from skyscan_operator import scanner_job
from skyscan_operator.settings import OperatorSettings
from tests.helpers import eventually
from tests.unit.test_crd import minimal_spec

NOW = 1_800_000_000.5
KEY = b"0123456789abcdef" * 4


def spec() -> model.ScanSpec:
    return model.ScanSpec.model_validate(minimal_spec())


@pytest.fixture
def settings(tmp_path: Path) -> OperatorSettings:
    key_file = tmp_path / "presign.key"
    key_file.write_bytes(KEY + b"\n")
    return OperatorSettings(
        rest_address="http://shim:8080/",
        presign_key_file=key_file,
        start_timeout_seconds=300,
        job_active_deadline_seconds=7200,
    )


def test_the_init_command_fetches_a_url_that_verifies_for_this_scan_only(settings: OperatorSettings) -> None:
    assert settings.presign_key == KEY  # read once, at load, whitespace dropped
    body = scanner_job.workflow_request("abc", "uid-1", spec(), settings, NOW)
    validate_workflow_request(body, {"osg", "sub-2", "local"})
    init_args = body["tasks"][0]["init_args"]
    # The command line a worker runs: bash -c "curl ... -o {{DATA_HUB}}/startup.json '<url>'"
    argv = shlex.split(init_args)
    assert argv[:2] == ["bash", "-c"]
    curl = shlex.split(argv[2])
    assert curl[:4] == ["curl", "--fail-with-body", "--max-time", "1800"]
    # Workers may start before the sidecar uploaded the file (404): curl retries, within the init timeout.
    assert curl[4:9] == ["--retry", "170", "--retry-delay", "10", "--retry-all-errors"]
    assert curl[9:11] == ["-o", "{{DATA_HUB}}/startup.json"]
    url = curl[-1]
    assert startup_url_of(init_args) == url  # what the WMS simulator's workers fetch
    split = urlsplit(url)
    assert (split.scheme, split.netloc, split.path) == ("http", "shim:8080", "/scan/abc/startup.json")
    query = {k: v[0] for k, v in parse_qs(split.query).items()}
    expires = int(query["expires"])
    # Bounded by the scan's lifetime: the start timeout plus the Job's deadline, from the request.
    assert expires == 1_800_000_001 + 300 + 7200
    assert presign.verify(KEY, "abc", expires, query["signature"], NOW + 7000)
    assert not presign.verify(KEY, "abc", expires, query["signature"], expires + 1)
    assert not presign.verify(KEY, "abd", expires, query["signature"], NOW)


def test_without_a_key_the_url_is_unsigned_and_now_is_needed_with_one(settings: OperatorSettings) -> None:
    plain = OperatorSettings(rest_address="http://shim:8080")
    assert plain.presign_key is None
    assert scanner_job.startup_url("abc", plain, None) == "http://shim:8080/scan/abc/startup.json"
    with pytest.raises(ValueError, match="current time"):
        scanner_job.workflow_request("abc", "uid-1", spec(), settings)


def test_a_short_key_stops_the_operator_at_start(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("short")
    with pytest.raises(ValueError, match="at least 32 bytes"):
        OperatorSettings(presign_key_file=tmp_path / "k")


def test_the_scanner_pod_has_the_native_sidecar(settings: OperatorSettings) -> None:
    job = scanner_job.build_job(
        "abc", "uid-1", "ns", spec(), settings.model_copy(update={"sidecar_image": "sk:1"})
    )
    pod = job["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    scanner = pod["containers"][0]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: runs beside the scanner, ends with it
    assert sidecar["image"] == "sk:1"
    assert sidecar["command"] == ["skyscan-sidecar"] and sidecar["args"] == ["/common-space/startup.json"]
    assert re.search(r"--client-startup-json /common-space/startup.json", " ".join(scanner["args"]))
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["SKYSCAN_SKYDRIVER_ADDRESS"]["value"] == "http://shim:8080/"
    assert env["SKYSCAN_SKYDRIVER_SCAN_ID"]["value"] == "abc"
    scanner_auth = next(e for e in scanner["env"] if e["name"] == "SKYSCAN_SKYDRIVER_AUTH")
    assert env["SKYSCAN_SKYDRIVER_AUTH"] == scanner_auth  # the scan's own credential, the scanner's entry
    assert "value" not in env["SKYSCAN_SKYDRIVER_AUTH"]
    common = next(v for v in pod["volumes"] if v["name"] == "common-space-volume")
    assert sidecar["volumeMounts"] == [
        {"name": common["name"], "mountPath": "/common-space", "readOnly": True}
    ]
    assert sidecar["resources"]["requests"] == {"memory": "64Mi", "cpu": "0.05"}
    assert sidecar["securityContext"]["allowPrivilegeEscalation"] is False


# --- the WMS simulator's workers run the init command -------------------------------------------


class StartupServer:
    """Serves /scan/{id}/startup.json as the shim does: 403 unless presigned, 404 until uploaded."""

    def __init__(self) -> None:
        self.uploaded: dict[str, bytes] = {}
        self.url = ""

    async def get(self, request: web.Request) -> web.Response:
        scan_id = request.match_info["scan_id"]
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            return web.json_response({}, status=403)
        if not presign.verify(KEY, scan_id, expires, request.query.get("signature", ""), time.time()):
            return web.json_response({"reason": "invalid signature"}, status=403)
        if scan_id not in self.uploaded:
            return web.json_response({"reason": "not uploaded yet"}, status=404)
        return web.Response(body=self.uploaded[scan_id], content_type="application/json")


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_simulated_workers_start_only_after_fetching_startup_json(
    settings: OperatorSettings, tmp_path: Path
) -> None:
    files = StartupServer()
    files_app = web.Application()
    files_app.router.add_get("/scan/{scan_id}/startup.json", files.get)
    files_runner, files_url = await serve(files_app)
    sim_settings = simulator.SimulatorSettings(
        activation_delay=0.05, step_delay=0.05, run_init_command=True, init_retry_seconds=0.1
    )
    sim_app = simulator.make_app(sim_settings)
    sim_runner, sim_url = await serve(sim_app)
    wms = sim_app[simulator.WMS_KEY]
    ours = settings.model_copy(update={"rest_address": files_url})
    (tmp_path / "other.key").write_bytes(b"another deployment's key, 32+ bytes")
    theirs = OperatorSettings(rest_address=files_url, presign_key_file=tmp_path / "other.key")
    try:
        async with httpx.AsyncClient(base_url=sim_url, timeout=10) as http:

            async def request(scan_id: str, s: OperatorSettings, now: float) -> str:
                body = scanner_job.workflow_request(scan_id, f"uid-{scan_id}", spec(), s, now)
                r = await http.post("/v1/workflows", json=body)
                r.raise_for_status()
                return str(r.json()["workflow"]["workflow_id"])

            async def statuses(wf_id: str) -> dict[str, Any]:
                r = await http.post("/v1/query/taskforces", json={"query": {"workflow_id": wf_id}})
                (tf,) = r.json()["taskforces"]
                return dict(tf)

            good = await request("good", ours, time.time())
            expired = await request("late", ours, time.time() - 10_000)  # signed long ago: expired
            forged = await request("forged", theirs, time.time())
            # Not uploaded yet: the workers keep retrying and stay IDLE.
            await eventually(lambda: _async(_fetched(wms, good, 404)), timeout=5)
            await asyncio.sleep(0.3)
            assert (await statuses(good))["compound_statuses"] == {"IDLE": {"null": 10}}
            files.uploaded["good"] = b'{"GCDQp_packet": [1, 2, 3]}'
            running = await eventually(
                lambda: _with_status(statuses(good), {"RUNNING": {"Tasking": 10}}), timeout=5
            )
            assert running["top_task_errors"] == {}
            assert _fetched(wms, good, 200)[-1]["bytes"] == len(files.uploaded["good"])
            # A bad or expired signature fails the workers visibly, and is not retried.
            for wf_id in (expired, forged):
                failed = await eventually(
                    lambda wf_id=wf_id: _with_status(statuses(wf_id), {"COMPLETED": {"FatalError": 10}}),
                    timeout=5,
                )
                (error,) = failed["top_task_errors"]
                assert "HTTP 403" in error
                assert len([f for f in wms.fetches if f["workflow_id"] == wf_id]) == 1
    finally:
        await sim_runner.cleanup()
        await files_runner.cleanup()


async def _async(value: Any) -> Any:
    return value


def _fetched(wms: simulator.WMS, wf_id: str, status: int) -> list[dict[str, Any]]:
    return [f for f in wms.fetches if f["workflow_id"] == wf_id and f["status"] == status]


async def _with_status(taskforce: Awaitable[dict[str, Any]], wanted: dict[str, Any]) -> dict[str, Any] | None:
    tf = await taskforce
    return tf if tf["compound_statuses"] == wanted else None


def test_the_simulated_startup_json_is_realistic() -> None:
    metadata = {"run_id": 138632, "event_id": 31747601, "mjd": 59723.32}
    sizes = []
    for i in range(20):
        doc = scanner_simulator.startup_json(f"scan-{i}", metadata)
        assert {"baseline_GCD_file", "GCDQp_packet"} <= doc.keys()  # what the real client reads
        sizes.append(len(json.dumps(doc)))
    assert all(100_000 <= size <= 530_000 for size in sizes), sizes
    assert scanner_simulator.startup_json("a", metadata) == scanner_simulator.startup_json("a", metadata)
