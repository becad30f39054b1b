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
import datetime as dt
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from skyscan_local import control_plane, host, processes
from skyscan_local.control_plane import Process
from skyscan_local.control_plane_pki import KUBELET_CLIENT_CERT, write_kubelet_client_pki
from skyscan_local.node_config import (
    BRIDGE,
    CHAIN_PREFIXES,
    CLIENTS_CHAIN,
    CNI_BIN,
    FIXED_DIRS,
    GATEWAY,
    HELD_METRIC,
    IPSET_PREFIXES,
    KUBE_ROUTER_HEALTH_PORT,
    KUBELET_PORT,
    KUBELET_SYSCTLS,
    KUBERNETES_SERVICE,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    NodeError,
    Paths,
    cni_config,
    containerd_config,
    corefile,
    firewall_rules,
    held_routes,
    kube_proxy_config,
    kube_router_argv,
    kubelet_config,
)
from skyscan_local.node_containerd import ctr, ensure_images, import_images
from skyscan_local.node_ledger import NodeState, load, save, undo
from skyscan_local.node_network import add_bridge, add_chains, hold_routes, release_routes

# The node's face: its operations, and its names, addresses and configuration (node_config), which the
# real stack, the audit and the tests read here.
__all__ = [
    "BRIDGE", "CLIENTS_CHAIN", "GATEWAY", "HELD_METRIC", "KUBELET_PORT", "KUBELET_SYSCTLS",
    "KUBERNETES_SERVICE", "NODE_NAME", "PAUSE_IMAGE", "POD_CIDR", "NodeError", "NodeState", "Paths",
    "another_node", "containerd_config", "ensure", "ensure_binaries", "ensure_images", "firewall_rules",
    "held_routes", "hold_routes", "kube_proxy_config", "kubelet_config", "load", "main",
    "prepare_control_plane", "release_routes", "start", "stop", "unfit_reason",
]  # fmt: skip
REPO = Path(__file__).resolve().parents[2]


# --- certificates ----------------------------------------------------------------------------------


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
    save(state)
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


def _containerd_answers(p: Paths) -> bool:
    """Whether containerd answers on its socket: not yet while it starts (the socket refused or absent,
    which a loaded machine makes last), so the wait goes on rather than failing at its first look."""
    try:
        ctr(p, "version", timeout=5)
    except (NodeError, subprocess.TimeoutExpired):
        return False
    return True


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
    save(state)  # the ledger exists before the first change
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
    state.bridge = True  # each in the ledger before it is made
    save(state)
    add_bridge()
    state.chains = True
    save(state)
    add_chains(cluster.ports["apiserver"], host_ports)

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
    save(state)
    router = _spawn(state, "kube-router", kube_router_argv(bin_dir, kubeconfig), tie_to_parent)
    with httpx.Client(timeout=5) as plain:
        _wait(lambda: plain.get(f"http://127.0.0.1:{KUBE_ROUTER_HEALTH_PORT}/healthz").status_code == 200,
              "kube-router", timeout, router, p.logs / "kube-router.log")  # fmt: skip
    if state.host_clients:
        namespace, selector = state.host_clients.split("/", 1)
        argv = [sys.executable, "-m", "skyscan_local.host_clients", "--kubeconfig", kubeconfig,
                "--namespace", namespace, "--selector", selector, "--chain", CLIENTS_CHAIN]  # fmt: skip
        _spawn(state, "host-clients", argv, tie_to_parent)


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
    undone, errors = undo(state, timeout)
    if errors:
        print("undoing the node again after: " + "; ".join(errors), file=sys.stderr)
        time.sleep(1)
        undone, errors = undo(state, timeout)
    if errors:
        raise NodeError("the node was not entirely undone (its ledger stays for another `down`):\n  "
                        + "\n  ".join(errors))  # fmt: skip
    hold_routes()  # held since `start`; again for a node started before they were
    Paths(Path(state.dir)).state.unlink()
    return undone


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
