"""The host's network as the real node changes it: the bridge, the firewall chains, and the routes
held for the node's ranges from its first start until `release_routes`."""

from __future__ import annotations

import shutil

from skyscan_local import host
from skyscan_local.control_plane_components import SERVICE_RANGE
from skyscan_local.node_config import BRIDGE, CLIENTS_CHAIN, GATEWAY, firewall_rules, held_routes


def add_bridge() -> None:
    """The bridge, with its address: the kubelet's node IP, CoreDNS's and the kubelet's listeners. The
    host reaches Services as the node does, from the bridge's address (else from its own uplink's,
    which no NetworkPolicy admitting the node names); the route goes with the bridge."""
    host.run("ip", "link", "add", BRIDGE, "type", "bridge")
    host.run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    host.run("ip", "link", "set", BRIDGE, "up")
    host.run("ip", "route", "add", SERVICE_RANGE, "dev", BRIDGE, "src", GATEWAY)
    host.write_sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")  # the DNAT to the API server


def add_chains(api_port: int, host_ports: tuple[int, ...]) -> None:
    """Our chains, each jumped to first from its built-in chain (`firewall_rules`)."""
    host.run("iptables", "-w", "5", "-t", "mangle", "-N", CLIENTS_CHAIN)  # empty until the watcher fills it
    for where, rules in firewall_rules(api_port, host_ports).items():
        table, builtin = where.split("/")
        chain = f"SKYSCAN-NODE-{builtin}"
        host.run("iptables", "-w", "5", "-t", table, "-N", chain)
        for rule in rules:
            host.run("iptables", "-w", "5", "-t", table, "-A", chain, *rule)
        host.run("iptables", "-w", "5", "-t", table, "-I", builtin, "1", "-j", chain)


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


def delete_link(name: str) -> None:
    if name in host.interfaces():
        host.run("ip", "link", "delete", name)
