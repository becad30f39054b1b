"""The real node's names, addresses and files, and what each of its processes is told: containerd's,
the CNI bridge's, the kubelet's, kube-proxy's, CoreDNS's and kube-router's configuration, the firewall
rules guarding the host, the routes it holds for the node's ranges. Pure: nothing here runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyscan_local.control_plane_components import SERVICE_RANGE

NODE_NAME = "skyscan-node"


BRIDGE = "skyscan0"


POD_CIDR = "10.99.0.0/24"


GATEWAY = "10.99.0.1"  # the bridge's address: the node's InternalIP, cluster DNS, the kubelet


KUBERNETES_SERVICE = ("10.0.0.1", 443)  # the first address of the control plane's service range


# The ranges the host reaches through the bridge. Each is held by an `unreachable` route of a metric
# above the live ones' (0: the bridge's own and the Service range's), from the first start until
# `release_routes`: node up or down, no packet for them leaves by the default route.
HELD_RANGES = (SERVICE_RANGE, POD_CIDR)


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


def kube_router_argv(bin_dir: Path, kubeconfig: str) -> list[str]:
    return [
        str(bin_dir / "kube-router"),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",  # kube-proxy's
        "--enable-cni=false",  # the bridge plugin's
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--metrics-port=0",
        f"--health-port={KUBE_ROUTER_HEALTH_PORT}",
    ]
