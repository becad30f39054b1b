"""The Helm chart (charts/skyscan): `helm lint` passes, the schema refuses what cannot work, the values
show in what it renders, the API server accepts it (server-side dry run), and it renders what the
kustomize manifests hold (objects, RBAC rules, Pod specs, settings), so the two never drift.

helm comes from tools/k8s/build.sh, cached beside the control-plane binaries."""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from skyscan import crd, model
from skyscan_local import control_plane as localcluster
from skyscan_operator import scanner_job
from skyscan_operator.settings import OperatorSettings
from tests.conftest import Cluster
from tests.unit.test_crd import minimal_spec

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "skyscan"
KUBECTL = os.environ.get("KUBECTL", "kubectl")
Doc = dict[str, Any]

# Every value set away from its default (release "prod": names prod-skyscan-*).
EVERYTHING: Doc = {
    "image": {"repository": "registry.example.org/skyscan", "tag": "9.9.9", "pullPolicy": "Always"},
    "operator": {"replicas": 1, "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}},
    "shim": {"replicas": 0, "resources": {"limits": {"cpu": 2, "memory": "2Gi"}}},
    "settings": {
        "SKYSCAN_KNOWN_CLUSTERS": {"osg": 10, "sub-2": None},  # maps merge: null drops a default key
        "SKYSCAN_WORKERS": 8,
        "SKYSCAN_AUTH_DISABLED": False,
        "SKYSCAN_LOG_LEVEL": "DEBUG",
        "SKYSCAN_REST_ADDRESS": "http://rest.example.org",
    },
    "oidc": {"issuers": [{"issuer": "https://kc.example.org/realms/r", "audience": "skyscan"}]},
    "wms": {"address": "https://wms.example.org", "oidcIssuer": "", "credentialsSecret": "wms-client"},
    "archive": {"dsnSecret": "archive-dsn"},
    "presignKey": {"secretName": "presign"},
    "tokens": {"secretName": ""},
    "networkPolicy": {
        "enabled": True,
        "wms": {
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ewms"}}}],
            "ports": [{"port": 8081, "protocol": "TCP"}],
        },
        "dns": {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]},
    },
}


@functools.cache
def helm_binary() -> Path:
    path = localcluster.ensure_binaries() / "helm"
    assert path.is_file(), f"{path} is missing: run `bash tools/k8s/build.sh` (it builds helm)"
    return path


