"""The scanner simulator's sidecar (the real `skyscan.io.sidecar` program) ends with the simulator, as a
Pod's containers end with the Pod, even when the simulator is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from skyscan_local import processes

pytestmark = pytest.mark.timeout(60)

# A simulator process running one Pod's sidecar (waiting for a startup.json that never comes).
SIMULATOR = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from skyscan_local import scanner_report
    from skyscan_local.scanner_pod import ScannerSimSettings, ServerPod, Sidecar
    from skyscan_local.scanner_simulator import run_sidecar

    out = Path(sys.argv[1])
    ENV = {"SKYSCAN_SKYDRIVER_ADDRESS": "http://127.0.0.1:9", "SKYSCAN_SKYDRIVER_SCAN_ID": "s",
           "SKYSCAN_SKYDRIVER_AUTH": "t"}
    pod = ServerPod(
        pod_name="p", uid="u", address="http://127.0.0.1:9", scan_id="s", token="t",
        args=scanner_report.ServerArgs(nsides={8: 0}, real_event=False, predictive_scanning_threshold=1.0),
        startup_json=out, sidecar=Sidecar(args=[str(out)], env=ENV),
    )
    asyncio.run(run_sidecar(pod, ScannerSimSettings()))
    """
)


def test_a_killed_simulator_leaves_no_sidecar_behind(tmp_path: Path) -> None:
    simulator = subprocess.Popen([sys.executable, "-c", SIMULATOR, str(tmp_path / "startup.json")])
    try:
        sidecar = _wait_for_child(simulator.pid)
        time.sleep(1)  # not a condition: the sidecar must still be there, waiting for its file
        assert processes.command_line(sidecar), "the sidecar did not stay up (a broken set-up)"
        os.kill(simulator.pid, signal.SIGKILL)
        simulator.wait(10)
        deadline = time.monotonic() + 10
        while processes.command_line(sidecar) and time.monotonic() < deadline:  # gone, or a zombie
            time.sleep(0.1)
        assert not processes.command_line(sidecar), "the sidecar outlived its simulator"
    finally:
        simulator.kill()


def _wait_for_child(pid: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in map(int, children):
            if "skyscan.io.sidecar" in " ".join(processes.command_line(child) or []):
                return child
        time.sleep(0.1)
    raise TimeoutError("the simulator started no sidecar")
