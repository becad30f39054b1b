"""A real Kubernetes node for the local control plane: containerd, a CNI bridge, the kubelet,
kube-proxy and CoreDNS, on this machine, beside kwok's fake node.

    skyscan-node up --cluster-dir .skyscan/cluster [--dir .skyscan/node]
    skyscan-node down [--dir .skyscan/node]
    skyscan-node release    (the routes it holds for its ranges: once its data is gone)

Pods run on it as on any cluster: images imported from the local builds (tools/node/images.sh, no
registry), Services through kube-proxy (iptables mode), cluster DNS from CoreDNS. Choices:
- CoreDNS runs as a host process, like the kubelet and kube-proxy, serving `cluster.local` on the
  bridge's address from the admin kubeconfig: it needs no image, no pod network and no Service, and it
  is up before the first Pod asks. Other names are NXDOMAIN: Pods have no way out of the machine.
- The `kubernetes` Service (10.0.0.1:443) reaches the API server, which listens on loopback only, by a
  DNAT rule from the bridge (route_localnet on the bridge alone). The control plane runs without an
  endpoint reconciler, so kube-proxy has no endpoints for it and leaves it to that rule.
- The kubelet serves on the bridge's address only, to client certificates of a CA of the node's own
  (its key is discarded once it signed the API server's), authorised by the API server (webhook).
- Pods reach the host only for DNS, the API server and the ports a caller allows, those only from the
  Pods a label selector names (`host_clients`: their addresses kept in a chain by a watcher,
  skyscan_local.host_clients); forwarding between the bridge and any other interface is dropped: Pod
  traffic never leaves the machine.
- The host's packets for the Service and Pod ranges never leave by the default route either: from its
  first start the node holds an `unreachable` route for each (`held_routes`), behind the bridge's live
  ones, kept by `stop` (a client with a stale `.skyscan/env` is refused at once) and removed by
  `release_routes` (`make reset`).

Everything else it changes on the host is recorded in its state file before it is made and undone by
`stop`: processes, the bridge, iptables chains, mounts, cgroups under /kubepods, the fixed directories
the kubelet and containerd use whatever they are told, and the sysctls (skyscan_local.host). Only one
real node fits on a machine (fixed paths, the kubelet's port). Needs root, runc and cgroups.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skyscan_local import control_plane, host, processes
from skyscan_local.control_plane import KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY, Process

REPO = Path(__file__).resolve().parents[2]
IMAGES_SCRIPT = REPO / "tools" / "node" / "images.sh"
NODE_NAME = "skyscan-node"
BRIDGE = "skyscan0"
POD_CIDR = "10.99.0.0/24"
GATEWAY = "10.99.0.1"  # the bridge's address: the node's InternalIP, cluster DNS, the kubelet
KUBERNETES_SERVICE = ("10.0.0.1", 443)  # the first address of the control plane's service range
# The ranges the host reaches through the bridge. Each is held by an `unreachable` route of a metric
# above the live ones' (0: the bridge's own and the Service range's), from the first start until
# `release_routes`: node up or down, no packet for them leaves by the default route.
HELD_RANGES = (control_plane.SERVICE_RANGE, POD_CIDR)
HELD_METRIC = 4242
KUBE_ROUTER_HEALTH_PORT = 20244  # its default; it listens on every address (Pods' traffic to it is dropped)
IPSET_PREFIXES = ("KUBE-", "kube-router-")  # kube-router's sets
# The mangle chain accepting the Pods that may reach the host ports, one rule per address (an iptables
# chain, not an ipset: kube-router restores every ipset of the host from its own last view of them).
CLIENTS_CHAIN = "SKYSCAN-NODE-CLIENTS"
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
KUBELET_SYSCTLS = {"vm.overcommit_memory": "1", "kernel.panic": "10", "kernel.panic_on_oops": "1"}  # it sets
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
PAUSE_IMAGE = "localhost/pause:dev"
IMAGES = ("pause", "skyscan", "skyscan-scanner")  # <images dir>/<name>.tar holds localhost/<name>:dev
CHAIN_PREFIXES = ("KUBE-", "SKYSCAN-NODE-")  # the kubelet's and kube-proxy's chains, and ours
STATE_FILE = "state.json"
# Paths the kubelet, containerd and the CNI plugins use whatever their configuration says: each is put
# back as it was (deleted, or what was added inside it removed).
FIXED_DIRS = (
    "/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd", "/var/lib/cni",
    "/run/netns", "/opt/containerd", "/etc/cni", "/opt/cni", "/var/run/kubernetes", "/etc/kubernetes",
)  # fmt: skip


class NodeError(RuntimeError):
    pass


@dataclass
class NodeState:
    """The node's ledger: what it started and what it changed, each written before it is made."""

    dir: str
    cluster_dir: str
    processes: list[Process] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)  # as they were before the start
    dirs: dict[str, list[str] | None] = field(default_factory=dict)  # what was below FIXED_DIRS before
    kept_mounts: list[str] = field(default_factory=list)  # mounts under FIXED_DIRS before the start
    cgroups: list[str] = field(default_factory=list)  # each hierarchy's kubepods (none before the start)
    bridge: bool = False
    chains: bool = False
    host_ports: list[int] = field(default_factory=list)  # as started with
    host_clients: str = ""  # as started with: "<namespace>/<label selector>"
    ipsets: list[str] | None = None  # kube-router's prefixes' sets before the start (None: not recorded)


