"""The scanner image's server reads what the operator's Job gives its container: args and env."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from skyscan_local.scanner_pod import ScannerExit
from skyscan_local.scanner_server import server_pod
from skyscan_operator import scanner_job
from skyscan_operator.observed import PodView
from tests.unit.test_scanner_job import S, spec


def test_server_pod_reads_the_jobs_args_and_env() -> None:
    job = scanner_job.build_job("abc123", "uid-1", "ns", spec(nsides={"64": 12, "8": 0}), S)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["python", "-m", "skymap_scanner.server"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {"SKYSCAN_SKYDRIVER_AUTH": "token-from-the-secret", "HOSTNAME": "scanner-pod-x"}
    pod = server_pod(env, container["args"][3:])
    assert (pod.address, pod.scan_id, pod.token) == ("http://shim:8080", "abc123", "token-from-the-secret")
    assert pod.args.nsides == {8: 0, 64: 12}  # coarse to fine
    assert pod.startup_json == Path("/common-space/startup.json")
    assert pod.sidecar is None and pod.pod_name == "scanner-pod-x"


def test_server_pod_without_its_address_exits_2() -> None:
    with pytest.raises(ScannerExit, match="SKYSCAN_SKYDRIVER_ADDRESS") as raised:
        server_pod({"SKYSCAN_SKYDRIVER_SCAN_ID": "abc"}, ["--nsides", "8:0"])
    assert raised.value.code == 2


def test_a_server_terminated_by_its_pods_deletion_exits_143_which_calls_for_a_rescan() -> None:
    """SIGTERM (the Pod deleted or evicted) while the server waits on the REST API: it ends at once
    with a killed process's status, which the operator reads as a transient failure."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        env = {**os.environ, "SKYSCAN_SKYDRIVER_ADDRESS": f"http://127.0.0.1:{silent.getsockname()[1]}",
               "SKYSCAN_SKYDRIVER_SCAN_ID": "abc"}  # fmt: skip
        server = subprocess.Popen(
            [sys.executable, "-m", "skyscan_local.scanner_server", "--nsides", "8:0"],
            env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stderr is not None
            for line in server.stderr:  # up once it logs its start
                if "scanner server starting" in line:
                    break
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 143
        finally:
            server.kill()
    assert PodView("p", "Failed", "Error", 143).transient_failure
