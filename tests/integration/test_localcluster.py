"""`skyscan-cluster up` / `down` / `reset`: a second, throwaway control plane, checked process by process."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from skyscan_local import control_plane as localcluster
from skyscan_local import processes
from tests.conftest import Cluster

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


def test_up_twice_then_down_keeps_the_data_and_reset_deletes_it(tmp_path: Path) -> None:
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
    assert (workdir / "etcd").is_dir()  # `down` stops; only `reset` deletes
    reset = cli("reset", "--dir", str(workdir))
    assert reset.returncode == 0 and "etcd data" in reset.stdout, reset.stderr
    assert not workdir.exists()


def _client(state: localcluster.ClusterState) -> httpx.Client:
    cfg = yaml.safe_load(Path(state.kubeconfig).read_text())
    ca = ssl.create_default_context(cafile=cfg["clusters"][0]["cluster"]["certificate-authority"])
    token = cfg["users"][0]["user"]["token"]
    return httpx.Client(
        base_url=state.server, verify=ca, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scan.yaml"
SCANS = "/apis/skyscan.io/v1alpha1/namespaces/default/scans"


def test_up_restarts_a_dead_component_in_place_and_never_deletes_data(tmp_path: Path) -> None:
    """The API server killed, then etcd with it, then all stopped, then its certificates about to expire
    (clusters once got 30 days): each `up` brings back the same cluster (its Scans, ports, token and
    kubeconfig), restarts only what it must, and the logs go on after what each run wrote. `up` once
    recreated the cluster: every Scan gone, a new port."""
    workdir = tmp_path / "c"

    def crash(*names: str) -> None:
        for name in names:
            localcluster.stop_component(workdir, name, crash=True)

    def down() -> None:
        assert cli("down", "--dir", str(workdir)).returncode == 0

    def expiring() -> None:
        localcluster.write_pki(workdir, days=1, keep_signing_key=True)

    every = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
    rounds: list[tuple[Callable[[], None], set[str]]] = [
        (lambda: crash("kube-apiserver"), {"kube-apiserver"}),
        (lambda: crash("etcd", "kube-apiserver"), {"etcd", "kube-apiserver"}),
        (down, every),
        (expiring, every - {"etcd"}),
    ]
    try:
        assert cli("up", "--dir", str(workdir)).returncode == 0
        state = localcluster.load(workdir)
        assert state is not None and state.etcd_tls
        scan = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "Scan")
        with _client(state) as api:
            created = api.post(SCANS, json=scan).raise_for_status().json()
        kubeconfig = Path(state.kubeconfig).read_text()
        for action, restarted in rounds:
            before = {p.name: p.pid for p in localcluster.load(workdir).processes}  # type: ignore[union-attr]
            action()
            again = cli("up", "--dir", str(workdir))
            assert again.returncode == 0, again.stderr
            after = localcluster.load(workdir)
            assert after is not None and after.ports == state.ports and after.server == state.server
            assert after.running() and Path(after.kubeconfig).read_text() == kubeconfig
            pids = {p.name: p.pid for p in after.processes}
            assert {n for n in pids if pids[n] != before[n]} == restarted, again.stderr
            with _client(after) as api:  # trusting the CA file the kubeconfig names, renewed or not
                kept = api.get(f"{SCANS}/{scan['metadata']['name']}").json()
                assert kept["metadata"]["uid"] == created["metadata"]["uid"]  # the same object
                assert kept["spec"] == created["spec"]
        assert localcluster.pki_expires(workdir) > dt.datetime.now(dt.UTC) + dt.timedelta(days=3000)
        for name, starts in {"kube-apiserver": 5, "etcd": 3, "kwok": 3}.items():
            log = (workdir / "logs" / f"{name}.log").read_text()
            assert log.count(processes.START_MARKER) == starts, name  # the first run's and each restart's
        refused = cli("reset", "--dir", str(workdir))  # while it runs
        assert refused.returncode == 1 and "is running; stop it first" in refused.stderr
        assert workdir.exists()
    finally:
        cli("down", "--dir", str(workdir))
        cli("reset", "--dir", str(workdir))


def test_etcd_answers_only_the_api_servers_client_certificate(cluster: Cluster) -> None:
    # The session's control plane: `up` starts one as the session fixture does (control_plane.start).
    state = cluster.local
    assert state is not None and state.etcd_tls
    workdir = Path(state.workdir)
    health = f"127.0.0.1:{state.ports['etcd']}/health"
    with pytest.raises(httpx.TransportError):  # plain HTTP: the TLS listener drops it
        httpx.get(f"http://{health}", timeout=5)
    ca = ssl.create_default_context(cafile=str(workdir / "etcd-ca.crt"))
    with pytest.raises(httpx.TransportError):  # TLS without a client certificate: refused
        httpx.get(f"https://{health}", verify=ca, timeout=5)
    ca.load_cert_chain(workdir / "etcd-client.crt", workdir / "etcd-client.key")
    assert httpx.get(f"https://{health}", verify=ca, timeout=5).json()["health"] == "true"
    for name in ("etcd-client.key", "etcd-server.key", "ca.crt"):
        assert (workdir / name).stat().st_mode & 0o077 == 0, name