@dataclass(frozen=True)
class Paths:
    """Where the node keeps its files. The containerd root (the imported images) stays between runs."""

    dir: Path

    def __getattr__(self, name: str) -> Path:
        return self.dir / LAYOUT[name]


LAYOUT = {
    "state": STATE_FILE,
    "logs": "logs",
    "pod_logs": "logs/pods",
    "containerd_config": "containerd/config.toml",
    "containerd_root": "containerd/root",
    "containerd_state": "containerd/state",
    "containerd_socket": "containerd/containerd.sock",
    "containerd_ttrpc": "containerd/containerd.sock.ttrpc",
    "runc_root": "containerd/runc",
    "opt": "containerd/opt",
    "cni_conf": "cni/net.d",
    "ipam": "cni/ipam",
    "kubelet_root": "kubelet",
    "kubelet_config": "kubelet.yaml",
    "kubelet_ca": "kubelet-client-ca.crt",
    "resolv_conf": "resolv.conf",
    "proxy_config": "kube-proxy.yaml",
    "corefile": "Corefile",
    "images_imported": "containerd/imported.json",
}
VOLATILE = (
    "containerd_state",
    "containerd_ttrpc",
    "runc_root",
    "ipam",
    "kubelet_root",
    "opt",
)  # removed at every stop


# --- configuration (pure) -------------------------------------------------------------------------


def containerd_config(p: Paths) -> str:
    """Its own root, state and socket; cgroupfs (cgroup v1, no systemd here); `restrict_oom_score_adj`
    as runc cannot set an oom_score_adj below ours without CAP_SYS_RESOURCE; the local pause image."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{p.containerd_root}"
state = "{p.containerd_state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{p.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{p.opt}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{p.runc_root}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{p.cni_conf}"
    max_conf_num = 1
"""


def cni_config(p: Paths) -> dict[str, Any]:
    """A bridge with host-local addresses; no masquerading (nothing leaves the machine); hairpin so a
    Pod reaches itself through its own Service."""
    return {
        "cniVersion": "1.0.0",
        "name": "skyscan",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(p.ipam),
                },
            }
        ],
    }


def kubelet_config(p: Paths) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": GATEWAY,  # Pods are kept from it by the firewall; the API server reaches it here
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(p.kubelet_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{p.containerd_socket}",
        "clusterDNS": [GATEWAY],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(p.resolv_conf),
        "podCIDR": POD_CIDR,
        "podLogsDir": str(p.pod_logs),
        "failSwapOn": False,
        # No image can be pulled again here: never collect one.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # A developer's disk, not a node's own: the defaults (evict below 10-15 % free) evicted every
        # Pod on a 252 GB disk with 31 GB free. Evict only when it is really full.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1Gi",
            "imagefs.available": "1Gi",
            "nodefs.inodesFree": "1%",
            "imagefs.inodesFree": "1%",
        },
        "registerNode": True,
    }


