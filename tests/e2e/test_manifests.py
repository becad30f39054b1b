"""The deployment manifests: kustomize builds them, the API server accepts them (server-side dry run),
the CRD copy has not drifted, and each component's RBAC grants what it needs and nothing more."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import httpx
import yaml

from skyscan import crd
from skyscan.io import kube
from skyscan.io.kube import Kube
from skyscan_local import stack as localstack
from tests.conftest import Cluster
from tests.e2e.conftest import FAST, KUBECTL, REPO, scan_request
from tests.helpers import eventually

MANIFESTS = REPO / "manifests"


async def run_kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", kubeconfig, *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def built(kubeconfig: str) -> list[dict[str, Any]]:
    code, out = await run_kubectl(kubeconfig, "kustomize", str(MANIFESTS))
    assert code == 0, out
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


CLUSTER_RBAC = ("ClusterRole", "ClusterRoleBinding")
RBAC = ("ServiceAccount", "Role", "RoleBinding", *CLUSTER_RBAC)


def into_namespace(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The same objects for another namespace (the test's), so a dry run needs no `skyscan` namespace;
    cluster-scoped RBAC gets the namespace in its name, so tests do not share it."""
    out = []
    for doc in copy.deepcopy(docs):
        if doc["kind"] == "Namespace":
            continue
        if doc["kind"] in CLUSTER_RBAC:
            doc["metadata"]["name"] += f"-{namespace}"
            if "roleRef" in doc:
                doc["roleRef"]["name"] += f"-{namespace}"
        elif doc["kind"] != "CustomResourceDefinition":
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        out.append(doc)
    return out


async def apply_rbac(kubeconfig: str, docs: list[dict[str, Any]]) -> list[str]:
    """Apply the RBAC objects for real; returns the cluster-scoped ones to delete afterwards."""
    rbac = [d for d in docs if d["kind"] in RBAC]
    code, out = await run_kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    assert code == 0, out
    return [f"{d['kind'].lower()}/{d['metadata']['name']}" for d in rbac if d["kind"] in CLUSTER_RBAC]


async def delete_cluster_rbac(kubeconfig: str, names: list[str]) -> None:
    if names:
        await run_kubectl(kubeconfig, "delete", "--ignore-not-found", *names)


def test_the_crd_copies_in_manifests_match_the_models() -> None:
    for of in crd.KINDS:
        assert (MANIFESTS / "crds" / of.file.name).read_text() == crd.render(of), "run `make crds`"


