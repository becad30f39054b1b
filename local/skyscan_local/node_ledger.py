"""The real node's ledger: what it started and what it changed on the host, each written to its state
file before it is made, and `undo`, which puts every such change back, each step whatever the others
did."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skyscan_local import host, processes
from skyscan_local.control_plane import Process
from skyscan_local.node_config import BRIDGE, CHAIN_PREFIXES, FIXED_DIRS, IPSET_PREFIXES, VOLATILE, Paths
from skyscan_local.node_containerd import forget_containers, kill_shims
from skyscan_local.node_network import delete_link


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


def load(node_dir: Path) -> NodeState | None:
    f = Paths(node_dir).state
    if not f.exists():
        return None
    raw = json.loads(f.read_text())
    raw["processes"] = [Process(**p) for p in raw["processes"]]
    return NodeState(**raw)


def save(state: NodeState) -> None:
    f = Paths(Path(state.dir)).state
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(f)


def undo(state: NodeState, timeout: float) -> tuple[list[str], list[str]]:
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
        step("containers", lambda: forget_containers(p))
        step("containerd", lambda: processes.stop([by_name["containerd"].recorded()], timeout))
    step("containerd shims", lambda: kill_shims(p))
    roots = [p.dir, *(Path(d) for d in FIXED_DIRS)]
    step("mounts", lambda: host.unmount_under(roots, keep=state.kept_mounts))
    for d, before in state.dirs.items():
        step(d, lambda d=d, before=before: host.restore_dir(Path(d), before))
    for name in VOLATILE:
        step(name, lambda name=name: host.remove_tree(getattr(p, name)))
    if state.bridge:
        step(f"interface {BRIDGE}", lambda: delete_link(BRIDGE))
    if state.chains:
        step("iptables chains", lambda: host.remove_chains(CHAIN_PREFIXES))
    if state.ipsets is not None:  # once no rule refers to them
        kept = state.ipsets
        step("ipsets", lambda: host.destroy_ipsets(IPSET_PREFIXES, keep=kept))
    for group in kubepods:
        step(str(group), lambda group=group: host.remove_cgroup(group))
    step("sysctls", lambda: undone.extend(host.restore_sysctls(state.sysctls)))
    return undone, errors
