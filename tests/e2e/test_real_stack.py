"""`make up NODE=real` as a user runs it: Skyscan installed by its own chart on a real node, a scan
launched with the `skyscan` command through the shim's Service reaching its final result in a scanner
Pod on that node, then `make down` leaving the host as it found it.

Skipped, loudly (the summary's REAL NODE NOT TESTED section), when the machine cannot run a node."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyscan_local import control_plane, host, node, real_stack
from tests.e2e.test_real_node import TEST_DIR

UNFIT = node.unfit_reason()
pytestmark = [
    pytest.mark.real_node,
    pytest.mark.skipif(UNFIT is not None, reason=f"REAL NODE NOT TESTED: {UNFIT}"),
]
STACK_DIR = TEST_DIR  # its node is test_real_node's
SCAN_LABEL = "skyscan.io/scan-id"
EVENT = '{"value": {"data": {"run_id": 138632, "event_id": 31747601, "mjd": 59723.32}}}'


def env_file(d: Path) -> dict[str, str]:
    values = {}
    for line in (d / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = shlex.split(value)[0] if value else ""
    return values


def seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    real_stack.down(STACK_DIR)  # what a killed run left
    if reason := node.another_node():
        pytest.skip(f"REAL NODE NOT TESTED: {reason}")
    control_plane.remove(real_stack.real_dir(STACK_DIR) / "cluster")  # fresh; the node's images stay
    try:
        yield STACK_DIR
    finally:
        real_stack.down(STACK_DIR)


@pytest.mark.timeout(1500)  # a cold machine builds binaries and images first
def test_a_scan_runs_in_pods_of_the_charts_release_on_a_real_node(stack_dir: Path, tmp_path: Path) -> None:
    node.ensure_binaries(), node.ensure_images()  # cold builds outside the timings below
    before = host.snapshot()
    began = time.monotonic()
    real_stack.up(stack_dir, tie_to_parent=True)
    print(f"make up NODE=real (warm builds) took {time.monotonic() - began:.1f}s")
    api = real_stack.Api(real_stack.real_dir(stack_dir) / "cluster")
    pods = api.get(f"/api/v1/namespaces/{real_stack.NAMESPACE}/pods")
    assert pods is not None
    placed = {p["metadata"]["name"].rsplit("-", 2)[0]: p["spec"]["nodeName"] for p in pods["items"]}
    assert placed == dict.fromkeys(["skyscan-operator", "skyscan-shim", "skyscan-wms"], node.NODE_NAME)

    (tmp_path / "event.json").write_text(EVENT)
    env = {**os.environ, **env_file(stack_dir), "SKYSCAN_LOCAL_DIR": str(stack_dir)}
    skyscan = str(Path(sys.executable).parent / "skyscan")
    launch = [skyscan, "launch", "--reco-algo", "millipede_wilks", "--nsides", "8:0", "64:12",
              "--max-pixel-reco-time", "600", "--cluster", "osg=4", "--event", "event.json",
              "--follow"]  # fmt: skip
    done = subprocess.run(launch, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SCAN_HAS_FINAL_RESULT" in done.stdout.splitlines()[-1]
    scan_id = done.stdout.splitlines()[0].strip()

    pod, deadline = {}, time.monotonic() + 60
    while time.monotonic() < deadline:  # the final result is sent before the scanner exits
        scanners = api.get(
            f"/api/v1/namespaces/{real_stack.NAMESPACE}/pods?labelSelector={SCAN_LABEL}={scan_id}"
        )
        assert scanners is not None and len(scanners["items"]) == 1
        pod = scanners["items"][0]
        scanner = pod["status"]["containerStatuses"][0]
        if "terminated" in scanner["state"]:
            break
        time.sleep(0.5)
    assert pod["spec"]["nodeName"] == node.NODE_NAME
    assert pod["spec"]["containers"][0]["image"] == "localhost/skyscan-scanner:4.2.0"  # the scan's tag
    assert scanner["image"].startswith("localhost/skyscan-scanner:")  # containerd names one of its tags
    assert scanner["state"]["terminated"]["exitCode"] == 0
    scan = api.get(f"/apis/skyscan.io/v1alpha1/namespaces/{real_stack.NAMESPACE}/scans/{scan_id}")
    assert scan is not None
    latency = seconds(scanner["state"]["terminated"]["startedAt"]) - seconds(
        scan["metadata"]["creationTimestamp"]
    )
    print(f"Scan created -> scanner container running: {latency:.0f}s (second resolution)")

    real_stack.down(stack_dir)
    after = host.snapshot()
    for part in ("mounts", "interfaces", "iptables", "sysctls"):
        assert after[part] == before[part], part
