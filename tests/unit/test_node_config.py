"""The real node's configuration files: what this machine needs of them (reference: real-node.md)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from skyscan_local import host, host_clients, node, real_stack

P = node.Paths(Path("/tmp/n"))


def test_containerd_restricts_oom_score_adj_uses_cgroupfs_and_the_local_pause_image() -> None:
    config = tomllib.loads(node.containerd_config(P))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE
    assert cri["sandbox_image"] == node.PAUSE_IMAGE
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert (config["root"], config["grpc"]["address"]) == ("/tmp/n/containerd/root", str(P.containerd_socket))


def test_kubelet_serves_on_the_bridge_to_client_certificates_only_and_never_collects_images() -> None:
    config = node.kubelet_config(P)
    assert config["address"] == node.GATEWAY and config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["imageGCHighThresholdPercent"] == 100
    # Pods are evicted only when the disk is really full, not below the defaults' 10-15 % free.
    assert config["evictionHard"]["nodefs.available"] == config["evictionHard"]["imagefs.available"] == "1Gi"


def test_kube_proxy_leaves_the_hosts_sysctls_and_other_addresses_alone() -> None:
    config = node.kube_proxy_config("/k")
    assert config["conntrack"]["maxPerCore"] == 0 and config["iptables"]["localhostNodePorts"] is False
    assert config["nodePortAddresses"] == [f"{node.GATEWAY}/32"]


def test_pods_reach_no_host_port_but_dns_the_api_server_and_the_allowed_ones() -> None:
    rules = node.firewall_rules(api_port=6443, host_ports=(5432,))
    # Guarded in the mangle table: a NetworkPolicy enforcer's ACCEPTs in the filter table come later.
    assert rules["mangle/FORWARD"][-2:] == [
        ["-i", node.BRIDGE, "-j", "DROP"],
        ["-o", node.BRIDGE, "-j", "DROP"],
    ]
    inbound = rules["mangle/PREROUTING"]
    assert inbound[-1] == ["-i", node.BRIDGE, "-j", "DROP"]
    assert inbound[0] == ["-i", node.BRIDGE, "-m", "addrtype", "!", "--dst-type", "LOCAL", "-j", "RETURN"]
    assert [
        "-i",
        node.BRIDGE,
        "-d",
        f"{node.GATEWAY}/32",
        "-p",
        "tcp",
        "--dport",
        "5432",
        "-j",
        node.CLIENTS_CHAIN,
    ] in inbound  # which accepts the allowed Pods' addresses only
    assert not any("5432" in rule and node.CLIENTS_CHAIN not in rule for rule in inbound)
    api, allowed = rules["nat/PREROUTING"]
    assert api[-1] == "127.0.0.1:6443"
    assert allowed[allowed.index("-d") + 1] == f"{node.GATEWAY}/32" and allowed[-1] == "127.0.0.1:5432"


def test_an_iptables_table_that_holds_nothing_is_as_if_absent() -> None:
    """The first use of iptables on a machine loads tables that stay empty: the host is as it was."""
    empty = ["*mangle", ":PREROUTING ACCEPT", ":INPUT ACCEPT", ":OUTPUT ACCEPT", "COMMIT"]
    used = ["*filter", ":INPUT ACCEPT", ":FORWARD DROP", "COMMIT"]
    chained = ["*nat", ":PREROUTING ACCEPT", ":KUBE-SERVICES - ", "COMMIT"]
    ruled = ["*raw", ":OUTPUT ACCEPT", "-A OUTPUT -j ACCEPT", "COMMIT"]
    assert host.in_use(empty) == []
    assert host.in_use([*empty, *used, *chained, *ruled]) == [*used, *chained, *ruled]


def test_the_held_routes_cover_every_address_the_host_reaches_through_the_bridge() -> None:
    """`unreachable` for the Service and Pod ranges, behind the live routes (metric 0), written as
    `ip -4 route show` prints them (release_routes and the tests compare them so)."""
    held = {ipaddress.ip_network(route.split()[1]): route for route in node.held_routes()}
    assert all(route == f"unreachable {net} metric {node.HELD_METRIC}" for net, route in held.items())
    assert node.HELD_METRIC > 0
    for address in (real_stack.SHIM_IP, node.KUBERNETES_SERVICE[0], node.GATEWAY, "10.99.0.200"):
        assert any(ipaddress.ip_address(address) in net for net in held), address


# In network and mount namespaces of its own (sysfs mounted anew: host.interfaces reads it): a default
# route out of it, then the node's routes as `start` and `stop` make them (held, the bridge and the
# Service range's route; the bridge deleted), then released.
HELD_IN_A_NAMESPACE = """
import subprocess
from skyscan_local import host, node
def run(*argv):
    subprocess.run(argv, check=True)
