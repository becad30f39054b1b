"""The scanner image's server reads what the operator's Job gives its container: args and env."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyscan_local.scanner_server import server_pod
from skyscan_local.scanner_simulator import ScannerExit
from skyscan_operator import scanner_job
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
