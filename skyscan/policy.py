"""The rules a scan request is held to, whoever made its Scan (pure).

The REST shim checks a request as it normalises it (`api_shim.launch`, in the reference service's order
and words) and stores only what passes. A Scan made with kubectl skips the shim: the API server holds
it to the CRD schema only, which cannot see inside the free-form maps, nor know the deployment's tag
catalog, clusters or allow-list. So the operator holds such a spec to the same rules before it acts on
it (`refusal`): the Scan model with its request policies (not `model.STORED`'s leniency), then the
deployment's — the tag catalog and minimum, the scanner's env allow-list, the known cluster locations,
the workers one request may ask for at one location and, with `client-logs`, per cluster. Each refusal
names the field in the Scan's own terms (`spec.dockerTag`, `spec.requestClusters[0].nWorkers`).
What REST accepts passes here: its stored form is the normalised request (a resolved tag, sizes in bytes).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from skyscan import model, subscription
from skyscan.tags import DEFAULT_MIN_TAG, TagError, check_tag

# The shim's and the operator's defaults of the settings of the same names.
DEFAULT_KNOWN_CLUSTERS: dict[str, int | None] = {"osg": 100, "sub-2": 100, "local": 5}
DEFAULT_MAX_N_WORKERS = 10_000

# Spec fields that are maps: a path names their entry by its key (`spec.classifiers[rescan]`).
_MAPS = frozenset(
    f.alias for f in model.ScanSpec.model_fields.values() if typing.get_origin(f.annotation) is dict
)
_SENSOR_EVENT_ID = re.compile(model.SENSOR_EVENT_ID_PATTERN)


@dataclass(frozen=True)
class Policy:
    """A deployment's rules (the settings both components read alike), with the tag catalog as it is."""

    tags: Collection[str]
    min_tag: str
    scanner_env_allowed: Collection[str]  # names, or PREFIX*, besides the scanner's tuning variables
    known_clusters: Mapping[str, int | None]  # location -> most workers with client-logs (None: no cap)
    max_n_workers: int  # per request_clusters entry


class PolicySettings(BaseModel):
    """The deployment's request policy as both components read it: the shim's and the operator's
    settings classes take these fields (SKYSCAN_TAGS, ...) from here, so the two never disagree."""

    known_clusters: dict[str, int | None] = Field(
        default_factory=lambda: dict(DEFAULT_KNOWN_CLUSTERS),
        description="WMS cluster location -> max workers when debug_mode has client-logs (null: no cap); "
        "a scan asks for workers at these only.",
    )
    max_n_workers: int = Field(
        default=DEFAULT_MAX_N_WORKERS,
        ge=1,
        le=model.N_WORKERS_MAX,
        description="The most workers a request asks for at one cluster location (each request_clusters "
        f"entry of a scan, each add-workers request); refused beyond (REST: 400). At most "
        f"{model.N_WORKERS_MAX}, the Scan CRD's bound.",
    )
    tag_catalog_dir: Path | None = Field(
        default=None,
        description="CVMFS-style directory of images named skymap_scanner:<tag> (the shim and the operator "
        "read it: mount it in both).",
    )
    tags: list[str] = Field(
        default_factory=list,
        description="Extra known image tags (JSON list; the shim's and the operator's). The operator fails a "
        "Scan not yet started whose `dockerTag` is not exactly one of the catalog's (InvalidSpec).",
    )
    min_tag: str = Field(default=DEFAULT_MIN_TAG, description="Semver tags older than this are refused.")
    scanner_env_allowed: model.EnvAllowList = Field(
        default_factory=list,
        description="Names users may set in scanner_server_env_from_user besides the scanner's tuning "
        'variables (JSON list; an entry ending in `*` allows a prefix, e.g. `["OMP_*"]`; the shim and the '
        "operator read it: set both alike); reserved names stay refused. Another name is a 400 naming the "
        "variable, and fails a Scan made with kubectl (InvalidSpec).",
    )

    webhook_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts webhook receivers may be at (JSON list: names, or suffixes beginning with `.`); "
        "empty: no subscription is accepted. The shim refuses a subscription elsewhere (400); the operator "
        "delivers to nothing else.",
    )
    webhook_allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR, JSON list) a receiver's address may be in although it is not public; "
        "otherwise an address that is loopback, private, link-local (cloud metadata), reserved or "
        "multicast is refused when the operator connects, whatever name led to it.",
    )
    webhook_plain_http: bool = Field(
        default=False, description="Allow http:// receivers (a local receiver); else https only."
    )

    def webhook_destinations(self) -> subscription.Destinations:
        """Where deliveries may go (`skyscan.subscription.Destinations`)."""
        return subscription.destinations(
            self.webhook_allowed_hosts, self.webhook_allowed_networks, self.webhook_plain_http
        )

    def request_policy(self, catalog: Collection[str]) -> Policy:
        """The rules a Scan's spec is held to, with the tag catalog as it is now."""
        return Policy(
            tags=catalog,
            min_tag=self.min_tag,
            scanner_env_allowed=self.scanner_env_allowed,
            known_clusters=self.known_clusters,
            max_n_workers=self.max_n_workers,
        )


