"""The real node's configuration files: what this machine needs of them (reference: real-node.md)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from skyscan_local import host, host_clients, node

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
