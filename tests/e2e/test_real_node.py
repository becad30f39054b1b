"""A real node (skyscan_local.node) on a control plane of its own: Pods from the locally built images
run on it, resolve and reach the API server through cluster DNS and the `kubernetes` Service, reach a
Service through kube-proxy, and cannot leave the machine nor reach the host beyond what is allowed;
up -> down -> up -> down leaves the host as it found it (but the routes holding the node's ranges).

Skipped, loudly (the summary's REAL NODE NOT TESTED section), when this machine cannot run one: not
root, no runc or containerd, no cgroups, or another node running here."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyscan_local import control_plane, host, node, real_stack

UNFIT = node.unfit_reason()
pytestmark = [
    pytest.mark.real_node,
    pytest.mark.skipif(UNFIT is not None, reason=f"REAL NODE NOT TESTED: {UNFIT}"),
]
# One node per machine, so one place for the tests' (this one's and test_real_stack's, sharing the
# imported images): a run killed mid-way is undone by the next.
TEST_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "skyscan" / "test-real-node"
NODE_DIR = real_stack.real_dir(TEST_DIR) / "node"
NS = "default"


class Api(real_stack.Api):
    def create(self, path: str, body: dict[str, Any]) -> None:
        self.http.post(path, json=body).raise_for_status()

    def pod(self, name: str) -> dict[str, Any]:
        got = self.http.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        got.raise_for_status()
        return dict(got.json())

    def finished(self, names: list[str], timeout: float) -> dict[str, str]:
        """Each Pod's phase once all succeeded or failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            phases = {n: self.pod(n)["status"].get("phase", "") for n in names}
            if all(p in ("Succeeded", "Failed") for p in phases.values()):
                return phases
            time.sleep(0.3)
        raise TimeoutError(f"pods not finished in {timeout}s: {[self.pod(n)['status'] for n in names]}")

    def log(self, name: str) -> str:
        return self.http.get(f"/api/v1/namespaces/{NS}/pods/{name}/log").text


def python_pod(
    name: str, code: str, labels: dict[str, str] | None = None, never_ends: bool = False
) -> dict[str, Any]:
    """A Pod of the product image on the real node, as a cluster's restricted policy would have it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.NODE_NAME},
            "restartPolicy": "Always" if never_ends else "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/skyscan:dev",
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", code],
                    "securityContext": {
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"limits": {"memory": "128Mi", "cpu": "500m"}},
                }
            ],
        },
    }


def listener() -> tuple[socket.socket, int]:
    """A TCP server on every address of the host, accepting (and closing) connections."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.5)

    def serve() -> None:
        while server.fileno() != -1:
            try:
                server.accept()[0].close()
            except OSError:
                continue

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def default_routers() -> list[str]:
    """The IPv4 default gateways of this machine (/proc/net/route: little-endian hex)."""
    routers = []
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000" and fields[2] != "00000000":
            routers.append(socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little")))
    return routers


REACH = """
import socket, sys
def reach(host, port):  # three tries: a host client's address is allowed a moment after it starts
    for _ in range(3):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return "reached"
        except OSError as e:
            error = e
    return f"refused ({error.__class__.__name__})"
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    print(target, reach(host, int(port)))
"""

API_FROM_POD = """
import os, socket, ssl, urllib.request
print("kubernetes.default.svc is", socket.gethostbyname("kubernetes.default.svc"))
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
request = urllib.request.Request("https://kubernetes.default.svc/version",
                                 headers={"Authorization": "Bearer " + open(f"{sa}/token").read()})
trust = ssl.create_default_context(cafile=f"{sa}/ca.crt")
with urllib.request.urlopen(request, context=trust, timeout=10) as r:
    print("API server answers", r.status)
with urllib.request.urlopen("http://echo.default.svc.cluster.local:8080/", timeout=10) as r:
    print("echo Service answers", r.status)
print("uid", os.getuid())
"""


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Path]:
    node.stop(NODE_DIR)  # a test run killed mid-way: undo it first
    if reason := node.another_node():
        pytest.skip(f"REAL NODE NOT TESTED: {reason}")
    cluster_dir = tmp_path / "cluster"
    held_before = set(node.held_routes()) <= set(host.routes())  # by a `make up NODE=real` not reset
    node.prepare_control_plane(cluster_dir, NODE_DIR)  # the API server starts knowing the kubelet
    control_plane.start(cluster_dir, tie_to_parent=True)
    try:
        yield cluster_dir
    finally:
        node.stop(NODE_DIR)
        control_plane.stop(cluster_dir)
        if not held_before:  # no stale `.skyscan/env` names this node's addresses
            node.release_routes()