@dataclass(frozen=True)
class Refusal:
    """The first rule a spec breaks: where (`spec.<path>`, the wire names) and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location in a spec as a Kubernetes field path; a map entry is named by its key
    (what follows, a union's branch or `[key]`, is left out)."""
    path = "spec"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif i and loc[i - 1] in _MAPS:
            return f"{path}[{part}]"
        else:
            path += f".{part}"
    return path


def invalid(e: ValidationError) -> Refusal:
    """The first error of a spec's validation, as a refusal."""
    first = e.errors()[0]
    return Refusal(field_path(tuple(first["loc"])), first["msg"].removeprefix("Value error, "))


def refusal(spec: Mapping[str, Any], policy: Policy) -> Refusal | None:
    """The first rule of REST's that the wire-form `spec` breaks, or None when REST could have stored it."""
    try:
        parsed = model.ScanSpec.model_validate(spec)  # with its request policies: no `model.STORED`
    except ValidationError as e:
        return invalid(e)
    return breach(parsed, policy)


def breach(spec: model.ScanSpec, policy: Policy) -> Refusal | None:
    """The first of the deployment's rules a valid spec breaks, or None."""
    try:
        check_tag(spec.docker_tag, policy.tags, policy.min_tag)
    except TagError as e:
        return Refusal("spec.dockerTag", str(e))
    event_id = spec.sensor_event_id
    if len(event_id) > model.SENSOR_EVENT_ID_MAX_LENGTH or not _SENSOR_EVENT_ID.match(event_id):
        return Refusal(
            "spec.sensorEventId",
            f"'{event_id}' is not a sensor event id: lowercase letters, digits and '-', "
            f"at most {model.SENSOR_EVENT_ID_MAX_LENGTH}",
        )
    for name in spec.scanner_server_env_from_user:
        if not model.scanner_env_allowed(name, policy.scanner_env_allowed):
            return Refusal(
                f"spec.scannerServerEnvFromUser[{name}]",
                "not on the scanner's env allow-list (its tuning variables and SKYSCAN_SCANNER_ENV_ALLOWED)",
            )
    known = policy.known_clusters
    client_logs = model.DebugMode.CLIENT_LOGS in spec.debug_mode
    for i, cluster in enumerate(spec.request_clusters):
        where = f"spec.requestClusters[{i}]"
        if cluster.location not in known:
            return Refusal(
                f"{where}.location",
                f"unknown cluster '{cluster.location}' (available: {', '.join(known)})",
            )
        most = policy.max_n_workers
        if cluster.n_workers > most:
            return Refusal(f"{where}.nWorkers", f"must be no more than {most} (SKYSCAN_MAX_N_WORKERS)")
        cap = known[cluster.location]
        if client_logs and cap is not None and cluster.n_workers > cap:
            why = f"must be no more than {cap}: cluster '{cluster.location}' with debugMode client-logs"
            return Refusal(f"{where}.nWorkers", why)
    return None