run("mount", "-t", "sysfs", "sysfs", "/sys")
def get(address):
    done = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True)
    return (done.stdout + done.stderr).split("\\n")[0]
run("ip", "link", "add", "uplink", "type", "veth", "peer", "name", "far")
run("ip", "link", "set", "far", "up")
run("ip", "addr", "add", "192.0.2.2/24", "dev", "uplink")
run("ip", "link", "set", "uplink", "up")
run("ip", "route", "add", "default", "via", "192.0.2.1")
print("before", get("10.0.0.80"))
node.hold_routes()
node.hold_routes()
run("ip", "link", "add", node.BRIDGE, "type", "bridge")
run("ip", "addr", "add", f"{node.GATEWAY}/24", "dev", node.BRIDGE)
run("ip", "link", "set", node.BRIDGE, "up")
run("ip", "route", "add", "10.0.0.0/24", "dev", node.BRIDGE, "src", node.GATEWAY)
print("running", get("10.0.0.80"), "|", get("10.99.0.5"), "|", node.release_routes())
run("ip", "link", "delete", node.BRIDGE)
uplink = ["default via 192.0.2.1 dev uplink", "192.0.2.0/24 dev uplink proto kernel scope link src 192.0.2.2"]
only_held = host.routes() == sorted([*node.held_routes(), *uplink])
print("down", get("10.0.0.80"), "|", get("10.99.0.5"), "|", only_held)
print("released", node.release_routes(), get("10.0.0.80"))
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None
    or shutil.which("ip") is None
    or subprocess.run(["unshare", "-rnm", "true"], capture_output=True).returncode != 0,
    reason="no network namespace of our own here (unshare -rnm)",
)
def test_the_held_routes_send_nothing_off_the_machine_while_the_node_runs_or_after_it_stopped() -> None:
    done = subprocess.run(
        ["unshare", "-rnm", sys.executable, "-c", HELD_IN_A_NAMESPACE],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert "via 192.0.2.1" in lines["before"]  # the default route, off the machine
    shim, pod, released = lines["running"].split(" | ")
    assert f"dev {node.BRIDGE} src {node.GATEWAY}" in shim and f"dev {node.BRIDGE}" in pod
    assert released == "[]"  # not while a node runs
    shim, pod, only_held = lines["down"].split(" | ")
    assert "No route to host" in shim and "No route to host" in pod and only_held == "True"
    released, _, after = lines["released"].partition("] ")
    assert released == str(node.held_routes())[:-1] and "via 192.0.2.1" in after  # as before


@pytest.mark.skipif(shutil.which("ctr") is None, reason="no ctr (the node's packages are not installed)")
def test_a_containerd_not_yet_listening_is_waited_for_not_failed(tmp_path: Path) -> None:
    """Its socket absent (containerd still starting) is a "not yet" for the start's wait, not an error."""
    assert node._containerd_answers(node.Paths(tmp_path)) is False


def test_the_host_clients_chain_is_replaced_whole_in_one_transaction() -> None:
    """The watcher's `iptables-restore --noflush` input: the chain flushed and refilled in one commit,
    so no moment holds a Pod that left or lacks one that stays."""
    script = host_clients.restore_script("SKYSCAN-NODE-CLIENTS", ["10.99.0.9", "10.99.0.7", "10.99.0.9"])
    assert script.splitlines() == [
        "*mangle",
        "-F SKYSCAN-NODE-CLIENTS",
        "-A SKYSCAN-NODE-CLIENTS -s 10.99.0.7/32 -j ACCEPT",
        "-A SKYSCAN-NODE-CLIENTS -s 10.99.0.9/32 -j ACCEPT",
        "COMMIT",
    ]


@pytest.mark.parametrize(
    ("status", "deleting", "member"),
    [
        ({"phase": "Running", "podIP": "10.99.0.5"}, False, "10.99.0.5"),
        ({"phase": "Pending"}, False, None),  # no address yet
        ({"phase": "Running", "podIP": "10.99.0.5"}, True, None),  # being deleted
        ({"phase": "Succeeded", "podIP": "10.99.0.5"}, False, None),  # its address may be reused
        ({"phase": "Failed", "podIP": "10.99.0.5"}, False, None),
    ],
)
def test_a_pod_is_a_host_client_while_it_holds_its_address(
    status: dict[str, str], deleting: bool, member: str | None
) -> None:
    meta = {"name": "p", **({"deletionTimestamp": "2026-11-28T00:00:00Z"} if deleting else {})}
    assert host_clients.address({"metadata": meta, "status": status}) == member
