"""`skyscan-cluster up` / `down`: a second, throwaway control plane, checked process by process."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from skyscan_local import control_plane as localcluster

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SKYSCAN_TEST_KUBECONFIG")), reason="exercises the local control plane only"
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skyscan_local.control_plane", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_up_twice_then_down_leaves_nothing_behind(tmp_path: Path) -> None:
    workdir = tmp_path / "c"
    try:
        first = cli("up", "--dir", str(workdir))
        assert first.returncode == 0, first.stderr
        kubeconfig = Path(first.stdout.strip())
        state = localcluster.load(workdir)
        assert state is not None
        names = [p.name for p in state.processes]
        assert names == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        assert state.running()

        cfg = yaml.safe_load(kubeconfig.read_text())
        token = cfg["users"][0]["user"]["token"]
        ca = ssl.create_default_context(cafile=cfg["clusters"][0]["cluster"]["certificate-authority"])
        auth = {"Authorization": f"Bearer {token}"}
        version = httpx.get(f"{state.server}/version", verify=ca, headers=auth)
        assert version.json()["gitVersion"].startswith("v1.33.")
        anonymous = httpx.get(f"{state.server}/api/v1/namespaces", verify=ca)
        assert anonymous.status_code in (401, 403)  # auth is really on

        again = cli("up", "--dir", str(workdir))  # harmless: the same cluster, same processes
        assert again.returncode == 0 and again.stdout.strip() == str(kubeconfig)
        assert [p.pid for p in localcluster.load(workdir).processes] == [p.pid for p in state.processes]  # type: ignore[union-attr]
    finally:
        down = cli("down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert not any(p.alive() for p in state.processes)
    assert not workdir.exists()
