"""`make up NODE=real` / `make down`: Skyscan installed by its own Helm chart onto a real node.

    python -m skyscan_local.real_stack up|down

`up` (safe to repeat): the Debian packages, binaries and images (each built once, cached) -> the local
control plane (.skyscan/cluster) -> the real node (skyscan_local.node, .skyscan/node), kwok's fake node
cordoned -> namespace `skyscan`, the static tokens and the presign key as Secrets -> the WMS simulator
in the cluster (a Deployment of the scanner image and its Service, as a real deployment reaches EWMS by
address) -> `helm upgrade --install skyscan charts/skyscan` (the operator, 2 replicas and a Lease; the
shim, 2 replicas behind its Service at a fixed ClusterIP its certificate names) -> `.skyscan/env`.

Nothing of Skyscan runs on the host: the host reaches the shim's Service at its ClusterIP (the host
is on the node's bridge; kube-proxy routes it), trusting the chart's CA through a bundle of the
system's CAs and that one (`SSL_CERT_FILE` in `.skyscan/env`). No PostgreSQL archive yet: finished
scans stay as Scan resources (the chart's archive Secret is optional).

Its control plane and node live in `.skyscan/real/` (never the kwok stack's `.skyscan/cluster`). `down`
stops the node (undoing what it changed on the host, but the `unreachable` routes it holds for the
Service and Pod ranges: a stale `.skyscan/env` is refused at once, never sent off the machine) and the
control plane; their data stays (etcd: the release, Secrets and Scans; containerd: the imported images),
so the next `up` is warm; `reset` deletes it and releases the routes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from skyscan_local import control_plane, node, postgres, processes
from skyscan_local import stack as localstack
from skyscan_local.admin_api import Api as Api  # the tests reach the cluster through it here
from skyscan_local.admin_api import resource_path
from skyscan_local.stack_provision import ensure_presign_key, ensure_tokens
from skyscan_local.stack_settings import ENV_FILE, TOKEN_FILE

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "skyscan"
NAMESPACE = RELEASE = "skyscan"
SHIM_IP = "10.0.0.80"  # in the control plane's service range (10.0.0.0/24), named by the certificate
WMS = "skyscan-wms"
WMS_ADDRESS = f"http://{WMS}.{NAMESPACE}.svc:8081"
WMS_CREDENTIALS = "skyscan-wms-credentials"  # the operator's client of the simulator, as the chart reads it
WMS_CLIENT_ID = "skyscan"
# The Pods that reach the host's PostgreSQL (the node's firewall): the operator's and the shim's.
ARCHIVE_CLIENTS = f"{NAMESPACE}/app.kubernetes.io/name=skyscan,app.kubernetes.io/component in (operator,shim)"
ARCHIVE_SECRET = "skyscan-archive"  # SKYSCAN_ARCHIVE_DSN, as the chart reads it
TAGS = ["4.0.0", "4.1.2", "4.2.0", "dev-branch-abc1234"]  # the scanner image is tagged with each
ENV_KEYS = (*localstack.ENV_KEYS, "SSL_CERT_FILE")


def real_dir(d: Path) -> Path:
    """Its own control plane and node, apart from the kwok stack's (.skyscan/cluster): the two never
    share a cluster's data. The tokens, presign key and `.skyscan/env` are the stack directory's."""
    return d / "real"


class RealStackError(RuntimeError):
    pass


def chart_values(shim_ip: str = SHIM_IP) -> dict[str, Any]:
    """The chart's values for the local real node: the local images, the in-cluster WMS simulator,
    short timers (as the kwok stack's); 2 operators and 2 shims as in any deployment."""
    operator = {
        k: v
        for k, v in localstack.LOCAL_DEFAULTS["operator"].items()
        if k
        # The chart's (the Pod's name, the default 8 s Lease: a standby takes over within 15 s) / a
        # real node's ephemeral storage.
        not in (
            "SKYSCAN_LEASE_IDENTITY",
            "SKYSCAN_LEASE_DURATION_SECONDS",
            "SKYSCAN_SCANNER_EPHEMERAL_STORAGE",
        )
    }
    # Host-process settings stay on the host: the Pods listen on every address and drain on SIGTERM.
    host_only = ("SKYSCAN_HOST", "SKYSCAN_SHUTDOWN_DELAY_SECONDS")
    shim = {k: v for k, v in localstack.LOCAL_DEFAULTS["shim"].items() if k not in host_only}
    return {
        "image": {"repository": "localhost/skyscan", "tag": "dev", "pullPolicy": "Never"},
        "operator": {"replicas": 2},
        "shim": {
            "replicas": 2,
            "tls": {"enabled": True, "ipAddresses": [shim_ip]},
            "service": {"clusterIP": shim_ip},
        },
        "settings": {
            # JSON maps and lists as values (the chart's defaults are such; a string over one warns).
            **{k: json.loads(v) if v[:1] in "{[" else v for k, v in {**operator, **shim}.items()},
            "SKYSCAN_TAGS": TAGS,
            "SKYSCAN_SCANNER_IMAGE": "localhost/skyscan-scanner",
            "SKYSCAN_IMAGE_PULL_GRACE_SECONDS": "20",  # no registry here: a missing image never comes
        },
        # The simulator is its own OIDC issuer, and refuses a request without its token, as EWMS does.
        "wms": {"address": WMS_ADDRESS, "oidcIssuer": WMS_ADDRESS, "credentialsSecret": WMS_CREDENTIALS},
        "archive": {"dsnSecret": ARCHIVE_SECRET},
        "presignKey": {"secretName": "skyscan-presign-key"},
        # Scanners reach the in-cluster WMS simulator's Pods, and DNS at the node's CoreDNS only.
        "networkPolicy": {
            "enabled": True,
            "wms": {
                "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": WMS}}}],
                "ports": [{"port": 8081, "protocol": "TCP"}],
            },
            "dns": {"to": [{"ipBlock": {"cidr": f"{node.GATEWAY}/32"}}]},
            # The operator's metrics: from the host (the node: always allowed) and a Prometheus in
            # namespace `monitoring`, were there one; no other Pod.
            "operator": {
                "metricsFrom": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                ]
            },
        },
        "tokens": {"secretName": "skyscan-shim-tokens"},
    }


