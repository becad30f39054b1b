"""Pure builders for what a scan needs outside the Scan: the WMS workflow request, the scanner's
WMS-connection Secret and the scanner-server Job (reference notes §9, wms-and-scanner A.3)."""

from __future__ import annotations

import base64
import json
import math
from typing import Any, NamedTuple

from skyscan import model, names, presign
from skyscan.scanner_args import COMMON_SPACE, scanner_server_argv
from skyscan_operator.settings import OperatorSettings

EWMS_MOUNT = "/etc/skyscan-ewms"
EWMS_FILE = "ewms.json"
TO_CLIENT, FROM_CLIENT = "to-client-queue", "from-client-queue"
CONDOR_REQUIREMENTS = "HAS_CVMFS_icecube_opensciencegrid_org && has_avx && has_avx2"
SIDECAR_CONTAINER = "startup-sidecar"
STARTUP_JSON = f"{COMMON_SPACE}/startup.json"  # where the scanner writes it (`--client-startup-json`)


def credential_lifetime(settings: OperatorSettings) -> int:
    """Seconds the scanner's token is asked to live: its whole possible run, plus an hour. The API
    server may grant less (`--service-account-max-token-expiration`); status records what it granted."""
    return int(settings.start_timeout_seconds + settings.job_active_deadline_seconds + 3600)


def credential_secret(scan_id: str, uid: str, namespace: str, token: str | None = None) -> dict[str, Any]:
    """The per-scan Secret the scanner's token is bound to; the token is written into it once issued."""
    data = {names.SCANNER_TOKEN_KEY: token} if token is not None else None
    return scan_secret(names.scanner_token_secret_name(scan_id), scan_id, uid, namespace, data)


def scan_secret(
    name: str, scan_id: str, uid: str, namespace: str, data: dict[str, str] | None
) -> dict[str, Any]:
    """A Secret of one scan, owned by its Scan; `data` as text (sent base64, as the API stores it: a
    server-side apply of `stringData` would leave its manager owning a field the API server never keeps)."""
    encoded = {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}} if data else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": child_labels(scan_id),
            "ownerReferences": [names.owner_reference(scan_id, uid)],
        },
        "type": "Opaque",
        **encoded,
    }


