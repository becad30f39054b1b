"""The chart's accounts hold the least they need, on a real API server: `kubectl auth can-i --list` of
each is the table of docs/operating/accounts.md; the writes an attacker with a component's token
tried (patching a Secret to read it, the settings, the CA, a Job that is a step to root) are refused by
the chart's admission policies while the writes the components make (the operator's own Job, Secrets
and payloads, as its builders make them; the shim's payloads) are admitted; and the namespace's Pod
Security level refuses privileged, host and hostPath Pods while admitting the chart's and the
scanners' Pods."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from skyscan import model
from skyscan import subscription as sub
from skyscan_local import audit, host_clients
from skyscan_operator import scanner_job
from skyscan_operator.settings import OperatorSettings
from tests.conftest import Cluster
from tests.integration.test_helm import KUBECTL, template
from tests.unit.test_crd import minimal_spec

REPO = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]
# What the API server applies of the chart here: its accounts, rules, policies, namespace and the
# objects the policies guard (no Deployment: no component runs).
APPLIED = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
           "Secret", "ConfigMap", "ValidatingAdmissionPolicy",
           "ValidatingAdmissionPolicyBinding"}  # fmt: skip
SCAN = "0193aaaaaaax0123456789abcdef0123"


@dataclass
class Release:
    name: str
    namespace: str
    admin: httpx.Client
    kubeconfig: str
    docs: list[Doc]

    def account(self, component: str) -> str:
        return f"{self.name}-{component}"

    def as_account(self, component: str) -> httpx.Client:
        got = self.admin.post(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.account(component)}/token",
            json={"spec": {"expirationSeconds": 600}},
        )
        got.raise_for_status()
        return host_clients.client(Path(self.kubeconfig), got.json()["status"]["token"])

    def path(self, resource: str, name: str = "", group: str = "/api/v1") -> str:
        return f"{group}/namespaces/{self.namespace}/{resource}" + (f"/{name}" if name else "")


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Release]:
    """The chart's accounts and policies, as release `skyscan-<hex>` in a namespace of that name (the
    cluster-scoped objects named by release, so no other test's match them), and the Secrets an
    install makes beforehand."""
    name = f"skyscan-{secrets.token_hex(3)}"
    docs = [d for d in template(release=name, namespace=name) if d["kind"] in APPLIED]
    admin = host_clients.client(Path(cluster.kubeconfig))  # the kubeconfig's user
    admin.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", cluster.kubeconfig, "apply", "--server-side", "-f", "-"],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for secret in (
        "skyscan-shim-tokens",
        "skyscan-archive",
        "skyscan-presign-key",
        "skyscan-wms-credentials",
    ):
        body = {"metadata": {"name": secret}, "stringData": {"key": "the-secret-value"}}
        admin.post(f"/api/v1/namespaces/{name}/secrets", json=body).raise_for_status()
    r = Release(name, name, admin, cluster.kubeconfig, docs)
    # The API server enforces a new policy once its informer has it (a moment after the create).
    with r.as_account("shim") as shim:
        deadline = time.monotonic() + 30
        while shim.delete(r.path("configmaps", f"{name}-settings"), params={"dryRun": "All"}).is_success:
            assert time.monotonic() < deadline, "the admission policies never took effect"
            time.sleep(0.2)
    yield r
    admin.delete(f"/api/v1/namespaces/{name}")
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            admin.delete(
                f"/apis/rbac.authorization.k8s.io/v1/{doc['kind'].lower()}s/{doc['metadata']['name']}"
            )
        elif doc["kind"].startswith("ValidatingAdmissionPolicy"):
            plural = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else (
                "validatingadmissionpolicybindings")  # fmt: skip
            admin.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}")
    admin.close()


# --- the documented table ------------------------------------------------------------------------

ROW = re.compile(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]$")


def can_i(release: Release, account: str) -> set[tuple[str, str, str]]:
    """(resource, names, verbs) rows of `kubectl auth can-i --list` as the account."""
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", release.kubeconfig, "auth", "can-i", "--list", "-n", release.namespace,
         f"--as=system:serviceaccount:{release.namespace}:{account}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = set()
    for line in done.stdout.splitlines()[1:]:
        if m := ROW.match(line.strip()):
            resource, urls, names, verbs = m.groups()
            if not urls:
                rows.add((resource, ",".join(names.split()), ",".join(sorted(verbs.split()))))
    return rows


def readme_table(release: str) -> dict[str, set[tuple[str, str, str]]]:
    text = (REPO / "docs" / "operating" / "accounts.md").read_text()
    table = text.split("<!-- accounts: begin -->")[1].split("<!-- accounts: end -->")[0]
    accounts: dict[str, set[tuple[str, str, str]]] = {}
    for line in table.strip().splitlines()[2:]:
        account, resource, names, verbs, _ = (c.strip().strip("`") for c in line.strip("|").split("|"))
        rows = accounts.setdefault(account.replace("skyscan-", f"{release}-"), set())
        if resource:
            verbs_ = ",".join(sorted(v.strip() for v in verbs.split(",")))
            named = (
                names if names == sub.SECRET_NAME else names.replace("skyscan-", f"{release}-")
            )  # one per namespace
            rows.add((resource, named, verbs_))
    return accounts


@pytest.mark.timeout(90)
def test_each_accounts_permissions_are_the_readmes_table(release: Release) -> None:
    table = readme_table(release.name)
    assert set(table) == {release.account(c) for c in ("operator", "shim", "scanner")}
    everyone = can_i(release, release.account("scanner"))  # what any account may: self reviews
    assert table[release.account("scanner")] == set()
    for account, rows in table.items():
        assert can_i(release, account) - everyone == rows, account


# --- writes ---------------------------------------------------------------------------------------

MERGE = {"Content-Type": "application/merge-patch+json"}
DRY = {"dryRun": "All"}


def refused(got: httpx.Response) -> bool:
    return got.status_code in (403, 422) and '"data"' not in got.text


def operator_settings(release: Release) -> OperatorSettings:
    """The settings the chart hands the operator (its ConfigMap), as the operator reads them."""
    (settings,) = (d for d in release.docs if d["metadata"]["name"] == f"{release.name}-settings")
    keys = ("SCANNER_IMAGE", "SIDECAR_IMAGE", "REST_CA_CONFIGMAP", "SCANNER_SERVICE_ACCOUNT", "REST_ADDRESS")
    given = {k.lower(): settings["data"][f"SKYSCAN_{k}"] for k in keys if f"SKYSCAN_{k}" in settings["data"]}
    return OperatorSettings(**given)


def scanner_job_of(release: Release) -> Doc:
    spec = model.ScanSpec.model_validate(minimal_spec(), context=model.STORED)
    return scanner_job.build_job(SCAN, "uid-1", release.namespace, spec, operator_settings(release))


@pytest.mark.timeout(90)
def test_a_components_token_writes_its_own_objects_and_no_other(release: Release) -> None:
    fixed = ["skyscan-shim-tokens", "skyscan-archive", "skyscan-presign-key", "skyscan-wms-credentials",
             f"{release.name}-shim-tls"]  # fmt: skip
    jobs = release.path("jobs", group="/apis/batch/v1")
    with release.as_account("operator") as operator:
        for name in fixed:  # a patch answers with the object: refused, nothing read
            got = operator.patch(release.path("secrets", name), content="{}", headers=MERGE)
            assert refused(got), (name, got.status_code, got.text[:300])
        own = scanner_job.credential_secret(SCAN, "uid-1", release.namespace, "a-token")
        own["metadata"].pop("ownerReferences")  # no such Scan here
        got = operator.post(release.path("secrets"), json=own, params=DRY)
        assert got.status_code == 201, got.text
        bare = {**own, "metadata": {"name": f"skyscan-{SCAN}-scanner"}}
        got = operator.post(release.path("secrets"), json=bare, params=DRY)
        assert refused(got), "a scan's Secret name without its labels"
        job = scanner_job_of(release)
        job["metadata"].pop("ownerReferences")
        got = operator.post(jobs, json=job, params=DRY)
        assert got.status_code == 201, got.text  # the operator's own Job, as it builds it
        pod = job["spec"]["template"]["spec"]
        scanner = pod["containers"][0]
        shim_tokens = {"name": "t", "secret": {"secretName": "skyscan-shim-tokens"}}
        for why, change in (
            ("another account", {"serviceAccountName": release.account("shim")}),
            ("an API token", {"automountServiceAccountToken": True}),
            ("the host's network", {"hostNetwork": True}),
            ("another's Secret", {"volumes": [*pod["volumes"], shim_tokens]}),
            ("a hostPath", {"volumes": [*pod["volumes"], {"name": "h", "hostPath": {"path": "/"}}]}),
            ("another image", {"containers": [{**pod["containers"][0], "image": "attacker.example/x:1"}]}),
            (
                "a privileged container",
                {"containers": [{**scanner, "securityContext": {"privileged": True}}]},
            ),
            (
                "another's Secret in env",
                {
                    "containers": [
                        {
                            **pod["containers"][0],
                            "env": [
                                {
                                    "name": "X",
                                    "valueFrom": {"secretKeyRef": {"name": "skyscan-archive", "key": "key"}},
                                }
                            ],
                        }
                    ]
                },
            ),
        ):
            hostile = json.loads(json.dumps(job))
            hostile["spec"]["template"]["spec"].update(change)
            got = operator.post(jobs, json=hostile, params=DRY)
            assert refused(got), (why, got.status_code, got.text[:300])
        got = operator.post(
            jobs,
            json=audit.hostile_job("x", {"app": "x"}, audit.ROOT_ON_THE_NODE, release.namespace),
            params=DRY,
        )
        assert refused(got), got.text
        got = operator.patch(
            release.path("configmaps", f"{release.name}-settings"), content="{}", headers=MERGE
        )
        assert refused(got), got.text
        # An ended scanner's log, kept as `payloads.create_log` makes it; the kubelet's log of a Pod.
        log = {
            "skyscan.io/payload": "log",
            "app.kubernetes.io/managed-by": "skyscan",
            "skyscan.io/scan-id": SCAN,
        }
        kept = {"metadata": {"name": f"skyscan-log-{SCAN}", "labels": log}, "binaryData": {"log.txt.gz": ""}}
        assert operator.post(release.path("configmaps"), json=kept, params=DRY).status_code == 201
        misnamed = {**kept, "metadata": {**kept["metadata"], "name": f"skyscan-result-{SCAN}"}}
        assert refused(operator.post(release.path("configmaps"), json=misnamed, params=DRY))
        assert operator.get(release.path("pods", f"skyscan-{SCAN}-bcdfg") + "/log").status_code == 404
    with release.as_account("shim") as shim:
        for name in (f"{release.name}-settings", f"{release.name}-shim-ca"):
            got = shim.patch(release.path("configmaps", name), content='{"data": {"x": "y"}}', headers=MERGE)
            assert refused(got), (name, got.text)
            assert refused(shim.delete(release.path("configmaps", name), params=DRY)), name
        labels = {"skyscan.io/payload": "result", "app.kubernetes.io/managed-by": "skyscan"}
        payload = {"metadata": {"name": "skyscan-result-" + SCAN, "labels": labels}}
        assert shim.post(release.path("configmaps"), json=payload, params=DRY).status_code == 201
        unlabelled = {"metadata": {"name": "skyscan-result-" + SCAN}}
        assert refused(shim.post(release.path("configmaps"), json=unlabelled, params=DRY))
        # It reads a running scanner's log (pods/log), never a Pod, and keeps no log (the operator does).
        log = {"skyscan.io/payload": "log", "app.kubernetes.io/managed-by": "skyscan"}
        forged = {"metadata": {"name": "skyscan-log-" + SCAN, "labels": log}}
        assert refused(shim.post(release.path("configmaps"), json=forged, params=DRY))
        assert shim.get(release.path("pods", f"skyscan-{SCAN}-bcdfg") + "/log").status_code == 404
        assert shim.get(release.path("pods", f"skyscan-{SCAN}-bcdfg")).status_code == 403
        assert (
            shim.post(release.path("secrets"), json={"metadata": {"name": "x"}}, params=DRY).status_code
            == 403
        )


@pytest.mark.timeout(60)
def test_the_namespace_refuses_what_the_restricted_level_forbids_and_admits_skyscans_pods(
    release: Release,
) -> None:
    pods = release.path("pods")
    for why, spec in (
        ("privileged", {"containers": [{**audit.PLAIN, "securityContext": {"privileged": True}}]}),
        ("hostPath", {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}),
        ("hostNetwork", {"hostNetwork": True}),
        ("hostPID", {"hostPID": True}),
    ):
        pod = audit.hostile_pod("hostile", **spec)
        pod["metadata"]["namespace"] = release.namespace
        got = release.admin.post(pods, json=pod, params=DRY)
        assert got.status_code == 403 and "PodSecurity" in got.text, (why, got.text)
    job = scanner_job_of(release)
    rendered = template("--set", "archive.adminDsnSecret=archive-admin", release=release.name,
                        namespace=release.namespace)  # fmt: skip
    as_pods = [job["spec"]["template"]] + [
        d["spec"]["template"] for d in rendered if d["kind"] in ("Deployment", "Job")  # Job: archive-role
    ]  # fmt: skip
    assert len(as_pods) == 4
    for template_ in as_pods:
        pod = {"metadata": {"generateName": "admitted-", **template_["metadata"]}, "spec": template_["spec"]}
        got = release.admin.post(pods, json=pod, params=DRY)
        assert got.status_code == 201, got.text
    probe = audit.probe_pod("probe", release.namespace, audit.SCANNER_LABELS, ["true"])
    assert release.admin.post(pods, json=probe, params=DRY).status_code == 201
