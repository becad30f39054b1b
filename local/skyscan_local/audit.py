"""`make audit-node`: an attacker's probes against the running real-node stack (`make up NODE=real`),
each of which must be refused.

    python -m skyscan_local.audit

From a Pod in another namespace and from a scanner-labelled Pod in Skyscan's: the archive's PostgreSQL
on the host, the operator's ports, the WMS simulator, a DNS-port listener elsewhere. With each
component's own token (TokenRequests for their accounts): patching Secrets that are not the
component's, Jobs that would be a step to root or read another's Secret, the settings and the CA.
With the archive's DSN: running a program, reading a file, making a role. As the admin: Pods the
namespace's Pod Security level forbids, and Scans whose spec REST refuses. Prints what was tried and
how it was refused; exits 1 when anything was allowed.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from skyscan import subscription
from skyscan_local import host_clients, node
from skyscan_local.admin_api import Api
from skyscan_local.audit_probes import Probe, poll, refused_status, sql_refused
from skyscan_local.real_stack import ARCHIVE_SECRET, NAMESPACE, RELEASE, REPO, WMS, real_dir

OTHER_NAMESPACE = "skyscan-audit"
SCANNER_LABELS = {"app.kubernetes.io/name": "skyscan", "app.kubernetes.io/component": "scanner"}
IMAGE = "localhost/skyscan:dev"
CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "reached")
    except OSError as e:
        print(target, "refused", type(e).__name__)
"""
HTTP_GET = """
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError as e:
    print("unreachable", type(e).__name__)
"""
# Listens on TCP port 53 (the Pod may bind it: its unprivileged ports start at 0), then waits.
LISTENER = """
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 53))
s.listen()
while True:
    s.accept()[0].close()
"""