def wms_simulator(image: str = "localhost/skyscan-scanner:dev") -> list[dict[str, Any]]:
    """The WMS simulator as a Deployment, its Service and its NetworkPolicy: it requires the token its
    OIDC stub grants the operator's client (Secret WMS_CREDENTIALS), is reached by the operator and the
    scanners only, and reaches the shim only (its workers fetch startup.json through their presigned
    URLs, trusting the chart's CA only) and DNS."""
    labels = {"app.kubernetes.io/name": WMS}
    env = {
        **localstack.LOCAL_DEFAULTS["wms-simulator"],
        "SSL_CERT_FILE": "/etc/skyscan/rest-ca/ca.crt",
        "SKYSCAN_WMS_SIM_REQUIRE_AUTH": "true",
        "SKYSCAN_WMS_SIM_CLIENT_ID": WMS_CLIENT_ID,
    }
    client_secret = {"name": WMS_CREDENTIALS, "key": "SKYSCAN_WMS_CLIENT_SECRET"}
    secret_env = {"name": "SKYSCAN_WMS_SIM_CLIENT_SECRET", "valueFrom": {"secretKeyRef": client_secret}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": WMS, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [
                        {
                            "name": "wms",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["python", "-m", "skyscan_local.wms_simulator"],
                            "args": ["--host", "0.0.0.0", "--port", "8081"],
                            "env": [*({"name": k, "value": v} for k, v in env.items()), secret_env],
                            "ports": [{"name": "http", "containerPort": 8081}],
                            "readinessProbe": {
                                "httpGet": {"path": "/.well-known/openid-configuration", "port": "http"},
                                "periodSeconds": 2,
                            },
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "128Mi"},
                                "limits": {"memory": "512Mi"},
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [{"name": "rest-ca", "mountPath": "/etc/skyscan/rest-ca"}],
                        }
                    ],
                    "volumes": [
                        {"name": "rest-ca", "configMap": {"name": f"{RELEASE}-shim-ca", "optional": True}}
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": WMS, "namespace": NAMESPACE, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 8081, "targetPort": "http"}]},
    }

    def skyscan(component: str) -> dict[str, Any]:
        return {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "skyscan",
                                                "app.kubernetes.io/component": component}}}  # fmt: skip

    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": WMS, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [skyscan("operator"), skyscan("scanner")],
                    "ports": [{"port": 8081, "protocol": "TCP"}],
                }
            ],
            "egress": [
                {
                    "to": [skyscan("shim")],
                    "ports": [{"port": 8080, "protocol": "TCP"}],
                },
                {
                    "to": [{"ipBlock": {"cidr": f"{node.GATEWAY}/32"}}],
                    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                },
            ],
        },
    }
    return [deployment, service, policy]