def run(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def values_file(tmp_path: Path, values: Doc) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template(*args: str | Path, release: str = "skyscan", namespace: str = "skyscan") -> list[Doc]:
    done = run(helm_binary(), "template", release, CHART, "--namespace", namespace, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kustomized() -> list[Doc]:
    """`kubectl kustomize manifests`, the settings ConfigMap under its name without the hash suffix
    (the chart rolls the Pods with a checksum annotation instead) and without the Namespace (Helm's
    `--create-namespace`)."""
    done = run(KUBECTL, "kustomize", REPO / "manifests")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] != "Namespace"]
    (settings,) = [d for d in docs if d["kind"] == "ConfigMap"]
    hashed = settings["metadata"]["name"]
    assert hashed.startswith("skyscan-settings-")
    return [yaml.safe_load(yaml.safe_dump(d).replace(hashed, "skyscan-settings")) for d in docs]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def settings_data(docs: list[Doc]) -> dict[str, Any]:
    """The settings ConfigMap's data, JSON values parsed (the chart writes JSON compactly)."""
    (doc,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-settings")]

    def value(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return text

    return {k: value(v) for k, v in doc["data"].items()}


def pod_spec(doc: Doc) -> Doc:
    """A Deployment's Pod spec without the pull policy, which only the chart states."""
    spec: Doc = copy.deepcopy(doc["spec"]["template"]["spec"])
    for container in spec["containers"]:
        container.pop("imagePullPolicy", None)
    return spec


def test_the_chart_lints(tmp_path: Path) -> None:
    for extra in ([], ["--values", str(values_file(tmp_path, EVERYTHING))]):
        done = run(helm_binary(), "lint", "--strict", CHART, *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"operator": {"replicas": -1}}, "/operator/replicas"),
        ({"settings": {"SKYSCAN_LEASE_NAME": "x"}}, "SKYSCAN_LEASE_NAME"),  # named as the Role allows
        ({"shim": {"replicas": -1}}, "/shim/replicas"),
        ({"settings": {"SKYSCAN_WMS_ADDRESS": "https://x"}}, "SKYSCAN_WMS_ADDRESS"),  # owned by wms
        ({"settings": {"log_level": "INFO"}}, "log_level"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"archive": {"dsnSecret": "Not A Name"}}, "/archive/dsnSecret"),
        ({"oidc": {"issuers": [{"issuer": "https://kc.example.org"}]}}, "audience"),
        ({"replicas": 2}, "replicas"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"wms": {"to": [], "ports": [{"port": 443}]}}}, "/networkPolicy/wms/to"),
        ({"networkPolicy": {"wms": {"to": [{"ipBlock": {"cidr": "everywhere"}}]}}}, "cidr"),
        ({"networkPolicy": {"wms": {"ports": [{"port": 70000}]}}}, "port"),
        ({"tokens": {"secretName": ""}}, "the shim needs people's credentials"),
        (
            {"tokens": {"secretName": ""}, "settings": {"SKYSCAN_AUTH_DISABLED": "false"}},
            "the shim needs people's credentials",
        ),
    ],
)
def test_values_that_cannot_work_are_refused(tmp_path: Path, values: Doc, complaint: str) -> None:
    done = run(helm_binary(), "template", "skyscan", CHART, "--values", values_file(tmp_path, values))
    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr


def test_the_values_show_in_what_the_chart_renders(tmp_path: Path) -> None:
    docs = template("--values", values_file(tmp_path, EVERYTHING), release="prod", namespace="ops")
    operator = find(docs, "Deployment", "prod-skyscan-operator")
    shim = find(docs, "Deployment", "prod-skyscan-shim")
    assert (operator["spec"]["replicas"], shim["spec"]["replicas"]) == (1, 0)
    (op,) = operator["spec"]["template"]["spec"]["containers"]
    (sh,) = shim["spec"]["template"]["spec"]["containers"]
    assert op["image"] == sh["image"] == "registry.example.org/skyscan:9.9.9"
    assert op["imagePullPolicy"] == "Always"
    # Helm merges maps with the defaults: a value replaces only what it names.
    assert op["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    assert sh["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": 2, "memory": "2Gi"},
    }
    secrets = {
        c["name"]: [s["secretRef"]["name"] for s in c["envFrom"] if "secretRef" in s] for c in (op, sh)
    }
    assert secrets == {"operator": ["wms-client", "archive-dsn"], "shim": ["archive-dsn"]}
    # No token Secret: the shim mounts only the presign key.
    volumes = shim["spec"]["template"]["spec"]["volumes"]
    assert [v["secret"]["secretName"] for v in volumes] == ["presign", "prod-skyscan-shim-tls"]
    assert find(docs, "Service", "prod-skyscan-shim")["metadata"]["namespace"] == "ops"
    assert settings_data(docs) == {
        "SKYSCAN_KNOWN_CLUSTERS": {"osg": 10},
        "SKYSCAN_MIN_TAG": "4.0.0",  # defaults left as they are
        "SKYSCAN_TAGS": ["4.0.0", "4.1.2", "4.2.0", "4.2.1"],
        "SKYSCAN_WORKERS": 8,
        "SKYSCAN_AUTH_DISABLED": False,
        "SKYSCAN_LOG_LEVEL": "DEBUG",
        "SKYSCAN_REST_ADDRESS": "http://rest.example.org",  # settings win over the derived address
        "SKYSCAN_REST_CA_CONFIGMAP": "prod-skyscan-shim-ca",
        "SKYSCAN_SIDECAR_IMAGE": "registry.example.org/skyscan:9.9.9",
        "SKYSCAN_SCANNER_SERVICE_ACCOUNT": "prod-skyscan-scanner",
        "SKYSCAN_OIDC_ISSUERS": EVERYTHING["oidc"]["issuers"],
        "SKYSCAN_WMS_ADDRESS": "https://wms.example.org",
        "SKYSCAN_PRESIGN_KEY_FILE": "/etc/skyscan/presign/key",
    }
    token_rule = next(r for r in find(docs, "Role", "prod-skyscan-operator")["rules"] if "resourceNames" in r)
    assert token_rule["resourceNames"] == ["prod-skyscan-scanner"]
    # Authentication off (local use only) needs no credentials.
    off = template("--set", "tokens.secretName=", "--set", "settings.SKYSCAN_AUTH_DISABLED=true")
    assert settings_data(off)["SKYSCAN_AUTH_DISABLED"] is True
    # A settings change rolls both Deployments.
    changed = template("--set", "settings.SKYSCAN_LOG_LEVEL=WARNING")
    default = template()
    for name in ("skyscan-operator", "skyscan-shim"):
        checksums = [
            find(d, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]["checksum/settings"]
            for d in (changed, default)
        ]
        assert checksums[0] != checksums[1]


