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
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from api_shim.settings import ShimSettings
from skyscan import crd, model
from skyscan_local import chart_schema, real_stack
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
    "oidc": {
        "issuers": [
            {"issuer": "https://kc.example.org/realms/r", "audience": "skyscan", "names": "reference"}
        ],
        "dashboard": {
            "issuer": "https://kc.example.org/realms/r",
            "clientId": "skyscan-dashboard",
            "scopes": "openid profile email",
        },
    },
    "wms": {"address": "https://wms.example.org", "oidcIssuer": "", "credentialsSecret": "wms-client"},
    "archive": {"dsnSecret": "archive-dsn", "adminDsnSecret": "archive-admin"},
    "presignKey": {"secretName": "presign"},
    "tokens": {"secretName": ""},
    "networkPolicy": {
        "enabled": True,
        "wms": {
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ewms"}}}],
            "ports": [{"port": 8081, "protocol": "TCP"}],
        },
        "dns": {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]},
        "shim": {"enabled": True, "from": [{"namespaceSelector": {"matchLabels": {"ingress": "yes"}}}]},
        "operator": {
            "enabled": True,
            "apiServer": {"to": [{"ipBlock": {"cidr": "192.0.2.1/32"}}], "ports": [{"port": 6443}]},
            "archive": {"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}], "ports": [{"port": 5433}]},
            "extraEgress": [{"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"port": 443}]}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}],
        },
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
    (the chart rolls the Pods with a checksum annotation instead)."""
    done = run(KUBECTL, "kustomize", REPO / "manifests")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
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
        ({"networkPolicy": {"wms": {"ports": [{"port": "Not_A_Port"}]}}}, "/networkPolicy/wms/ports/0/port"),
        (
            {"networkPolicy": {"wms": {"to": [{"podSelector": {"matchLabels": {"a key?": "x"}}}]}}},
            "a key?",
        ),
        (  # an ipBlock cannot be narrowed by a selector
            {"networkPolicy": {"shim": {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}}},
            "/networkPolicy/shim/from/0",
        ),
        # The operator's policy without the API server's address would cut the operator off from it.
        ({"networkPolicy": {"operator": {"enabled": True}}}, "/networkPolicy/operator/apiServer/to"),
        (
            {
                "networkPolicy": {
                    "operator": {"enabled": True, "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}}
                }
            },
            "networkPolicy.operator.archive.to",
        ),
        # Settings: only those the operator and the shim read (the schema is generated from them), each
        # with a value they can parse.
        ({"settings": {"NOT_A_SETTING": 1}}, "NOT_A_SETTING"),
        ({"settings": {"SKYSCAN_NOT_A_SETTING": 1}}, "SKYSCAN_NOT_A_SETTING"),
        ({"settings": {"SKYSCAN_HOST": "127.0.0.1"}}, "SKYSCAN_HOST"),  # the shim's probes need the Pod's
        ({"settings": {"SKYSCAN_WORKERS": "four"}}, "/settings/SKYSCAN_WORKERS"),
        ({"settings": {"SKYSCAN_WORKERS": 0}}, "/settings/SKYSCAN_WORKERS"),  # at least 1
        ({"settings": {"SKYSCAN_BACKLOG_TICK_SECONDS": 0}}, "/settings/SKYSCAN_BACKLOG_TICK_SECONDS"),
        ({"settings": {"SKYSCAN_LOG_FORMAT": "xml"}}, "/settings/SKYSCAN_LOG_FORMAT"),
        ({"settings": {"SKYSCAN_SCANNER_RESTRICTED": "maybe"}}, "/settings/SKYSCAN_SCANNER_RESTRICTED"),
        ({"settings": {"SKYSCAN_KNOWN_CLUSTERS": {"osg": "many"}}}, "/settings/SKYSCAN_KNOWN_CLUSTERS/osg"),
        ({"settings": {"SKYSCAN_TAGS": "4.0.0"}}, "/settings/SKYSCAN_TAGS"),  # a list, or a JSON one
        # Every container keeps requests and a memory limit; quantities are quantities.
        ({"operator": {"resources": {"limits": None}}}, "limits"),
        ({"shim": {"resources": {"requests": {"cpu": "lots"}}}}, "/shim/resources/requests/cpu"),
        ({"shim": {"resources": {"requests": {"gpu": 1}}}}, "gpu"),
        ({"image": {"repository": "Not An Image"}}, "/image/repository"),
        ({"image": {"tag": "1.0:latest"}}, "/image/tag"),
        ({"shim": {"service": {"clusterIP": "auto"}}}, "/shim/service/clusterIP"),
        ({"tokens": {"secretName": ""}}, "the shim needs people's credentials"),
        # The dashboard logs people in only where the shim verifies their tokens.
        (
            {"oidc": {"dashboard": {"issuer": "https://kc.example.org/realms/r", "clientId": "d"}}},
            "oidc.dashboard.issuer https://kc.example.org/realms/r is not one of oidc.issuers",
        ),
        (
            {
                "oidc": {
                    "issuers": [{"issuer": "https://kc.example.org/realms/r", "audience": "skyscan"}],
                    "dashboard": {"issuer": "https://kc.example.org/realms/r"},
                }
            },
            "oidc.dashboard.clientId",
        ),
        ({"oidc": {"dashboard": {"issuer": "kc.example.org"}}}, "/oidc/dashboard/issuer"),
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
    # The admin login reaches the archive-role hook Job alone, which makes the DSN's role.
    hook = find(docs, "Job", "prod-skyscan-archive-role")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = hook["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["skyscan-archive-role"]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {
        "SKYSCAN_ARCHIVE_ADMIN_DSN": "archive-admin",
        "SKYSCAN_ARCHIVE_DSN": "archive-dsn",
    }
    assert not any("archive-admin" in json.dumps(d) for d in docs if d is not hook)
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
        "SKYSCAN_UI_OIDC_ISSUER": "https://kc.example.org/realms/r",
        "SKYSCAN_UI_OIDC_CLIENT_ID": "skyscan-dashboard",
        "SKYSCAN_UI_OIDC_SCOPES": "openid profile email",
        "SKYSCAN_WMS_ADDRESS": "https://wms.example.org",
        "SKYSCAN_PRESIGN_KEY_FILE": "/etc/skyscan/presign/key",
    }
    rules = find(docs, "Role", "prod-skyscan-operator")["rules"]
    token_rule = next(r for r in rules if r["resources"] == ["serviceaccounts/token"])
    assert token_rule["resourceNames"] == ["prod-skyscan-scanner"]
    secrets_read = [r for r in rules if r["resources"] == ["secrets"] and "get" in r["verbs"]]
    assert [r["resourceNames"] for r in secrets_read] == [["skyscan-webhook-secrets"]]  # that one only
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
    # No Secret but the webhook signing secrets' (made empty: the shim writes its keys).
    secrets = [d for d in plain if d["kind"] == "Secret"]
    assert [(d["metadata"]["name"], d.get("data")) for d in secrets] == [("skyscan-webhook-secrets", None)]


def test_the_scanner_network_policy_selects_the_operators_scanner_pods_and_lets_them_reach_the_shim(
    tmp_path: Path,
) -> None:
    docs = template("--values", values_file(tmp_path, EVERYTHING), release="prod", namespace="ops")
    policy = find(docs, "NetworkPolicy", "prod-skyscan-scanner")["spec"]
    assert selects(policy["podSelector"], scanner_pod_labels())
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
    # The scanner policy selects no Pod of the shim or the operator (theirs are their own).
    for component in ("shim", "operator"):
        pod = find(docs, "Deployment", f"prod-skyscan-{component}")["spec"]["template"]["metadata"]
        assert not policy["podSelector"]["matchLabels"].items() <= pod["labels"].items(), component
    off = template("--set", "networkPolicy.enabled=false")
    assert [d["metadata"]["name"] for d in off if d["kind"] == "NetworkPolicy"] == [
        "skyscan-shim",
        "skyscan-operator",
    ]
    # The cluster's DNS only: kube-dns by default, never port 53 of any address.
    (default_dns,) = [r for r in find(template(), "NetworkPolicy", "skyscan-scanner")["spec"]["egress"]
                      if {p["port"] for p in r["ports"]} == {53}]  # fmt: skip
    assert default_dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]


def scanner_pod_labels() -> dict[str, str]:
    """The labels the operator puts on a scanner Pod, from the Job it builds."""
    job = scanner_job.build_job(
        "s1", "uid", "ops", model.ScanSpec.model_validate(minimal_spec()), OperatorSettings()
    )
    labels: dict[str, str] = job["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, selector  # the chart's own selectors use matchLabels only
    return bool(selector["matchLabels"].items() <= labels.items())


def test_the_shims_policy_lets_connections_reach_its_port_only(tmp_path: Path) -> None:
    docs = template(release="prod", namespace="ops")
    shim = find(docs, "Deployment", "prod-skyscan-shim")["spec"]["template"]
    policy = find(docs, "NetworkPolicy", "prod-skyscan-shim")["spec"]
    assert selects(policy["podSelector"], shim["metadata"]["labels"])
    assert not selects(policy["podSelector"], scanner_pod_labels())
    assert not selects(
        policy["podSelector"], {**shim["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
    )
    # Ingress only (its egress, to the API server, the archive and OIDC issuers, stays open), on the
    # port its container names, from anywhere by default.
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert {"name": "http", "containerPort": 8080} in shim["spec"]["containers"][0]["ports"]
    (rule,) = find(template_everything(tmp_path), "NetworkPolicy", "prod-skyscan-shim")["spec"]["ingress"]
    assert rule["from"] == EVERYTHING["networkPolicy"]["shim"]["from"]
    off = template("--set", "networkPolicy.shim.enabled=false")
    assert [d["metadata"]["name"] for d in off if d["kind"] == "NetworkPolicy"] == [
        "skyscan-scanner",
        "skyscan-operator",
    ]


def template_everything(tmp_path: Path) -> list[Doc]:
    return template("--values", values_file(tmp_path, EVERYTHING), release="prod", namespace="ops")


def test_the_operators_policy_when_enabled_lets_it_reach_what_it_needs_and_nothing_else(
    tmp_path: Path,
) -> None:
    docs = template_everything(tmp_path)
    np = EVERYTHING["networkPolicy"]
    operator = find(docs, "Deployment", "prod-skyscan-operator")["spec"]["template"]
    policy = find(docs, "NetworkPolicy", "prod-skyscan-operator")["spec"]
    assert selects(policy["podSelector"], operator["metadata"]["labels"])
    assert not selects(policy["podSelector"], scanner_pod_labels())
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # Only Prometheus, on the metrics port the container names (the kubelet's probes come from the node).
    assert policy["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": np["operator"]["metricsFrom"]}
    ]
    assert {"name": "metrics", "containerPort": 9090} in operator["spec"]["containers"][0]["ports"]
    api, wms, archive, dns, extra = policy["egress"]
    assert (api["to"], api["ports"]) == (np["operator"]["apiServer"]["to"], [{"port": 6443}])
    assert (wms["to"], wms["ports"]) == (np["wms"]["to"], np["wms"]["ports"])
    assert (archive["to"], archive["ports"]) == (np["operator"]["archive"]["to"], [{"port": 5433}])
    assert dns["to"] == np["dns"]["to"] and {p["port"] for p in dns["ports"]} == {53}
    assert extra == np["operator"]["extraEgress"][0]
    assert all(rule.get("to") for rule in policy["egress"] if rule is not dns)  # no rule opens every address
    # Without a WMS or an archive, no way to them.
    none = template(
        "--set", "networkPolicy.operator.enabled=true",
        "--set", "networkPolicy.operator.apiServer.to[0].ipBlock.cidr=10.0.0.1/32",
        "--set", "wms.address=", "--set", "archive.dsnSecret=",
    )  # fmt: skip
    rules = find(none, "NetworkPolicy", "skyscan-operator")["spec"]["egress"]
    assert [r.get("to") for r in rules] == [
        [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
        yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]["dns"]["to"],
    ]  # the API server, DNS
    # Not enabled: its ports only, no egress rule.
    policy = find(template(), "NetworkPolicy", "skyscan-operator")["spec"]
    assert policy["policyTypes"] == ["Ingress"] and "egress" not in policy
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]


def test_every_container_the_chart_runs_is_restricted_with_requests_and_limits(tmp_path: Path) -> None:
    for docs in (template(), template_everything(tmp_path)):
        for deployment in (d for d in docs if d["kind"] == "Deployment"):
            spec = deployment["spec"]["template"]["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in (*spec["containers"], *spec.get("initContainers", [])):
                where = f"{deployment['metadata']['name']}/{container['name']}"
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"], (
                    where
                )
                assert context["capabilities"] == {"drop": ["ALL"]}, where
                resources = container["resources"]
                assert {"cpu", "memory"} <= resources["requests"].keys() and "memory" in resources[
                    "limits"
                ], where


def test_the_settings_schema_takes_every_setting_the_components_read_and_they_read_it_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every setting the chart accepts at its default value (JSON for all but strings, as the chart
    passes it) reaches the settings ConfigMap in a form both components parse to that value; and so
    do the string spellings `make up NODE=real` gives (`"20"` for a number)."""
    defaults: Doc = {}
    for settings in (OperatorSettings, ShimSettings):
        for name, field in settings.model_fields.items():
            variable = chart_schema.PREFIX + name.upper()
            default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
            if variable not in chart_schema.CHART_OWNED and default is not None:
                defaults[variable] = str(default) if isinstance(default, Path | StrEnum) else default
    assert "SKYSCAN_SCANNER_RESTRICTED" in defaults and "SKYSCAN_MAX_EVENT_STREAMS" in defaults
    local = real_stack.chart_values()
    for values, expected in (
        (
            {"settings": defaults},
            {
                "workers": 4,
                "scanner_restricted": True,
                "known_clusters": {"osg": 100, "sub-2": 100, "local": 5},
            },
        ),
        (local, {"backlog_tick_seconds": 1.0, "image_pull_grace_seconds": 20.0, "queue_poll_seconds": 0.5}),
    ):
        data = settings_data(template("--values", values_file(tmp_path, values)))
        for variable in [v for v in os.environ if v.startswith(chart_schema.PREFIX)]:
            monkeypatch.delenv(variable)
        for variable, value in data.items():
            if variable not in ("SKYSCAN_PRESIGN_KEY_FILE", "SKYSCAN_TOKEN_FILE"):  # files the Pods mount
                monkeypatch.setenv(variable, value if isinstance(value, str) else json.dumps(value))
        read = {**OperatorSettings().model_dump(), **ShimSettings().model_dump()}
        assert {k: read[k] for k in expected} == expected
        for variable, value in values["settings"].items():
            name = variable.removeprefix(chart_schema.PREFIX).lower()
            if variable in defaults and value == defaults[variable] and name != "known_clusters":
                # A size (`str | int`) is read as the string spelling it, as its variable holds it.
                assert read[name] in (value, str(value)), variable


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
            # The chart's selectors also name the release (app.kubernetes.io/instance), the manifests'
            # cannot: each selects what it means to in its own rendering.
            mine, other = copy.deepcopy(ours["spec"]), copy.deepcopy(theirs["spec"])
            assert mine.pop("podSelector") and other.pop("podSelector")
            assert mine == other, name
            if name in ("skyscan-shim", "skyscan-operator"):
                for docs, policy in ((chart, ours), (manifests, theirs)):
                    pod = find(docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
                    assert selects(policy["spec"]["podSelector"], pod)
            else:
                assert ours["spec"]["podSelector"] == theirs["spec"]["podSelector"], name
        elif kind == "Namespace":  # the Pod Security labels
            pss = {k: v for k, v in ours["metadata"]["labels"].items() if k.startswith("pod-security")}
            assert pss and pss.items() <= theirs["metadata"]["labels"].items()
        elif kind.startswith("ValidatingAdmissionPolicy"):
            assert ours["spec"] == theirs["spec"], name
        elif kind == "CustomResourceDefinition":
            kind_of = {of.crd_name: of for of in crd.KINDS}
            assert ours["spec"] == theirs["spec"] == yaml.safe_load(crd.render(kind_of[name]))["spec"]
    # The chart states two settings the manifests leave at their defaults (the same values).
    derived = {
        "SKYSCAN_SCANNER_SERVICE_ACCOUNT": "skyscan-scanner",
        "SKYSCAN_SIDECAR_IMAGE": "ghcr.io/skyscan/skyscan:0.1.0",
    }
    assert settings_data(chart) == settings_data(manifests) | derived
    for of in crd.KINDS:
        assert (CHART / "crds" / of.file.name).read_text() == crd.render(of), "run `make crds`"


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