def kube_proxy_config(kubeconfig: str) -> dict[str, Any]:
    """iptables mode; node ports on the bridge only; host sysctls left alone (no conntrack sizing, no
    route_localnet for localhost node ports)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{GATEWAY}/32"],
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(kubeconfig: str, ready_port: int, health_port: int) -> str:
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ready_port}
    health 127.0.0.1:{health_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {GATEWAY}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def firewall_rules(api_port: int, host_ports: tuple[int, ...]) -> dict[str, list[list[str]]]:
    """Our chains (by `table/chain`), each jumped to first from the built-in chain of its suffix. The
    host is guarded in the mangle table, ahead of the filter table where a NetworkPolicy enforcer
    (kube-router) accepts what policies allow: no policy can open the host to Pods. The host ports
    take only the addresses CLIENTS_CHAIN accepts."""
    svc_ip, svc_port = KUBERNETES_SERVICE
    to_host = ["-i", BRIDGE, "-d", f"{GATEWAY}/32"]
    return {
        # Pods reach the API server at the `kubernetes` Service's address (it listens on loopback), and
        # the host's loopback services (PostgreSQL: a real deployment keeps its database outside the
        # cluster) at the bridge's address.
        "nat/PREROUTING": [
            ["-i", BRIDGE, "-d", f"{svc_ip}/32", "-p", "tcp", "--dport", str(svc_port),
             "-j", "DNAT", "--to-destination", f"127.0.0.1:{api_port}"],
            *([*to_host, "-p", "tcp", "--dport", str(port),
               "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"] for port in host_ports),
        ],
        # Nothing is forwarded between the bridge and another interface: Pods stay on this machine.
        "mangle/FORWARD": [
            ["-i", BRIDGE, "-o", BRIDGE, "-j", "RETURN"],
            ["-i", BRIDGE, "-j", "DROP"],
            ["-o", BRIDGE, "-j", "DROP"],
        ],
        # Of the host, Pods reach DNS, the API server and the host services above only (checked before
        # the DNAT: the `kubernetes` Service's address is not the host's).
        "mangle/PREROUTING": [
            ["-i", BRIDGE, "-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", "RETURN"],
            ["-i", BRIDGE, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
            [*to_host, "-p", "udp", "--dport", "53", "-j", "RETURN"],
            [*to_host, "-p", "tcp", "--dport", "53", "-j", "RETURN"],
            *([*to_host, "-p", "tcp", "--dport", str(port), "-j", CLIENTS_CHAIN] for port in host_ports),
            ["-i", BRIDGE, "-j", "DROP"],
        ],
    }  # fmt: skip


def held_routes() -> list[str]:
    """The routes the host holds for the node's ranges, as `ip -4 route show` prints them."""
    return [f"unreachable {cidr} metric {HELD_METRIC}" for cidr in HELD_RANGES]


# --- certificates ----------------------------------------------------------------------------------