async def test_manifests_are_accepted_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    docs = await built(cluster.kubeconfig)
    operator = find(docs, "Deployment", "skyscan-operator")["spec"]
    # Two replicas, one acting by the Lease; a rollout never runs more than two (README, Scale).
    assert operator["replicas"] == 2
    assert operator["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    (container,) = operator["template"]["spec"]["containers"]
    assert container["command"] == ["skyscan-operator"] and container["image"].startswith("ghcr.io/")
    assert {"livenessProbe", "startupProbe"} <= container.keys()
    env = {e["name"]: e for e in container["env"]}
    assert env["SKYSCAN_LEASE_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Every replica's metrics port is declared and reachable through the operator's Service.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(env["SKYSCAN_METRICS_PORT"]["value"])
    metrics = find(docs, "Service", "skyscan-operator")["spec"]
    assert metrics["ports"] == [{"name": "metrics", "port": ports["metrics"], "targetPort": "metrics"}]
    assert metrics["selector"].items() <= operator["template"]["metadata"]["labels"].items()
    shim = find(docs, "Deployment", "skyscan-shim")["spec"]["template"]["spec"]
    assert shim["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert shim["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/livez"  # an outage restarts none
    service = find(docs, "Service", "skyscan-shim")["spec"]
    assert service["ports"][0]["port"] == 8080 and service["sessionAffinity"] == "ClientIP"  # README, shims
    assert find(docs, "Deployment", "skyscan-shim")["spec"]["replicas"] == 2
    settings = next(d for d in docs if d["kind"] == "ConfigMap")
    assert settings["metadata"]["name"].startswith("skyscan-settings-")  # hashed: changes roll the pods
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] in ("Deployment", "Role")} == {
        "skyscan"
    }

    text = yaml.safe_dump_all(into_namespace(docs, namespace))
    code, out = await run_kubectl(cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=text)
    assert code == 0, out
    assert out.count("(server dry run)") == len(docs) - 1, out


async def test_each_component_gets_least_privilege(cluster: Cluster, namespace: str) -> None:
    cluster_scoped = await apply_rbac(
        cluster.kubeconfig, into_namespace(await built(cluster.kubeconfig), namespace)
    )

    async def can(who: str, verb: str, resource: str, where: str = namespace, *more: str) -> bool:
        sa = f"system:serviceaccount:{namespace}:skyscan-{who}"
        code, _ = await run_kubectl(
            cluster.kubeconfig, "auth", "can-i", verb, resource, "-n", where, "--as", sa, *more
        )
        return code == 0

    expected = {
        ("shim", "create", "scans.skyscan.io"): True,
        ("shim", "delete", "scans.skyscan.io"): True,
        ("shim", "patch", "scans.skyscan.io/status"): True,
        ("shim", "patch", "configmaps"): True,  # payloads are server-side applied
        ("shim", "update", "configmaps"): False,
        ("shim", "create", "jobs.batch"): False,
        ("shim", "get", "secrets"): False,
        ("shim", "update", "scans.skyscan.io"): False,
        ("shim", "list", "namespaces"): False,
        ("operator", "create", "jobs.batch"): True,
        ("operator", "patch", "jobs.batch"): True,  # server-side apply
        ("operator", "get", "jobs.batch"): False,
        ("operator", "delete", "jobs.batch"): True,
        ("operator", "watch", "pods"): True,
        ("operator", "create", "secrets"): True,
        ("operator", "patch", "scans.skyscan.io/status"): True,
        ("operator", "create", "events"): True,
        ("operator", "watch", "namespaces"): True,  # kopf's observers, read-only
        ("operator", "list", "customresourcedefinitions.apiextensions.k8s.io"): True,
        ("operator", "create", "customresourcedefinitions.apiextensions.k8s.io"): False,
        ("operator", "delete", "namespaces"): False,
        ("operator", "delete", "scans.skyscan.io"): True,  # a finished scan, once it is archived
        ("operator", "update", "scans.skyscan.io"): False,
        ("operator", "list", "secrets"): False,
        ("operator", "get", "secrets"): False,  # it writes per-scan Secrets, reads none
        ("operator", "delete", "secrets"): True,
        ("shim", "create", "serviceaccounts"): False,
        ("scanner", "get", "scans.skyscan.io"): False,  # the scanner reaches nothing in the API
        ("scanner", "get", "pods"): False,
        ("scanner", "get", "secrets"): False,
        ("scanner", "get", "configmaps"): False,
        ("operator", "create", "configmaps"): True,  # an ended scanner's kept log (policy: that alone)
        ("operator", "get", "configmaps"): True,  # is a scan's sensor event stored (metadata only)
        ("operator", "list", "configmaps"): True,  # the janitor's sweep of payloads without an owner
        ("operator", "delete", "configmaps"): True,
        ("operator", "patch", "configmaps"): True,  # owners added: a replacement, a kubectl-made event
        ("operator", "watch", "configmaps"): False,
        ("operator", "delete", "pods"): False,
        ("operator", "create", "leases.coordination.k8s.io"): True,  # its replicas' Lease ...
        ("operator", "list", "leases.coordination.k8s.io"): False,
        ("operator", "delete", "leases.coordination.k8s.io"): False,
        ("shim", "create", "leases.coordination.k8s.io"): False,
        # Subscriptions: the shim makes them and reaches no Secret (a new one hands its signing secret to
        # the operator in its spec); the operator delivers them, keeping the secrets in one Secret.
        ("shim", "create", "scansubscriptions.skyscan.io"): True,
        ("shim", "delete", "scansubscriptions.skyscan.io"): True,
        ("shim", "patch", "secrets/skyscan-webhook-secrets"): False,
        ("shim", "get", "secrets/skyscan-webhook-secrets"): False,
        ("operator", "watch", "scansubscriptions.skyscan.io"): True,
        ("operator", "create", "scansubscriptions.skyscan.io"): False,
        ("operator", "get", "secrets/skyscan-webhook-secrets"): True,
        ("operator", "patch", "secrets/skyscan-webhook-secrets"): True,
        ("operator", "get", "secrets/skyscan-scanner-token"): False,
    }
    try:
        got = dict(zip(expected, await asyncio.gather(*(can(*k) for k in expected)), strict=True))
        assert got == expected
        # Nothing namespaced outside their own namespace.
        assert not await can("operator", "list", "scans.skyscan.io", "default")
        assert not await can("operator", "list", "pods", "default")
        assert not await can("shim", "get", "configmaps", "default")
        # ... read and renewed by its name only.
        for verb in ("get", "update"):
            assert await can("operator", verb, "leases.coordination.k8s.io/skyscan-operator")
            assert not await can("operator", verb, "leases.coordination.k8s.io/another")
        assert not await can("operator", "create", "leases.coordination.k8s.io", "default")
        # Tokens for the scanner account only.
        token = ("--subresource", "token")
        assert await can("operator", "create", "serviceaccounts/skyscan-scanner", namespace, *token)
        assert not await can("operator", "create", "serviceaccounts/skyscan-shim", namespace, *token)
        assert not await can("shim", "create", "serviceaccounts/skyscan-scanner", namespace, *token)
        docs = await built(cluster.kubeconfig)
        assert find(docs, "ServiceAccount", "skyscan-scanner")["automountServiceAccountToken"] is False
        bound = [s for d in docs for s in d.get("subjects") or [] if d["kind"].endswith("Binding")]
        assert all(s["name"] != "skyscan-scanner" for s in bound)
    finally:
        await delete_cluster_rbac(cluster.kubeconfig, cluster_scoped)


async def service_account_kubeconfig(kubeconfig: str, namespace: str, account: str, path: Path) -> str:
    """The cluster's kubeconfig, acting as a ServiceAccount (a token from the TokenRequest API)."""
    code, token = await run_kubectl(kubeconfig, "create", "token", account, "-n", namespace, "--duration=1h")
    assert code == 0, token
    config = yaml.safe_load(await asyncio.to_thread(Path(kubeconfig).read_text))
    config["users"] = [{"name": account, "user": {"token": token.strip()}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    await asyncio.to_thread(path.write_text, yaml.safe_dump(config))
    return str(path)


async def test_the_stack_runs_on_its_least_privilege_service_accounts(
    cluster: Cluster, namespace: str, api: Kube, tmp_path: Path, archive_dsn: str
) -> None:
    """The shim and the operator, each with only its Role, carry a scan through start and soft delete."""
    cluster_scoped = await apply_rbac(
        cluster.kubeconfig, into_namespace(await built(cluster.kubeconfig), namespace)
    )
    as_ = {
        who: await service_account_kubeconfig(cluster.kubeconfig, namespace, f"skyscan-{who}", tmp_path / who)
        for who in ("shim", "operator")
    }
    settings = localstack.LocalStackSettings(
        SKYSCAN_LOCAL_DIR=tmp_path / "stack",
        SKYSCAN_KUBECONFIG=cluster.kubeconfig,  # the admin installs the CRD and prepares the namespace
        SKYSCAN_NAMESPACE=namespace,
        SKYSCAN_LOCAL_ARCHIVE_DSN=archive_dsn,
        SKYSCAN_LOCAL_SHIM_PORT=0,
        SKYSCAN_LOCAL_WMS_PORT=0,
        SKYSCAN_LOCAL_READY_TIMEOUT=60,
        tie_to_parent=True,
        overrides=FAST,
        component_overrides={who: {"SKYSCAN_KUBECONFIG": kc} for who, kc in as_.items()},
    )
    try:
        env = await asyncio.to_thread(localstack.up, settings)
        headers = {"Authorization": f"Bearer {env['SKYSCAN_USER_TOKEN']}"}
        async with httpx.AsyncClient(base_url=env["SKYSCAN_URL"], headers=headers, timeout=30) as http:

            async def status_when(check: Any) -> dict[str, Any] | None:
                got: dict[str, Any] = (await http.get(f"/scan/{scan_id}/status")).json()
                return got if check(got) else None

            created = await http.post("/scan", json=scan_request())
            assert created.status_code == 200, created.text
            scan_id = created.json()["scan_id"]
            # Admitted, workflow requested, queues, Secret, Job; kwok ends the (unheld) Pod at once.
            await eventually(
                lambda: status_when(
                    lambda s: s["scan_state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"
                ),
                timeout=30,
            )
            job = await eventually(
                lambda: api.request("GET", kube.path("batch/v1", "jobs", namespace, f"skyscan-{scan_id}")),
                timeout=30,
            )
            assert job["metadata"]["ownerReferences"][0]["name"] == scan_id
            assert (await http.request("DELETE", f"/scan/{scan_id}", json={})).status_code == 200
            await eventually(lambda: status_when(lambda s: s["wms_deactivated"] == "ABORTED"), timeout=30)
        for log in ("operator.log", "shim.log"):
            text = (settings.dir / "logs" / log).read_text()
            assert "forbidden" not in text.lower(), localstack.tail(settings.dir / "logs" / log)
    finally:
        await asyncio.to_thread(localstack.down, settings)
        await delete_cluster_rbac(cluster.kubeconfig, cluster_scoped)