def unready(api: Api) -> str:
    """Why the namespace's Pods are not running, as `kubectl describe` would show it: each unready
    Pod's phase and reasons, and the node's pressure conditions (a full disk evicts everything)."""
    lines = []
    for pod in (api.get(f"/api/v1/namespaces/{NAMESPACE}/pods") or {}).get("items", []):
        status = pod.get("status") or {}
        if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
            continue
        waiting = [
            (cs.get("state") or {}).get("waiting") or {} for cs in status.get("containerStatuses") or []
        ]
        why = [status.get("reason"), status.get("message"), *(w.get("reason") for w in waiting)]
        lines.append(f"  pod {pod['metadata']['name']}: {status.get('phase')} {' '.join(filter(None, why))}")
    for c in ((api.get(f"/api/v1/nodes/{node.NODE_NAME}") or {}).get("status") or {}).get("conditions") or []:
        if c["type"] != "Ready" and c["status"] == "True":
            lines.append(f"  node {node.NODE_NAME}: {c['type']}: {c.get('message', '')}")
    return "\n".join(lines) or "  (every Pod ready)"


def secret(name: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def adoptable_namespace() -> dict[str, Any]:
    """The namespace with Helm's ownership marks, so `helm install` adopts it rather than refuse it."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": RELEASE,
                "meta.helm.sh/release-namespace": NAMESPACE,
            },
        },
    }


def wms_secret(d: Path) -> bytes:
    """The operator's client secret at the WMS simulator, made once (mode 0600 in the real stack's dir)."""
    real_dir(d).mkdir(parents=True, exist_ok=True)
    return processes.kept_secret(real_dir(d) / "wms-client-secret").encode()


# --- up and down -----------------------------------------------------------------------------------


def _tag_scanner_images(node_dir: Path) -> None:
    """The operator's Jobs run `<scanner image>:<the scan's tag>`: every known tag names the local build."""
    p = node.Paths(node_dir)
    for tag in TAGS:
        argv = ["ctr", "--address", str(p.containerd_socket), "--namespace", "k8s.io", "images", "tag",
                "--force", "localhost/skyscan-scanner:dev", f"localhost/skyscan-scanner:{tag}"]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _archive(d: Path, tie_to_parent: bool) -> postgres.Server:
    """The archive's PostgreSQL, on the host as a real deployment keeps its database outside the
    cluster; its data stays across `down` and `up` (in `.skyscan/real/postgres`)."""
    try:
        server = postgres.ensure(
            real_dir(d) / "postgres", clients=(node.POD_CIDR,), tie_to_parent=tie_to_parent
        )
        asyncio.run(postgres.ensure_app_login(server))
    except postgres.PostgresError as e:
        raise RealStackError(str(e)) from e
    return server  # its archive's login: server.app_dsn()


def archive_dsn(host_dsn: str) -> str:
    """The DSN the Pods use: the server's loopback address as they reach it, the node's bridge."""
    return host_dsn.replace("@127.0.0.1:", f"@{node.GATEWAY}:", 1)


def _helm(bin_dir: Path, kubeconfig: str, *args: str) -> str:
    argv = [str(bin_dir / "helm"), "--kubeconfig", kubeconfig, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RealStackError(f"helm {' '.join(args[:2])}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def _ca_bundle(d: Path, shim_ca: bytes) -> Path:
    """The system's CAs and the shim's, for the host's clients (.skyscan/env's SSL_CERT_FILE)."""
    system = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    bundle = real_dir(d) / "ca-bundle.crt"
    bundle.write_bytes((system.read_bytes() if system.exists() else b"") + b"\n" + shim_ca)
    return bundle


def up(
    d: Path = REPO / ".skyscan", *, node_dir: Path | None = None, tie_to_parent: bool = False
) -> dict[str, str]:
    """Bring the stack up (what runs already is left alone); returns what `.skyscan/env` exports.
    `tie_to_parent` (tests): the control plane and the node die with the calling thread."""
    began = time.monotonic()
    subprocess.run(["bash", str(REPO / "tools" / "node" / "packages.sh")], check=True)
    if reason := node.unfit_reason():
        raise RealStackError(f"this machine cannot run a real node: {reason}")
    kwok_stack = localstack.LocalStackSettings(SKYSCAN_LOCAL_DIR=d)  # type: ignore[call-arg]
    if running := [name for name, alive in localstack.status(kwok_stack).items() if alive]:
        raise RealStackError(f"the kwok stack runs ({', '.join(running)}): `make down` first")
    bin_dir, images = node.ensure_binaries(), node.ensure_images()
    built = time.monotonic()
    cluster_dir, node_dir = real_dir(d) / "cluster", node_dir or real_dir(d) / "node"
    archive = _archive(d, tie_to_parent)
    node.prepare_control_plane(cluster_dir, node_dir)
    cluster = control_plane.ensure(cluster_dir, tie_to_parent=tie_to_parent)
    node.ensure(
        node_dir, cluster_dir, images_dir=images, host_ports=(archive.port,), host_clients=ARCHIVE_CLIENTS,
        tie_to_parent=tie_to_parent,
    )  # fmt: skip
    _tag_scanner_images(node_dir)
    api = Api(cluster_dir)
    api.http.patch(
        f"/api/v1/nodes/{control_plane.NODE_NAME}",
        content=json.dumps({"spec": {"unschedulable": True}}),
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()  # Skyscan's Pods and its scanners' run on the real node
    # Made for the Secrets before the release, marked as the release's for Helm to adopt: the chart
    # labels it with its Pod Security level.
    api.apply(resource_path(ns := adoptable_namespace()), ns)
    state = localstack.load_state(d)
    settings = localstack.LocalStackSettings(SKYSCAN_LOCAL_DIR=d)  # type: ignore[call-arg]
    state["tokens"] = ensure_tokens(settings, state)
    localstack.save_state(d, state)  # the next `up` keeps them: running shims and sourced envs hold them
    key = ensure_presign_key(settings)
    api.apply(
        resource_path(s := secret("skyscan-shim-tokens", {"tokens.json": (d / TOKEN_FILE).read_bytes()})),
        s,
    )
    api.apply(resource_path(s := secret("skyscan-presign-key", {"key": key.read_bytes().strip()})), s)
    wms_client = {"SKYSCAN_WMS_CLIENT_ID": WMS_CLIENT_ID.encode(), "SKYSCAN_WMS_CLIENT_SECRET": wms_secret(d)}
    api.apply(resource_path(s := secret(WMS_CREDENTIALS, wms_client)), s)
    dsn = archive_dsn(archive.app_dsn())
    api.apply(resource_path(s := secret(ARCHIVE_SECRET, {"SKYSCAN_ARCHIVE_DSN": dsn.encode()})), s)
    values = real_dir(d) / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values()))
    try:
        _helm(bin_dir, cluster.kubeconfig, "upgrade", "--install", RELEASE, str(CHART),
              "--namespace", NAMESPACE, "--values", str(values), "--wait", "--timeout", "5m")  # fmt: skip
        for obj in wms_simulator():  # after the release: it mounts the shim's CA the chart makes
            api.apply(resource_path(obj), obj)
        processes.wait_until(
            lambda: bool(
                (api.get(resource_path(wms_simulator()[0])) or {}).get("status", {}).get("availableReplicas")
            ),
            "the WMS simulator",
            120,
            error=RealStackError,
        )
    except RealStackError as e:
        raise RealStackError(f"{e}\n{unready(api)}") from e
    tls = api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{RELEASE}-shim-tls")
    assert tls is not None
    bundle = _ca_bundle(d, base64.b64decode(tls["data"]["ca.crt"]))
    wms = api.get(f"/api/v1/namespaces/{NAMESPACE}/services/{WMS}")
    assert wms is not None
    env = {
        "SKYSCAN_URL": f"https://{SHIM_IP}:8080",
        "SKYSCAN_USER_TOKEN": state["tokens"]["user"],
        "SKYSCAN_SYSTEM_TOKEN": state["tokens"]["system"],
        "SKYSCAN_REFERENCE_TOKEN": state["tokens"]["reference"],
        "SKYSCAN_VIEWER_TOKEN": state["tokens"]["viewer"],
        "SKYSCAN_WMS_URL": f"http://{wms['spec']['clusterIP']}:8081",
        "KUBECONFIG": cluster.kubeconfig,
        "SKYSCAN_NAMESPACE": NAMESPACE,
        "SKYSCAN_ARCHIVE_DSN": archive.app_dsn(),  # from the host
        "SKYSCAN_OPERATOR_METRICS_URL": "",
        "SSL_CERT_FILE": str(bundle),
    }
    trust = ssl.create_default_context(cafile=str(bundle))
    processes.wait_until(
        lambda: httpx.get(f"{env['SKYSCAN_URL']}/healthz", verify=trust, timeout=2).status_code == 200,
        "the shim's Service from the host",
        60,
        error=RealStackError,
    )
    # Its policy admits the node a moment after its Pod is ready (kube-router programs it then).
    discovery = f"{env['SKYSCAN_WMS_URL']}/.well-known/openid-configuration"
    processes.wait_until(
        lambda: httpx.get(discovery, timeout=2).status_code == 200,
        "the WMS simulator's Service from the host",
        60,
        error=RealStackError,
    )
    (d / ENV_FILE).write_text("".join(f"export {k}={shlex.quote(env[k])}\n" for k in ENV_KEYS))
    (d / ENV_FILE).chmod(0o600)
    print(f"real node stack up in {time.monotonic() - began:.1f}s ({time.monotonic() - built:.1f}s after the "
          "builds)", file=sys.stderr)  # fmt: skip
    return env


def down(d: Path = REPO / ".skyscan", *, node_dir: Path | None = None) -> list[str]:
    """Stop the node (undoing what it changed on the host), then the control plane and PostgreSQL;
    data stays. `node_dir`: as given to `up`."""
    stopped, node_dir = [], node_dir or real_dir(d) / "node"
    if node.load(node_dir):
        node.stop(node_dir)
        stopped.append("node")
    cluster_dir = real_dir(d) / "cluster"
    if (cluster := control_plane.load(cluster_dir)) and any(p.alive() for p in cluster.processes):
        control_plane.stop(cluster_dir)
        stopped.append("control plane")
    if postgres.stop(real_dir(d) / "postgres"):
        stopped.append("postgres")
    return stopped


def reset(d: Path = REPO / ".skyscan") -> list[str]:
    """Delete a stopped real-node stack's data: its cluster (the release, every Scan) and its node's
    directory (imported images, logs), and release the routes the node held for its ranges (a stale
    `.skyscan/env` pointed there); refused while it runs. Returns what it deleted."""
    real = real_dir(d)
    archive = postgres.load(real / "postgres")
    if node.load(real / "node") or (archive and archive.running()):
        raise RealStackError("the real node stack still runs; run `make down` first")
    control_plane.remove(real / "cluster")  # refuses while it runs
    deleted = [str(real)] if real.exists() else []
    shutil.rmtree(real, ignore_errors=True)
    return deleted + [f"the route {route}" for route in node.release_routes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyscan-real-stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "reset"])
    args = parser.parse_args(argv)
    d = Path(os.environ.get("SKYSCAN_LOCAL_DIR", REPO / ".skyscan"))
    try:
        if args.command == "down":
            stopped = down(d)
            print(f"stopped: {', '.join(stopped)}" if stopped else "no real node stack running")
            return 0
        if args.command == "reset":
            deleted = reset(d)
            print(f"deleted {', '.join(deleted)}" if deleted else "no real node stack recorded")
            return 0
        env = up(d)
    except (RealStackError, node.NodeError, control_plane.ClusterError) as e:
        print(f"real node stack: {args.command} failed: {e}", file=sys.stderr)
        return 1
    print(f"""
Skyscan is up on a real node (helm release {RELEASE} in namespace {NAMESPACE}).
  REST API        {env["SKYSCAN_URL"]}   (the shim's Service, HTTPS with the chart's CA)
  WMS simulator   {env["SKYSCAN_WMS_URL"]}

  source {d / ENV_FILE}
  kubectl get nodes -o wide; kubectl get pods -A -o wide; helm list -A
  skyscan launch ... --follow
  make down""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