def write_kubelet_client_pki(cluster_dir: Path, ca_file: Path) -> None:
    """A CA of the node's own and the one client certificate it signs, the API server's (system:masters,
    so the kubelet's webhook authorisation allows logs and exec); the CA's key is never written."""
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_name, ca = control_plane.new_ca("skyscan-kubelet-client-ca", control_plane.CERT_DAYS)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=control_plane.CERT_DAYS))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    for path, data in (
        (cluster_dir / KUBELET_CLIENT_KEY, control_plane.pem_key(key)),
        (cluster_dir / KUBELET_CLIENT_CERT, cert.public_bytes(serialization.Encoding.PEM)),
        (ca_file, ca.public_bytes(serialization.Encoding.PEM)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o600)


def prepare_control_plane(cluster_dir: Path, node_dir: Path) -> bool:
    """Before the control plane's first start (or to restart its API server with): the API server's
    client certificate for this node's kubelet, which makes it reach the kubelet by InternalIP.
    Returns whether it was (re)written."""
    if (cluster_dir / KUBELET_CLIENT_CERT).exists() and Paths(node_dir).kubelet_ca.exists():
        return False
    write_kubelet_client_pki(cluster_dir, Paths(node_dir).kubelet_ca)
    return True


# --- preflight ------------------------------------------------------------------------------------


def unfit_reason() -> str | None:
    """Why this machine cannot run a real node, or None."""
    if os.geteuid() != 0:
        return "not root (the kubelet, containerd, mounts, iptables and cgroups need root)"
    for tool in ("runc", "containerd", "ctr", "iptables", "ipset", "ip"):
        if shutil.which(tool) is None:
            return f"no {tool} (tools/node/packages.sh installs the Debian packages)"
    if not (CNI_BIN / "bridge").exists():
        return f"no CNI bridge plugin in {CNI_BIN} (Debian's containernetworking-plugins)"
    mounted = host.cgroup_hierarchies()
    if not mounted:
        return "no cgroups mounted"
    if not any(
        (h / "memory.limit_in_bytes").exists() or (h / "cgroup.controllers").exists() for h in mounted
    ):
        return "no memory cgroup controller"
    return None


def another_node() -> str | None:
    """Why another node seems to run on this machine, or None."""
    if host.owned_chains(CHAIN_PREFIXES):
        return "iptables chains KUBE-*/SKYSCAN-NODE-* exist: another node (kubelet or kube-proxy) runs here"
    if any((h / "kubepods").exists() for h in host.cgroup_hierarchies()):
        return "the kubepods cgroup exists: another kubelet runs (or ran) on this machine"
    if BRIDGE in host.interfaces():
        return f"the interface {BRIDGE} exists already"
    return None


# --- start ----------------------------------------------------------------------------------------


def load(node_dir: Path) -> NodeState | None:
    f = Paths(node_dir).state
    if not f.exists():
        return None
    raw = json.loads(f.read_text())
    raw["processes"] = [Process(**p) for p in raw["processes"]]
    return NodeState(**raw)


def _save(state: NodeState) -> None:
    f = Paths(Path(state.dir)).state
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(f)


def _cluster(cluster_dir: Path) -> control_plane.ClusterState:
    state = control_plane.load(cluster_dir)
    if state is None or not state.running():
        raise NodeError(f"no running control plane in {cluster_dir}")
    return state


def _ensure_apiserver_flags(cluster_dir: Path, node_dir: Path, tie_to_parent: bool) -> None:
    """The running API server must know the kubelet's client certificate; restart it in place if not."""
    written = prepare_control_plane(cluster_dir, node_dir)
    apiserver = next(p for p in _cluster(cluster_dir).processes if p.name == "kube-apiserver")
    flags = processes.command_line(apiserver.pid) or []
    if written or "--kubelet-preferred-address-types=InternalIP" not in flags:
        print("restarting the API server with the kubelet's client certificate", file=sys.stderr)
        control_plane.stop_component(cluster_dir, "kube-apiserver")
        control_plane.start_component(cluster_dir, "kube-apiserver", tie_to_parent=tie_to_parent)


def _spawn(state: NodeState, name: str, argv: list[str], tie_to_parent: bool) -> subprocess.Popen[bytes]:
    proc = processes.spawn(argv, Paths(Path(state.dir)).logs / f"{name}.log", tie_to_parent=tie_to_parent)
    state.processes.append(Process(name=name, pid=proc.pid, binary=argv[0]))
    _save(state)
    return proc


def _wait(check: Any, what: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    processes.wait_until(check, what, timeout, proc=proc, log=log, error=NodeError)


def ensure_binaries() -> Path:
    """The control plane's binaries plus the kubelet, kube-proxy, CoreDNS and kube-router (built once,
    cached)."""
    ready = os.environ.get("SKYSCAN_K8S_BIN_READY")
    if ready and all((Path(ready) / b).exists() for b in ("kubelet", "kube-proxy", "coredns", "kube-router")):
        return Path(ready)
    argv = ["bash", str(control_plane.BUILD_SCRIPT), "--real-node"]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def ensure_images() -> Path:
    """Build (or find) the node's images; returns their directory."""
    if override := os.environ.get("SKYSCAN_NODE_IMAGES_READY"):
        return Path(override)
    out = subprocess.run(["bash", str(IMAGES_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _ctr(p: Paths, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = ["ctr", "--address", str(p.containerd_socket), "--namespace", "k8s.io", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise NodeError(f"{' '.join(argv)}: {done.stderr.strip()[-800:]}")
    return done


def _containerd_answers(p: Paths) -> bool:
    """Whether containerd answers on its socket: not yet while it starts (the socket refused or absent,
    which a loaded machine makes last), so the wait goes on rather than failing at its first look."""
    try:
        _ctr(p, "version", timeout=5)
    except (NodeError, subprocess.TimeoutExpired):
        return False
    return True


def import_images(p: Paths, images_dir: Path) -> list[str]:
    """Import each image whose archive changed since its last import (the containerd root stays between
    runs); returns the names imported."""
    record = json.loads(p.images_imported.read_text()) if p.images_imported.exists() else {}
    present = set(_ctr(p, "images", "list", "--quiet").stdout.split())
    imported = []
    for name in IMAGES:
        tar = (images_dir / f"{name}.tar").resolve()
        if record.get(name) == tar.name and f"localhost/{name}:dev" in present:
            continue
        _ctr(p, "images", "import", "--no-unpack=false", str(tar))
        record[name] = tar.name
        p.images_imported.write_text(json.dumps(record))
        imported.append(name)
    return imported


def _add_chains(api_port: int, host_ports: tuple[int, ...]) -> None:
    for where, rules in firewall_rules(api_port, host_ports).items():
        table, builtin = where.split("/")
        chain = f"SKYSCAN-NODE-{builtin}"
        host.run("iptables", "-w", "5", "-t", table, "-N", chain)
        for rule in rules:
            host.run("iptables", "-w", "5", "-t", table, "-A", chain, *rule)
        host.run("iptables", "-w", "5", "-t", table, "-I", builtin, "1", "-j", chain)


def _node_ready(api: httpx.Client, server: str, since: float) -> bool:
    """Ready, as posted by a kubelet running since `since` (the Node keeps its last status meanwhile)."""
    got = api.get(f"{server}/api/v1/nodes/{NODE_NAME}")
    conditions = got.json().get("status", {}).get("conditions") or [] if got.is_success else []
    return any(
        c["type"] == "Ready"
        and c["status"] == "True"
        and dt.datetime.fromisoformat(c["lastHeartbeatTime"]).timestamp() >= int(since)
        for c in conditions
    )


def start(
    node_dir: Path,
    cluster_dir: Path,
    *,
    images_dir: Path | None = None,
    host_ports: tuple[int, ...] = (),
    host_clients: str = "",
    tie_to_parent: bool = False,
    timeout: float = 120.0,
) -> NodeState:
    """Start the node on the running control plane in `cluster_dir` (any previous run of it stopped
    and undone first); on failure everything made so far is undone. `host_ports`: TCP ports of
    services on the host's loopback that Pods may reach, at the bridge's address, besides DNS and the
    API server; `host_clients` ("<namespace>/<label selector>"): the Pods that may (none if empty)."""
    if reason := unfit_reason():
        raise NodeError(f"this machine cannot run a real node: {reason}")
    node_dir, cluster_dir = node_dir.resolve(), cluster_dir.resolve()
    if load(node_dir):
        stop(node_dir)
    if reason := another_node():
        raise NodeError(reason)
    bin_dir = ensure_binaries()
    images = images_dir or ensure_images()
    p = Paths(node_dir)
    state = NodeState(
        dir=str(node_dir),
        cluster_dir=str(cluster_dir),
        sysctls=host.read_sysctls(),
        dirs={d: host.tree(Path(d)) for d in FIXED_DIRS},
        kept_mounts=[m for m in host.mount_points() if host.under(m, [Path(d) for d in FIXED_DIRS])],
        cgroups=[str(h / "kubepods") for h in host.cgroup_hierarchies()],
        host_ports=list(host_ports),
        host_clients=host_clients,
    )
    for d in (p.logs, p.pod_logs, p.cni_conf, p.ipam, p.kubelet_root, p.containerd_root):
        d.mkdir(parents=True, exist_ok=True)
    _save(state)  # the ledger exists before the first change
    try:
        _start(state, p, bin_dir, images, host_ports, tie_to_parent, timeout)
    except BaseException:
        stop(node_dir)
        raise
    return state


def _start(
    state: NodeState,
    p: Paths,
    bin_dir: Path,
    images: Path,
    host_ports: tuple[int, ...],
    tie_to_parent: bool,
    timeout: float,
) -> None:
    cluster_dir = Path(state.cluster_dir)
    _ensure_apiserver_flags(cluster_dir, p.dir, tie_to_parent)
    cluster = _cluster(cluster_dir)
    kubeconfig = cluster.kubeconfig

    hold_routes()  # before the live routes, kept after them
    # The bridge first, with its address: the kubelet's node IP, CoreDNS's and the kubelet's listeners.
    state.bridge = True
    _save(state)
    host.run("ip", "link", "add", BRIDGE, "type", "bridge")
    host.run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    host.run("ip", "link", "set", BRIDGE, "up")
    # The host reaches Services as the node does, from the bridge's address (else from its own uplink's,
    # which no NetworkPolicy admitting the node names); the route goes with the bridge.
    host.run("ip", "route", "add", control_plane.SERVICE_RANGE, "dev", BRIDGE, "src", GATEWAY)
    host.write_sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")  # the DNAT to the API server
    state.chains = True
    _save(state)
    host.run("iptables", "-w", "5", "-t", "mangle", "-N", CLIENTS_CHAIN)  # empty until the watcher fills it
    _add_chains(cluster.ports["apiserver"], host_ports)

    p.containerd_config.parent.mkdir(parents=True, exist_ok=True)
    p.containerd_config.write_text(containerd_config(p))
    (p.cni_conf / "10-skyscan.conflist").write_text(json.dumps(cni_config(p), indent=2))
    p.resolv_conf.write_text(f"nameserver {GATEWAY}\n")
    p.kubelet_config.write_text(yaml.safe_dump(kubelet_config(p)))
    p.proxy_config.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig)))
    ready_port, health_port = processes.free_port(), processes.free_port()
    p.corefile.write_text(corefile(kubeconfig, ready_port, health_port))

    began = time.monotonic()
    containerd = _spawn(
        state, "containerd", ["containerd", "--config", str(p.containerd_config)], tie_to_parent
    )
    _wait(lambda: _containerd_answers(p), "containerd", timeout, containerd, p.logs / "containerd.log")
    imported = import_images(p, images)
    print(f"containerd ready, images imported {imported or 'already'} in {time.monotonic() - began:.1f}s",
          file=sys.stderr)  # fmt: skip

    coredns = _spawn(state, "coredns", [str(bin_dir / "coredns"), "-conf", str(p.corefile)], tie_to_parent)
    with httpx.Client(timeout=5) as plain:
        _wait(lambda: plain.get(f"http://127.0.0.1:{ready_port}/ready").status_code == 200, "coredns",
              timeout, coredns, p.logs / "coredns.log")  # fmt: skip

    kubelet_began = time.time()
    kubelet = _spawn(
        state,
        "kubelet",
        [
            str(bin_dir / "kubelet"),
            f"--config={p.kubelet_config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={p.kubelet_root}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={GATEWAY}",
            "--node-labels=skyscan.io/node=real",
        ],
        tie_to_parent,
    )
    token = yaml.safe_load(Path(kubeconfig).read_text())["users"][0]["user"]["token"]
    ca = ssl.create_default_context(cafile=str(cluster_dir / "ca.crt"))
    with httpx.Client(verify=ca, headers={"Authorization": f"Bearer {token}"}, timeout=5) as api:
        ready = functools.partial(_node_ready, api, cluster.server, kubelet_began)
        _wait(ready, f"node {NODE_NAME} Ready", timeout, kubelet, p.logs / "kubelet.log")
        print(f"node {NODE_NAME} Ready {time.monotonic() - began:.1f}s after containerd", file=sys.stderr)
    proxy = _spawn(
        state, "kube-proxy", [str(bin_dir / "kube-proxy"), f"--config={p.proxy_config}"], tie_to_parent
    )
    with httpx.Client(timeout=5) as plain:
        _wait(lambda: plain.get("http://127.0.0.1:10256/healthz").status_code == 200, "kube-proxy",
              timeout, proxy, p.logs / "kube-proxy.log")  # fmt: skip

    # NetworkPolicy enforced, as a cluster whose network plugin implements it: kube-router's firewall
    # alone (Pods' egress and ingress by iptables chains KUBE-ROUTER-*/KUBE-POD-FW-* and ipsets).
    state.ipsets = host.ipsets(IPSET_PREFIXES)
    _save(state)
    router = _spawn(state, "kube-router", kube_router_argv(bin_dir, kubeconfig), tie_to_parent)
    with httpx.Client(timeout=5) as plain:
        _wait(lambda: plain.get(f"http://127.0.0.1:{KUBE_ROUTER_HEALTH_PORT}/healthz").status_code == 200,
              "kube-router", timeout, router, p.logs / "kube-router.log")  # fmt: skip
    if state.host_clients:
        namespace, selector = state.host_clients.split("/", 1)
        argv = [sys.executable, "-m", "skyscan_local.host_clients", "--kubeconfig", kubeconfig,
                "--namespace", namespace, "--selector", selector, "--chain", CLIENTS_CHAIN]  # fmt: skip
        _spawn(state, "host-clients", argv, tie_to_parent)


def kube_router_argv(bin_dir: Path, kubeconfig: str) -> list[str]:
    return [
        str(bin_dir / "kube-router"),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",  # kube-proxy's
        "--enable-cni=false",  # the bridge plugin's
        f"--service-cluster-ip-range={control_plane.SERVICE_RANGE}",
        "--metrics-port=0",
        f"--health-port={KUBE_ROUTER_HEALTH_PORT}",
    ]


def ensure(node_dir: Path, cluster_dir: Path, **options: Any) -> NodeState:
    """The recorded node when all its processes run, else one started anew (`start`'s options)."""
    state = load(node_dir.resolve())
    names = {"containerd", "coredns", "kubelet", "kube-proxy", "kube-router"}
    if options.get("host_clients"):
        names.add("host-clients")
    same_ports = (
        state is not None
        and state.host_ports == list(options.get("host_ports", ()))
        and state.host_clients == options.get("host_clients", "")
    )
    if (
        state
        and same_ports
        and {p.name for p in state.processes} == names
        and all(p.alive() for p in state.processes)
    ):
        return state
    return start(node_dir, cluster_dir, **options)


# --- stop -----------------------------------------------------------------------------------------


def stop(node_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop what the node started and undo what it changed, as its ledger says, each step whatever the
    others did; returns what was undone. A step that failed (a cgroup or mount still busy a moment
    after its processes died) is tried again once with all the others, then reported; the ledger then
    stays for another `stop`. The containerd root (imported images) and the logs stay."""
    state = load(node_dir.resolve())
    if state is None:
        return []
    undone, errors = _undo(state, timeout)
    if errors:
        print("undoing the node again after: " + "; ".join(errors), file=sys.stderr)
        time.sleep(1)
        undone, errors = _undo(state, timeout)
    if errors:
        raise NodeError("the node was not entirely undone (its ledger stays for another `down`):\n  "
                        + "\n  ".join(errors))  # fmt: skip
    hold_routes()  # held since `start`; again for a node started before they were
    Paths(Path(state.dir)).state.unlink()
    return undone


def hold_routes() -> None:
    """The held routes in place (each replaced if there: idempotent)."""
    for route in held_routes():
        host.run("ip", "route", "replace", *route.split())


def release_routes() -> list[str]:
    """Remove the held routes, unless a node runs (its bridge exists); returns those removed."""
    if shutil.which("ip") is None or BRIDGE in host.interfaces():
        return []  # no iproute2: no node ever held one here
    held = [route for route in held_routes() if route in host.routes()]
    for route in held:
        host.run("ip", "route", "del", *route.split())
    return held


def _undo(state: NodeState, timeout: float) -> tuple[list[str], list[str]]:
    """Every undo step (each idempotent): what was undone, and the errors of the steps that failed."""
    p = Paths(Path(state.dir))
    undone: list[str] = []
    errors: list[str] = []

    def step(what: str, action: Any) -> None:
        try:
            action()
            undone.append(what)
        except Exception as e:  # one failed step must not keep the others from undoing theirs
            errors.append(f"{what}: {e}")

    by_name = {proc.name: proc for proc in state.processes}
    first = [
        by_name[n].recorded()
        for n in ("host-clients", "kube-router", "kube-proxy", "kubelet", "coredns")
        if n in by_name
    ]
    step("host-clients, kube-router, kube-proxy, kubelet, coredns", lambda: processes.stop(first, timeout))
    kubepods = [Path(g) for g in state.cgroups]
    step("pod processes", lambda: host.kill_cgroups(kubepods))
    if "containerd" in by_name:
        step("containers", lambda: _forget_containers(p))
        step("containerd", lambda: processes.stop([by_name["containerd"].recorded()], timeout))
    step("containerd shims", lambda: _kill_shims(p))
    roots = [p.dir, *(Path(d) for d in FIXED_DIRS)]
    step("mounts", lambda: host.unmount_under(roots, keep=state.kept_mounts))
    for d, before in state.dirs.items():
        step(d, lambda d=d, before=before: host.restore_dir(Path(d), before))
    for name in VOLATILE:
        step(name, lambda name=name: host.remove_tree(getattr(p, name)))
    if state.bridge:
        step(f"interface {BRIDGE}", lambda: _delete_link(BRIDGE))
    if state.chains:
        step("iptables chains", lambda: host.remove_chains(CHAIN_PREFIXES))
    if state.ipsets is not None:  # once no rule refers to them
        kept = state.ipsets
        step("ipsets", lambda: host.destroy_ipsets(IPSET_PREFIXES, keep=kept))
    for group in kubepods:
        step(str(group), lambda group=group: host.remove_cgroup(group))
    step("sysctls", lambda: undone.extend(host.restore_sysctls(state.sysctls)))
    return undone, errors


def _forget_containers(p: Paths) -> None:
    """Delete the dead Pods' containers from containerd's records (its root stays, for the images):
    the next start begins with none, as after a reboot with a clean runtime."""
    if not p.containerd_socket.exists():
        return
    for container in _ctr(p, "containers", "list", "--quiet", timeout=30).stdout.split():
        with contextlib.suppress(NodeError):
            _ctr(p, "tasks", "delete", "--force", container, timeout=30)
        _ctr(p, "containers", "delete", container, timeout=30)


def _kill_shims(p: Paths) -> None:
    """containerd's shims outlive it (they are reparented); ours name our containerd's socket."""
    pids = list(host.processes_with(str(p.containerd_socket)))
    processes.stop(
        [processes.Recorded(pid, tuple((processes.command_line(pid) or ["?"])[:1])) for pid in pids]
    )


def _delete_link(name: str) -> None:
    if name in host.interfaces():
        host.run("ip", "link", "delete", name)


# --- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="skyscan-node", description="A real node for the local control plane."
    )
    parser.add_argument("command", choices=["up", "down", "release", "check"])
    parser.add_argument("--dir", type=Path, default=REPO / ".skyscan" / "node")
    parser.add_argument("--cluster-dir", type=Path, default=REPO / ".skyscan" / "cluster")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            reason = unfit_reason()
            print(reason or "this machine can run a real node")
            return 1 if reason else 0
        if args.command == "release":
            released = release_routes()
            print(f"released {', '.join(released)}" if released else "no held route released")
            return 0
        if args.command == "down":
            undone = stop(args.dir)
            print(
                f"node stopped and the host restored ({len(undone)} steps)" if undone else "no node recorded"
            )
            return 0
        start(args.dir, args.cluster_dir)
        print(NODE_NAME)
        return 0
    except NodeError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