@pytest.mark.timeout(1500)  # a cold machine builds the kubelet, kube-proxy, CoreDNS and the images first
def test_real_node_runs_pods_and_leaves_the_host_as_it_found_it(own_cluster: Path) -> None:
    node.ensure_binaries(), node.ensure_images()  # cold builds outside the timings below
    before = host.snapshot()
    closed, closed_port = listener()
    allowed, allowed_port = listener()
    try:
        began = time.monotonic()
        # The allowed host port takes the Pods labelled reach=allowed only.
        node.start(NODE_DIR, own_cluster, host_ports=(allowed_port,), host_clients=f"{NS}/reach=allowed",
                   tie_to_parent=True)  # fmt: skip
        print(f"node up in {time.monotonic() - began:.1f}s")
        during = host.snapshot()
        assert node.BRIDGE in during["interfaces"] and during["iptables"] != before["iptables"]

        api = Api(own_cluster)
        serve = (
            "import http.server as h; h.HTTPServer(('', 8080), h.SimpleHTTPRequestHandler).serve_forever()"
        )
        echo = python_pod("echo", serve, labels={"app": "echo"}, never_ends=True)
        api.create(f"/api/v1/namespaces/{NS}/pods", echo)
        api.create(f"/api/v1/namespaces/{NS}/services", {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 8080}]},
        })  # fmt: skip
        created = time.monotonic()
        api.create(f"/api/v1/namespaces/{NS}/pods", python_pod("hello", "print('hello from a real node')"))
        phases = api.finished(["hello"], 60)
        print(f"a python3 -c Pod completed {time.monotonic() - created:.1f}s after it was created")
        assert phases == {"hello": "Succeeded"} and "hello from a real node" in api.log("hello")

        gateway = node.GATEWAY
        beyond = ["1.1.1.1:443", *(f"{router}:53" for router in default_routers())]
        probe = python_pod("reach", REACH, labels={"reach": "allowed"})
        host_side = [
            f"{gateway}:{allowed_port}",
            f"{gateway}:{closed_port}",
            f"{gateway}:{node.KUBELET_PORT}",
        ]
        probe["spec"]["containers"][0]["args"] = [*host_side, *beyond]
        api.create(f"/api/v1/namespaces/{NS}/pods", probe)
        api.create(f"/api/v1/namespaces/{NS}/pods", python_pod("api", API_FROM_POD))
        stranger = python_pod("stranger", REACH)  # not labelled: the allowed port is not its
        stranger["spec"]["containers"][0]["args"] = [f"{gateway}:{allowed_port}"]
        api.create(f"/api/v1/namespaces/{NS}/pods", stranger)
        phases = api.finished(["reach", "api", "stranger"], 90)
        reach, api_log = api.log("reach"), api.log("api")
        assert phases == {"reach": "Succeeded", "api": "Succeeded", "stranger": "Succeeded"}, (reach, api_log)
        assert f"{gateway}:{allowed_port} refused" in api.log("stranger")
        assert "kubernetes.default.svc is 10.0.0.1" in api_log
        assert "API server answers 200" in api_log and "echo Service answers 200" in api_log
        assert "uid 10001" in api_log  # the image's user
        assert f"{gateway}:{allowed_port} reached" in reach  # an allowed host port
        for target in (f"{gateway}:{closed_port}", f"{gateway}:{node.KUBELET_PORT}", *beyond):
            assert f"{target} refused" in reach, reach  # the rest of the host, and everything beyond it

        node.stop(NODE_DIR)
        # As it was, but the routes holding the node's ranges (until `make reset`: its data stays).
        before["routes"] = sorted({*before["routes"], *node.held_routes()})
        assert host.snapshot() == before
        node.start(NODE_DIR, own_cluster, tie_to_parent=True)  # again, the Pods of the first run recorded
        api.create(f"/api/v1/namespaces/{NS}/pods", python_pod("again", "print('and again')"))
        assert api.finished(["again"], 60) == {"again": "Succeeded"} and "and again" in api.log("again")
        node.stop(NODE_DIR)
        after = host.snapshot()
    finally:
        closed.close()
        allowed.close()
    for part in ("mounts", "interfaces", "routes", "iptables", "ipsets", "sysctls"):
        assert after[part] == before[part], part
    for name, kubelets in node.KUBELET_SYSCTLS.items():  # the kubelet set them; they are back as they were
        assert (during["sysctls"][name], after["sysctls"][name]) == (kubelets, before["sysctls"][name])