def test_the_shim_serves_tls_with_a_certificate_for_its_service_that_scanners_trust() -> None:
    """Scanners send the shim their bearer token: the chart's default is HTTPS, with a CA of its own
    that the operator mounts into scanner Pods (and nothing else they would trust for the shim)."""
    docs = template(namespace="ops", release="prod")
    settings = settings_data(docs)
    assert settings["SKYSCAN_REST_ADDRESS"] == "https://prod-skyscan-shim.ops.svc:8080"
    assert settings["SKYSCAN_REST_CA_CONFIGMAP"] == "prod-skyscan-shim-ca"
    secret = find(docs, "Secret", "prod-skyscan-shim-tls")
    ca_pem = find(docs, "ConfigMap", "prod-skyscan-shim-ca")["data"]["ca.crt"]
    assert base64.b64decode(secret["data"]["ca.crt"]).decode() == ca_pem
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "prod-skyscan-shim.ops.svc" in names and "prod-skyscan-shim.ops.svc.cluster.local" in names
    shim = pod_spec(find(docs, "Deployment", "prod-skyscan-shim"))["containers"][0]
    env = {e["name"]: e.get("value") for e in shim["env"]}
    assert env["SKYSCAN_TLS_CERT_FILE"] == "/etc/skyscan/tls/tls.crt"
    assert (
        shim["readinessProbe"]["httpGet"]["scheme"] == shim["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    )
    # Readiness follows the Scan watch; liveness only the process (an API-server outage restarts no shim).
    assert (shim["readinessProbe"]["httpGet"]["path"], shim["livenessProbe"]["httpGet"]["path"]) == (
        "/healthz",
        "/livez",
    )
    plain = template("--set", "shim.tls.enabled=false")
    assert settings_data(plain)["SKYSCAN_REST_ADDRESS"] == "http://skyscan-shim.skyscan.svc:8080"
    assert not [d for d in plain if d["kind"] == "Secret"]


def test_the_scanner_network_policy_selects_the_operators_scanner_pods_and_lets_them_reach_the_shim(
    tmp_path: Path,
) -> None:
    docs = template("--values", values_file(tmp_path, EVERYTHING), release="prod", namespace="ops")
    policy = find(docs, "NetworkPolicy", "prod-skyscan-scanner")["spec"]
    scanner = scanner_job.build_job(
        "s1", "uid", "ops", model.ScanSpec.model_validate(minimal_spec()), OperatorSettings()
    )
    pod_labels = scanner["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []  # nothing reaches them
    shim, wms, dns = policy["egress"]
    shim_pod = find(docs, "Deployment", "prod-skyscan-shim")["spec"]["template"]
    assert shim["to"][0]["podSelector"]["matchLabels"].items() <= shim_pod["metadata"]["labels"].items()
    assert shim["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"name": "http", "containerPort": 8080} in shim_pod["spec"]["containers"][0]["ports"]
    assert (wms["to"], wms["ports"]) == (
        EVERYTHING["networkPolicy"]["wms"]["to"],
        [{"port": 8081, "protocol": "TCP"}],
    )
    assert {p["port"] for p in dns["ports"]} == {53} and dns["to"] == EVERYTHING["networkPolicy"]["dns"]["to"]
    off = template("--set", "networkPolicy.enabled=false")
    assert not [d for d in off if d["kind"] == "NetworkPolicy"]


def test_the_chart_renders_what_the_kustomize_manifests_hold() -> None:
    """The manifests are the chart without TLS (they make no certificate; README, "Deploy")."""
    chart, manifests = template("--include-crds", "--set", "shim.tls.enabled=false"), kustomized()
    names = sorted((d["kind"], d["metadata"]["name"]) for d in chart)
    assert names == sorted((d["kind"], d["metadata"]["name"]) for d in manifests)
    for kind, name in names:
        ours, theirs = find(chart, kind, name), find(manifests, kind, name)
        if kind in ("Role", "ClusterRole"):
            assert ours["rules"] == theirs["rules"], name
        elif kind in ("RoleBinding", "ClusterRoleBinding"):
            assert (ours["roleRef"], ours["subjects"]) == (theirs["roleRef"], theirs["subjects"]), name
        elif kind == "Deployment":
            assert pod_spec(ours) == pod_spec(theirs), name
            assert ours["spec"].get("strategy") == theirs["spec"].get("strategy"), name
            assert ours["spec"]["replicas"] == theirs["spec"]["replicas"], name
        elif kind == "ServiceAccount":
            assert ours.get("automountServiceAccountToken") == theirs.get("automountServiceAccountToken")
        elif kind == "Service":
            assert ours["spec"]["ports"] == theirs["spec"]["ports"]
            assert ours["spec"].get("sessionAffinity") == theirs["spec"].get("sessionAffinity"), name
            pods = find(chart, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
            assert ours["spec"]["selector"].items() <= pods.items()
        elif kind == "NetworkPolicy":
            assert ours["spec"] == theirs["spec"], name
        elif kind == "CustomResourceDefinition":
            assert ours["spec"] == theirs["spec"] == yaml.safe_load(crd.render())["spec"]
    # The chart states two settings the manifests leave at their defaults (the same values).
    derived = {
        "SKYSCAN_SCANNER_SERVICE_ACCOUNT": "skyscan-scanner",
        "SKYSCAN_SIDECAR_IMAGE": "ghcr.io/skyscan/skyscan:0.1.0",
    }
    assert settings_data(chart) == settings_data(manifests) | derived
    assert (CHART / "crds" / crd.CRD_FILE.name).read_text() == crd.render(), "run `make crds`"


@pytest.mark.timeout(240)
async def test_the_api_server_accepts_the_chart(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    for release, extra in (("skyscan", []), ("prod", ["--values", str(values_file(tmp_path, EVERYTHING))])):
        docs = await asyncio.to_thread(
            template, "--include-crds", *extra, release=release, namespace=namespace
        )
        done = await asyncio.to_thread(
            run, KUBECTL, "--kubeconfig", cluster.kubeconfig, "apply", "--dry-run=server", "-f", "-",
            stdin=yaml.safe_dump_all(docs),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("(server dry run)") == len(docs), done.stdout
    # The README's CRD upgrade, over the CRD the cluster has.
    done = await asyncio.to_thread(
        run, KUBECTL, "--kubeconfig", cluster.kubeconfig, "apply", "--server-side", "--force-conflicts",
        "--dry-run=server", "-f", CHART / "crds",
    )  # fmt: skip
    assert done.returncode == 0 and "serverside-applied (server dry run)" in done.stdout, done.stderr