def probe_pod(name: str, namespace: str, labels: dict[str, str], command: list[str]) -> dict[str, Any]:
    """A Pod of the scanner image running `command`, as the restricted Pod Security level asks."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
            },
            "containers": [
                {
                    "name": "probe",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


PLAIN = {"name": "c", "image": IMAGE, "command": ["id"]}


def hostile_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A Pod that asks for more than the restricted level allows (`spec` on top of a plain one)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"containers": [PLAIN], **spec},
    }


def hostile_job(
    name: str, labels: dict[str, str], pod: dict[str, Any], namespace: str = NAMESPACE
) -> dict[str, Any]:
    template = {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never", **pod}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"backoffLimit": 0, "template": template},
    }


ROOT_ON_THE_NODE = {
    "hostPID": True,
    "hostNetwork": True,
    "containers": [
        {
            "name": "c",
            "image": IMAGE,
            "command": ["ls", "/host/etc"],
            "securityContext": {"privileged": True, "runAsUser": 0},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}, {"name": "t", "mountPath": "/t"}],
        }
    ],
    "volumes": [
        {"name": "host", "hostPath": {"path": "/"}},
        {"name": "t", "secret": {"secretName": f"{RELEASE}-shim-tokens"}},
    ],
}


class Audit:
    def __init__(self, d: Path) -> None:
        self.d = d
        self.cluster_dir = real_dir(d) / "cluster"
        self.api = Api(self.cluster_dir)
        self.kubeconfig = str(self.cluster_dir / "kubeconfig")
        self.probes: list[Probe] = []

    def record(self, what: str, probe: Probe) -> None:
        done = Probe(what, probe.refused, probe.how)
        self.probes.append(done)
        print(done.line(), flush=True)

    # --- as a component ----------------------------------------------------------------------------

    def token(self, account: str) -> str:
        got = self.api.http.post(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600},
            },
        )
        got.raise_for_status()
        return str(got.json()["status"]["token"])

    def as_account(self, account: str) -> httpx.Client:
        return host_clients.client(Path(self.kubeconfig), self.token(account))

    def component_writes(self) -> None:
        ns = f"/api/v1/namespaces/{NAMESPACE}"
        merge = {"Content-Type": "application/merge-patch+json"}
        dry = {"dryRun": "All"}
        fixed = [
            s["metadata"]["name"]
            for s in (self.api.get(f"{ns}/secrets") or {}).get("items", [])
            if "skyscan.io/scan-id" not in (s["metadata"].get("labels") or {})
        ]
        with self.as_account(f"{RELEASE}-operator") as operator:
            for name in (n for n in fixed if n != subscription.SECRET_NAME):  # that one is the operator's own
                got = operator.patch(f"{ns}/secrets/{name}", content="{}", headers=merge)
                self.record(
                    f"operator's token: PATCH {{}} Secret {name} (reads it back)", refused_status(got)
                )
            got = operator.post(
                f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                json=hostile_job("audit-root", {"app": "audit"}, ROOT_ON_THE_NODE),
                params=dry,
            )
            self.record(
                "operator's token: a privileged host-namespaces Job mounting / and the shim's tokens",
                refused_status(got),
            )
            scan = "0000000000x00000000000000000000"
            labels = {**SCANNER_LABELS, "skyscan.io/scan-id": scan}
            disguised = hostile_job(
                f"skyscan-{scan}",
                labels,
                {
                    "serviceAccountName": f"{RELEASE}-shim",
                    "containers": [
                        {
                            "name": "c",
                            "image": IMAGE,
                            "command": ["cat", "/t/tokens.json"],
                            "volumeMounts": [{"name": "t", "mountPath": "/t"}],
                        }
                    ],
                    "volumes": [{"name": "t", "secret": {"secretName": f"{RELEASE}-shim-tokens"}}],
                },
            )
            got = operator.post(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", json=disguised, params=dry)
            self.record(
                "operator's token: a scanner-labelled Job as the shim's account reading its tokens",
                refused_status(got),
            )
            got = operator.patch(
                f"{ns}/configmaps/{RELEASE}-settings", content="{}", headers=merge, params=dry
            )
            self.record("operator's token: PATCH the settings ConfigMap", refused_status(got))
        with self.as_account(f"{RELEASE}-shim") as shim:
            image = {"data": {"SKYSCAN_SCANNER_IMAGE": "attacker.example/scanner"}}
            got = shim.patch(
                f"{ns}/configmaps/{RELEASE}-settings", content=json.dumps(image), headers=merge, params=dry
            )
            self.record("shim's token: set SKYSCAN_SCANNER_IMAGE in the settings", refused_status(got))
            ca = {"data": {"ca.crt": "attacker's CA"}}
            got = shim.patch(
                f"{ns}/configmaps/{RELEASE}-shim-ca", content=json.dumps(ca), headers=merge, params=dry
            )
            self.record("shim's token: replace the CA scanners trust", refused_status(got))
            got = shim.delete(f"{ns}/configmaps/{RELEASE}-shim-ca", params=dry)
            self.record("shim's token: delete the CA scanners trust", refused_status(got))
            got = shim.post(f"{ns}/secrets", json={"metadata": {"name": "audit"}}, params=dry)
            self.record("shim's token: create a Secret", refused_status(got))
            for name in fixed:
                got = shim.patch(f"{ns}/secrets/{name}", content="{}", headers=merge)
                self.record(f"shim's token: PATCH {{}} Secret {name}", refused_status(got))

    # --- Pod Security -------------------------------------------------------------------------------

    def pod_security(self) -> None:
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        for what, spec in (
            ("privileged", {"containers": [{**PLAIN, "securityContext": {"privileged": True}}]}),
            ("hostPath /", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
            ("hostNetwork", {"hostNetwork": True}),
            ("hostPID", {"hostPID": True}),
        ):
            got = self.api.http.post(
                pods, json=hostile_pod("audit-" + what.split()[0].lower(), **spec), params={"dryRun": "All"}
            )
            self.record(f"admin: a {what} Pod in namespace {NAMESPACE}", refused_status(got))
        # A Job is admitted (Pod Security checks Pods); its Pods are not.
        job = hostile_job("audit-privileged", {"app": "audit"}, ROOT_ON_THE_NODE)
        jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
        self.api.http.post(jobs, json=job).raise_for_status()
        try:
            events = f"/api/v1/namespaces/{NAMESPACE}/events"
            selector = {"fieldSelector": "involvedObject.name=audit-privileged,reason=FailedCreate"}

            def failed() -> str | None:
                items = (self.api.http.get(events, params=selector).json()).get("items", [])
                return next((e["message"] for e in items if "PodSecurity" in e["message"]), None)

            message = poll(failed, 30)
            pods_made = self.api.http.get(pods, params={"labelSelector": "job-name=audit-privileged"})
            made = len(pods_made.json().get("items", []))
            self.record(
                "admin: a privileged Job's Pods",
                Probe(
                    "",
                    bool(message) and made == 0,
                    f"{made} Pods; {(message or 'no FailedCreate event')[:160]}",
                ),
            )
        finally:
            self.api.http.delete(f"{jobs}/audit-privileged", params={"propagationPolicy": "Background"})

    # --- the archive --------------------------------------------------------------------------------

    def archive(self) -> None:
        got = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{ARCHIVE_SECRET}")
        if got is None:
            self.record("the archive's DSN", Probe("", True, "no archive Secret"))
            return
        dsn = base64.b64decode(got["data"]["SKYSCAN_ARCHIVE_DSN"]).decode()
        parts = urlsplit(dsn)
        from_host = parts._replace(netloc=parts.netloc.replace(f"@{parts.hostname}", "@127.0.0.1")).geturl()
        for what, sql in (
            (
                "COPY ... FROM PROGRAM 'id'",
                "CREATE TEMP TABLE audit (line text); COPY audit FROM PROGRAM 'id'",
            ),
            ("pg_read_file('/etc/passwd')", "SELECT pg_read_file('/etc/passwd')"),
            ("CREATE ROLE", "CREATE ROLE audit_intruder"),
            ("ALTER ROLE ... SUPERUSER", "ALTER ROLE CURRENT_USER SUPERUSER"),
            ("GRANT pg_execute_server_program", "GRANT pg_execute_server_program TO CURRENT_USER"),
        ):
            self.record(f"the archive's DSN: {what}", asyncio.run(sql_refused(from_host, sql)))

    # --- from Pods ----------------------------------------------------------------------------------

    def exec(self, namespace: str, pod: str, script: str, *args: str) -> str:
        done = subprocess.run(
            [
                "kubectl",
                "--kubeconfig",
                self.kubeconfig,
                "-n",
                namespace,
                "exec",
                pod,
                "--",
                "python3",
                "-c",
                script,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise AuditError(f"kubectl exec {pod}: {done.stderr.strip()}")
        return done.stdout

    def reach(self, namespace: str, pod: str, who: str, targets: dict[str, str]) -> None:
        out = self.exec(namespace, pod, CONNECT, *targets.values())
        for what, target in targets.items():
            line = next((x for x in out.splitlines() if x.startswith(f"{target} ")), f"{target} no answer")
            self.record(f"{who}: {what} ({target})", Probe("", " reached" not in line, line.split(" ", 1)[1]))

    def from_pods(self) -> None:
        with self.probe_pods() as ips:
            archive = node.load(real_dir(self.d) / "node")
            ports = archive.host_ports if archive else []
            operator = self.pods(NAMESPACE, "app.kubernetes.io/component=operator")[0]["status"]["podIP"]
            wms = f"{WMS}.{NAMESPACE}.svc:8081"
            elsewhere = {
                **{f"the archive's PostgreSQL on the host, port {p}": f"{node.GATEWAY}:{p}" for p in ports},
                "the operator's metrics port": f"{operator}:9090",
                "the operator's liveness port": f"{operator}:8081",
                "the WMS simulator": wms,
            }
            self.reach(OTHER_NAMESPACE, "other", f"a Pod in namespace {OTHER_NAMESPACE}", elsewhere)
            scanner = {
                **{f"the archive's PostgreSQL on the host, port {p}": f"{node.GATEWAY}:{p}" for p in ports},
                "the operator's liveness port": f"{operator}:8081",
                f"a DNS-port listener in namespace {OTHER_NAMESPACE}": f"{ips['other']}:53",
            }
            self.reach(NAMESPACE, "audit-scanner", "a scanner-labelled Pod", scanner)
            out = self.exec(
                NAMESPACE, "audit-scanner", HTTP_GET, f"http://{wms}/v1/workflows?limit=1"
            ).strip()
            self.record(
                "a scanner-labelled Pod: the WMS simulator's workflows without a token",
                Probe("", out == "403", out),
            )

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        got = self.api.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        return list((got or {}).get("items", []))

    @contextmanager
    def probe_pods(self) -> Iterator[dict[str, str]]:
        """A listener Pod in a namespace of its own, a scanner-labelled Pod in Skyscan's; their IPs."""
        self.api.apply(
            f"/api/v1/namespaces/{OTHER_NAMESPACE}",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER_NAMESPACE}},
        )
        made = {
            ("other", OTHER_NAMESPACE): probe_pod(
                "other", OTHER_NAMESPACE, {"app": "audit"}, ["python3", "-c", LISTENER]
            ),
            ("audit-scanner", NAMESPACE): probe_pod(
                "audit-scanner", NAMESPACE, SCANNER_LABELS, ["python3", "-c", "import time; time.sleep(600)"]
            ),
        }
        try:
            for (_, ns), pod in made.items():
                self.api.http.post(f"/api/v1/namespaces/{ns}/pods", json=pod).raise_for_status()
            ips = {name: poll(functools.partial(self._running_ip, ns, name), 90) for name, ns in made}
            # kube-router enforces a Pod's policies a moment after it starts.
            poll(lambda: all(f"-s {ip}/32" in node_rules() for ip in ips.values()), 30)
            yield {k: str(v) for k, v in ips.items()}
        finally:
            for name, ns in made:
                self.api.http.delete(
                    f"/api/v1/namespaces/{ns}/pods/{name}", params={"gracePeriodSeconds": "0"}
                )
            self.api.http.delete(f"/api/v1/namespaces/{OTHER_NAMESPACE}")

    def _running_ip(self, namespace: str, name: str) -> str | None:
        status = (self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}") or {}).get("status") or {}
        return status.get("podIP") if status.get("phase") == "Running" else None

    # --- Scans REST would refuse ---------------------------------------------------------------------

    def kubectl_scans(self) -> None:
        scans = f"/apis/skyscan.io/v1alpha1/namespaces/{NAMESPACE}/scans"
        for tag in ("dev", "4.2.0@sha256:" + "0" * 64):
            name = f"audit-{uuid.uuid4().hex[:12]}"
            body = {
                "apiVersion": "skyscan.io/v1alpha1",
                "kind": "Scan",
                "metadata": {"name": name},
                "spec": {**SCAN_SPEC, "dockerTag": tag},
            }
            self.api.http.post(scans, json=body).raise_for_status()
            try:

                def failed(name: str = name) -> str | None:
                    status = (self.api.get(f"{scans}/{name}") or {}).get("status") or {}
                    messages = [c.get("message", "") for c in status.get("conditions") or []]
                    return next((m for m in messages if "spec.dockerTag" in m), None)

                message = poll(failed, 30)
                job = self.api.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/skyscan-{name}")
                self.record(
                    f"a kubectl-made Scan with dockerTag {tag[:24]}",
                    Probe(
                        "",
                        bool(message) and job is None,
                        f"{'a Job was made; ' if job else ''}{message or 'no condition names it'}",
                    ),
                )
            finally:
                self.api.http.delete(f"{scans}/{name}")

    def run(self) -> list[Probe]:
        for part in (
            self.archive,
            self.component_writes,
            self.pod_security,
            self.from_pods,
            self.kubectl_scans,
        ):
            part()
        return self.probes


SCAN_SPEC = {
    "recoAlgo": "millipede_wilks",
    "sensorEventId": "audit-event",
    "nsides": {"8": 0},
    "realOrSimulatedEvent": "real",
    "maxPixelRecoTime": 600,
    "requestClusters": [{"location": "osg", "nWorkers": 1}],
}


class AuditError(RuntimeError):
    pass


def node_rules() -> str:
    return subprocess.run(["iptables", "-S", "KUBE-ROUTER-INPUT"], capture_output=True, text=True).stdout


def main() -> int:
    d = Path(os.environ.get("SKYSCAN_LOCAL_DIR", REPO / ".skyscan"))
    if not (real_dir(d) / "cluster" / "kubeconfig").exists():
        print("no real-node stack here: `make up NODE=real` first", file=sys.stderr)
        return 2
    probes = Audit(d).run()
    allowed = [p for p in probes if not p.refused]
    print(f"\n{len(probes) - len(allowed)} of {len(probes)} probes refused")
    return 1 if allowed else 0


if __name__ == "__main__":
    with suppress(KeyboardInterrupt):
        sys.exit(main())
