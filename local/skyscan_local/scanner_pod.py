"""The scanner simulator's settings, and a held scanner Pod as its server process would see it: its
environment and arguments as the kubelet expands them (the token from the Secret the Job references),
its paths mapped into a directory of the simulator's, and its startup.json sidecar."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from skyscan.io import kube
from skyscan.scanner_args import COMMON_SPACE
from skyscan_local import control_plane as localcluster
from skyscan_local import scanner_report


class ScannerSimSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SKYSCAN_SCANNER_SIM_", extra="ignore")

    namespace: str = Field(default="skyscan", description="Namespace whose scanner Pods are played.")
    kubeconfig: str | None = Field(default=None, description="Unset: in-cluster, else ~/.kube/config.")
    rest_address: str | None = Field(
        default=None, description="Overrides the Pod's SKYSCAN_SKYDRIVER_ADDRESS (unset: use the Pod's)."
    )
    token: str | None = Field(
        default=None, description="REST token when the Pod's SKYSCAN_SKYDRIVER_AUTH is empty."
    )
    startup_seconds: float = Field(default=1.0, ge=0, description="Simulated event extraction.")
    reco_seconds: float = Field(default=0.4, gt=0, description="A batch of pixels finishes per this long.")
    batches_per_nside: int = Field(
        default=6, ge=1, description="An nside's pixels (768 at nside 8, ...) finish in this many batches."
    )
    position_variations: int = Field(default=7, ge=1, description="Recos per pixel.")
    progress_interval_seconds: float = Field(default=2.0, gt=0, description="SKYSCAN_PROGRESS_INTERVAL_SEC.")
    result_interval_seconds: float = Field(default=4.0, gt=0, description="SKYSCAN_RESULT_INTERVAL_SEC.")
    workforce_poll_seconds: float = Field(default=1.0, gt=0, description="Worker wait poll (real: 30 s).")
    kill_switch_seconds: float = Field(default=2.0, gt=0, description="Kill-switch poll (real: 300 s).")
    request_timeout_seconds: float = Field(default=10.0, gt=0, description="Timeout of one REST call.")
    urgent_retry_seconds: float = Field(
        default=60.0, ge=0, description="How long urgent calls retry on 5xx/408/429/connection errors."
    )
    sidecar_settle_seconds: float = Field(
        default=0.3,
        gt=0,
        description="The sidecar's --settle-seconds (real: 1 s); it polls 5 times as often.",
    )
    sidecar_restart_seconds: float = Field(
        default=1.0, gt=0, description="A failed sidecar is restarted after this long (the kubelet: 10 s+)."
    )


class ScannerExit(Exception):
    """The simulated server process ends with this exit code."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass(frozen=True)
class Sidecar:
    """The Pod's startup.json sidecar, as the kubelet would run it (paths mapped, secrets resolved)."""

    args: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class ServerPod:
    """What the scanner server would see inside its Pod."""

    pod_name: str
    uid: str
    address: str
    scan_id: str
    token: str
    args: scanner_report.ServerArgs
    startup_json: Path  # where it writes startup.json (its `--client-startup-json`, mapped)
    sidecar: Sidecar | None  # None: the Pod has no sidecar (a Job made before the hand-off existed)


def is_playable(pod: dict[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    held = localcluster.HOLD_ANNOTATION in (meta.get("annotations") or {})
    return held and status.get("phase") == "Running" and not meta.get("deletionTimestamp")


def kubelet_expand(value: str, env: dict[str, str]) -> str:
    """`value` as the kubelet hands it to a process (command, args, env values): `$(VAR)` becomes VAR's
    value when `env` defines it (else stays as written), `$$` becomes `$`, any other `$` stays."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
        elif value[i + 1] == "$":
            out.append("$")
            i += 2
        elif value[i + 1] == "(" and (end := value.find(")", i + 2)) != -1:
            name = value[i + 2 : end]
            out.append(env.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append(value[i : i + 2])
            i += 2
    return "".join(out)


async def container_env(
    api: kube.Kube, namespace: str, container: dict[str, Any], secrets: dict[str, dict[str, str]]
) -> dict[str, str]:
    """A container's env as its process sees it: plain values (expanded with the variables before
    them, as the kubelet does), and `secretKeyRef`s resolved by reading the Secret with the simulator's
    own (admin) client."""
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = kubelet_expand(e["value"] or "", env)
        elif ref := (e.get("valueFrom") or {}).get("secretKeyRef"):
            if ref["name"] not in secrets:
                secret = await api.request("GET", kube.core_path("secrets", namespace, ref["name"]))
                secrets[ref["name"]] = secret.get("data") or {}
            env[e["name"]] = base64.b64decode(secrets[ref["name"]].get(ref["key"], "")).decode()
    return env


def local_path(path: str, workdir: Path) -> Path:
    """A path in the Pod's shared volume, inside this Pod's own directory on this machine."""
    inside = Path(path)
    return workdir / inside.relative_to(COMMON_SPACE) if inside.is_relative_to(COMMON_SPACE) else inside


def option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args[:-1] else default


async def read_server_pod(
    api: kube.Kube, namespace: str, pod: dict[str, Any], settings: ScannerSimSettings, workdir: Path
) -> ServerPod:
    container = pod["spec"]["containers"][0]
    secrets: dict[str, dict[str, str]] = {}
    env = await container_env(api, namespace, container, secrets)
    address = (settings.rest_address or env["SKYSCAN_SKYDRIVER_ADDRESS"]).rstrip("/")
    token = env.get("SKYSCAN_SKYDRIVER_AUTH") or settings.token or ""
    args = [kubelet_expand(a, env) for a in container.get("args") or []]
    sidecar = None
    native = [c for c in pod["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    if native:
        sidecar_env = await container_env(api, namespace, native[0], secrets)
        sidecar_env["SKYSCAN_SKYDRIVER_ADDRESS"] = address
        sidecar_env["SKYSCAN_SKYDRIVER_AUTH"] = sidecar_env.get("SKYSCAN_SKYDRIVER_AUTH") or token
        sidecar_args = [kubelet_expand(a, sidecar_env) for a in native[0]["args"]]
        mapped = [str(local_path(a, workdir)) if a.startswith(COMMON_SPACE) else a for a in sidecar_args]
        sidecar = Sidecar(args=mapped, env=sidecar_env)
    return ServerPod(
        pod_name=pod["metadata"]["name"],
        uid=pod["metadata"]["uid"],
        address=address,
        scan_id=env["SKYSCAN_SKYDRIVER_SCAN_ID"],
        token=token,
        args=scanner_report.parse_server_args(args),
        startup_json=local_path(
            option(args, "--client-startup-json", f"{COMMON_SPACE}/startup.json"), workdir
        ),
        sidecar=sidecar,
    )