def token_request(secret_name: str, secret_uid: str, lifetime_seconds: int) -> dict[str, Any]:
    """A TokenRequest for the scanner ServiceAccount, valid only for the shim and only while the
    per-scan Secret exists."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [names.SCANNER_TOKEN_AUDIENCE],
            "expirationSeconds": lifetime_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret_name, "uid": secret_uid},
        },
    }


def child_labels(scan_id: str) -> dict[str, str]:
    """An explicit label set (the Scan's own labels are deliberately not copied)."""
    return {**names.SCANNER_LABELS, names.SCAN_ID_LABEL: scan_id}


def startup_url_lifetime(settings: OperatorSettings) -> int:
    """Seconds a worker's startup.json URL stays valid from the workflow request: the scanner's whole
    possible life (its Job is created within the start timeout and runs at most activeDeadlineSeconds)."""
    return int(settings.start_timeout_seconds + settings.job_active_deadline_seconds)


def startup_url(scan_id: str, settings: OperatorSettings, now: float | None) -> str:
    """Where the workers' init command fetches startup.json: presigned when a key is configured
    (expiring `startup_url_lifetime` after `now`), else the plain URL, which the shim refuses."""
    rest_address = settings.rest_address.rstrip("/")
    location = settings.startup_json_url.format(rest_address=rest_address, scan_id=scan_id)
    if settings.presign_key is None:
        return location
    if now is None:
        raise ValueError("a presigned startup.json URL needs the current time")
    expires = math.ceil(now) + startup_url_lifetime(settings)
    return presign.signed(location, settings.presign_key, scan_id, expires)


def workflow_request(
    scan_id: str, uid: str, spec: model.ScanSpec, settings: OperatorSettings, now: float | None = None
) -> dict[str, Any]:
    """The POST /v1/workflows body (A.3). EWMS makes one taskforce per location, each with the first
    cluster's count, as the reference does. `uid` is the marker a restart looks the workflow up by.
    The workers' init command fetches startup.json through `startup_url` (signed at `now`)."""
    locations: list[str] = []
    for cluster in spec.request_clusters:
        name = settings.wms_cluster(cluster.location)
        if name not in locations:  # the WMS rejects duplicates
            locations.append(name)
    image = f"{settings.task_image_prefix}{spec.docker_tag}"
    startup = startup_url(scan_id, settings, now)
    environment: dict[str, Any] = {
        "EWMS_PILOT_TASK_TIMEOUT": spec.max_pixel_reco_time,
        "EWMS_PILOT_QUARANTINE_TIME": spec.max_pixel_reco_time,
        "EWMS_PILOT_INIT_TIMEOUT": 1801,
        "EWMS_PILOT_CONTAINER_DEBUG": "True",
        "EWMS_PILOT_INFILE_EXT": ".json",
        "EWMS_PILOT_OUTFILE_EXT": ".json",
        names.WORKFLOW_MARKER_ENV: uid,
    }
    if settings.pilot_timeout_queue_incoming is not None:
        environment["EWMS_PILOT_TIMEOUT_QUEUE_INCOMING"] = settings.pilot_timeout_queue_incoming
    if model.DebugMode.CLIENT_LOGS in spec.debug_mode:
        environment["EWMS_PILOT_DUMP_TASK_OUTPUT"] = "True"
    return {
        "public_queue_aliases": [TO_CLIENT, FROM_CLIENT],
        "tasks": [
            {
                "cluster_locations": locations,
                "input_queue_aliases": [TO_CLIENT],
                "output_queue_aliases": [FROM_CLIENT],
                "task_image": image,
                "task_args": (
                    "python -m skymap_scanner.client --infile {{INFILE}} --outfile {{OUTFILE}} "
                    "--client-startup-json {{DATA_HUB}}/startup.json"
                ),
                "init_image": image,
                # The reference's command, plus retries: the workers may start before the scanner's
                # sidecar uploaded startup.json (404 until then); the pilot's init timeout bounds it.
                "init_args": (
                    'bash -c "curl --fail-with-body --max-time 1800 --retry 170 --retry-delay 10 '
                    "--retry-all-errors -o {{DATA_HUB}}/startup.json "
                    f"'{startup}'\""
                ),
                "n_workers": spec.request_clusters[0].n_workers,
                "pilot_config": {
                    "tag": "latest",
                    "image_source": "auto",
                    "environment": environment,
                    "input_files": [],
                },
                "worker_config": {
                    "do_transfer_worker_stdouterr": True,
                    "max_worker_runtime": settings.max_worker_runtime_seconds,
                    "n_cores": 1,
                    "priority": spec.priority,
                    "worker_disk": spec.worker_disk_bytes,
                    "worker_memory": spec.worker_memory_bytes,
                    "condor_requirements": CONDOR_REQUIREMENTS,
                },
            }
        ],
    }


def ewms_connection(profiles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The scanner's `ewms.json` from the public mq-profiles; None until all are activated."""
    if not profiles or not all(p.get("is_activated") for p in profiles):
        return None
    by_alias = {p["alias"]: p for p in profiles}
    if not {TO_CLIENT, FROM_CLIENT} <= by_alias.keys():
        return None
    keys = ("auth_token", "broker_type", "broker_address")
    return {
        side: {"name": by_alias[alias]["mqid"], **{k: by_alias[alias][k] for k in keys}}
        for side, alias in (("toclient", TO_CLIENT), ("fromclient", FROM_CLIENT))
    }


def build_secret(scan_id: str, uid: str, namespace: str, connection: dict[str, Any]) -> dict[str, Any]:
    """The scanner's WMS connection (`ewms.json`), mounted into its Pod."""
    data = {EWMS_FILE: json.dumps(connection)}
    return scan_secret(names.wms_secret_name(scan_id), scan_id, uid, namespace, data)


def scanner_auth_env(scan_id: str) -> dict[str, Any]:
    """The scanner's bearer token, read once at its start, from its own per-scan Secret."""
    secret = {"name": names.scanner_token_secret_name(scan_id), "key": names.SCANNER_TOKEN_KEY}
    return {"name": "SKYSCAN_SKYDRIVER_AUTH", "valueFrom": {"secretKeyRef": secret}}


REST_CA_MOUNT = "/etc/skyscan/rest-ca"


class Trust(NamedTuple):
    env: list[dict[str, Any]]
    mounts: list[dict[str, Any]]


def rest_trust(settings: OperatorSettings) -> Trust:
    """The env and volume mounts with which a scanner Pod's containers trust only the shim's CA (none
    without `rest_ca_configmap`): Python's ssl, httpx and requests read these two variables."""
    if settings.rest_ca_configmap is None:
        return Trust([], [])
    ca = f"{REST_CA_MOUNT}/ca.crt"
    env = [{"name": "SSL_CERT_FILE", "value": ca}, {"name": "REQUESTS_CA_BUNDLE", "value": ca}]
    return Trust(env, [{"name": "rest-ca", "mountPath": REST_CA_MOUNT, "readOnly": True}])


# A container as the restricted Pod Security profile asks (the sidecar's always, the scanner's unless
# SKYSCAN_SCANNER_RESTRICTED is false).
def restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def sidecar_container(scan_id: str, settings: OperatorSettings, auth_env: dict[str, Any]) -> dict[str, Any]:
    """The native sidecar (Kubernetes >= 1.29: an init container that keeps running) uploading the
    scanner's startup.json with the scanner's own credential (`auth_env`), for the workers to fetch."""
    return {
        "name": SIDECAR_CONTAINER,
        "image": settings.sidecar_image,
        "restartPolicy": "Always",
        "command": ["skyscan-sidecar"],
        "args": [STARTUP_JSON],
        "env": [
            {"name": "SKYSCAN_SKYDRIVER_ADDRESS", "value": settings.rest_address},
            {"name": "SKYSCAN_SKYDRIVER_SCAN_ID", "value": scan_id},
            auth_env,
            *rest_trust(settings).env,
        ],
        "resources": {
            "limits": {"memory": "128Mi", "cpu": "0.1"},
            "requests": {"memory": "64Mi", "cpu": "0.05"},
        },
        "volumeMounts": [
            {"name": "common-space-volume", "mountPath": COMMON_SPACE, "readOnly": True},
            *rest_trust(settings).mounts,
        ],
        "securityContext": restricted(),
    }


def kube_literal(value: str) -> str:
    """`value` as Kubernetes passes it on: in a container's command, args and env values the kubelet
    expands `$(VAR)`, and `$$` is its escape for one `$`."""
    return value.replace("$", "$$")


def kube_literals(container: dict[str, Any]) -> dict[str, Any]:
    """`container` with every string the kubelet would expand escaped: its command, its args and its
    env values (a `valueFrom` is not expanded). Whatever a user wrote, a `$(VAR)` reaches the process as
    those characters, never as the value of VAR (the scanner's credential is one)."""
    keys: tuple[str, ...] = ("command", "args")
    escaped = {k: [kube_literal(a) for a in container[k]] for k in keys if k in container}
    env = [{**e, "value": kube_literal(e["value"])} if "value" in e else e for e in container.get("env", [])]
    return {**container, **escaped, **({"env": env} if "env" in container else {})}


def env_value(value: model.Scalar) -> str:
    """Kubernetes env values are strings: like the reference, `str()` of the user's value."""
    return str(value)


def user_env(spec: model.ScanSpec, settings: OperatorSettings) -> tuple[dict[str, str], list[str]]:
    """The user's variables the scanner gets, and the names it does not: a Scan made with kubectl
    skips the REST validation, so the allow-list (`model.scanner_env_allowed`) holds here too."""
    given = spec.scanner_server_env_from_user
    refused = [k for k in given if not model.scanner_env_allowed(k, settings.scanner_env_allowed)]
    return {k: env_value(v) for k, v in given.items() if k not in refused}, refused


def scanner_env(scan_id: str, spec: model.ScanSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The scanner container's env: Skyscan's own variables, after the user's allowed ones, which never
    replace one of them."""
    env: list[dict[str, Any]] = [
        {"name": "SKYSCAN_EWMS_JSON", "value": f"{EWMS_MOUNT}/{EWMS_FILE}"},
        {"name": "SKYSCAN_SKYDRIVER_ADDRESS", "value": settings.rest_address},
        {"name": "SKYSCAN_SKYDRIVER_SCAN_ID", "value": scan_id},
        *({"name": k, "value": v} for k, v in settings.scanner_env.items()),
        {"name": "SKYSCAN_EWMS_PILOT_LOG", "value": "WARNING"},
        {"name": "SKYSCAN_MQ_CLIENT_LOG", "value": "WARNING"},
        scanner_auth_env(scan_id),
        *rest_trust(settings).env,
    ]
    ours = {e["name"] for e in env}
    return [{"name": k, "value": v} for k, v in user_env(spec, settings)[0].items() if k not in ours] + env


def build_job(
    scan_id: str, uid: str, namespace: str, spec: model.ScanSpec, settings: OperatorSettings
) -> dict[str, Any]:
    name = names.job_name(scan_id)
    labels = child_labels(scan_id)
    annotations = {"argocd.argoproj.io/sync-options": "Prune=false"}
    if settings.argocd_app_name:
        annotations["argocd.argoproj.io/tracking-id"] = (
            f"{settings.argocd_app_name}:batch/Job:{namespace}/{name}"
        )
    memory = str(spec.scanner_server_memory_bytes)
    scanner: dict[str, Any] = {
        "name": names.container_name(scan_id),
        "image": f"{settings.scanner_image}:{spec.docker_tag}",
        "command": [],
        "args": scanner_server_argv(spec),
        "env": scanner_env(scan_id, spec, settings),
        "resources": {
            "limits": {"memory": memory, "cpu": "1.0"},
            "requests": {
                "memory": memory,
                "cpu": "0.1",
                **({"ephemeral-storage": eph} if (eph := settings.scanner_ephemeral_storage) else {}),
            },
        },
        "volumeMounts": [
            {"name": "common-space-volume", "mountPath": COMMON_SPACE},
            {"name": "ewms", "mountPath": EWMS_MOUNT, "readOnly": True},
            *rest_trust(settings).mounts,
            *([{"name": "tmp", "mountPath": "/tmp"}] if settings.scanner_restricted else []),
        ],
        **({"securityContext": restricted()} if settings.scanner_restricted else {}),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [
            {"name": "common-space-volume", "emptyDir": {}},
            *([{"name": "tmp", "emptyDir": {}}] if settings.scanner_restricted else []),
            {"name": "ewms", "secret": {"secretName": names.wms_secret_name(scan_id)}},
            *([{"name": "rest-ca", "configMap": {"name": ca}}] if (ca := settings.rest_ca_configmap) else []),
        ],
        "initContainers": [kube_literals(sidecar_container(scan_id, settings, scanner_auth_env(scan_id)))],
        "containers": [kube_literals(scanner)],
    }
    # The scanner reaches nothing in the API: an account with no bindings, and no API token mounted.
    pod_spec["serviceAccountName"] = settings.scanner_service_account
    pod_spec["automountServiceAccountToken"] = False
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [names.owner_reference(scan_id, uid)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.job_active_deadline_seconds,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds_after_finished,
            "template": {
                "metadata": {"labels": labels, "annotations": dict(settings.scanner_pod_annotations)},
                "spec": pod_spec,
            },
        },
    }
