"""POST /scan: from a validated request body to the normalised `ScanSpec` (pure).

Checks run in the reference service's order so the first failure a client sees is the same:
deprecated `memory`, image tag, sizes, classifiers, clusters, the event xor rule, debug caps.
A canonical field wins over its deprecated alias whenever it is given (not None).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api_shim.errors import ApiError, bad_request
from api_shim.rest_models import ScanRequestBody, validation_reason
from api_shim.sizes import InvalidSize, SizeTooLarge, parse_size
from skyscan.manifest import finite
from skyscan.model import (
    INTEGER_MAX,
    N_WORKERS_MAX,
    RESERVED_CLASSIFIER_KEYS,
    DebugMode,
    ScanSpec,
    scanner_env_allowed,
)
from skyscan.tags import TagError, resolve_tag

# The largest normalised scan request a Scan holds, as JSON: the largest valid one (25 environment
# variables of 4096 characters) is about 110 KB; etcd caps the whole object near 1.5 MiB.
SPEC_MAX_BYTES = 256 * 1024
# Request fields the spec takes as they are (those normalise() computes override them): a field added
# to both models needs no line here.
_AS_GIVEN = tuple(ScanSpec.model_fields.keys() & ScanRequestBody.model_fields.keys())


@dataclass(frozen=True)
class Defaults:
    scanner_server_memory: str | int
    worker_memory: str | int
    worker_disk: str | int
    known_clusters: Mapping[str, int | None]
    min_tag: str
    scanner_env_allowed: frozenset[str]  # names (or PREFIX*) users may set besides the scanner's tuning ones
    max_n_workers: int = N_WORKERS_MAX  # per cluster entry (the Scan CRD's bound is the most it can be)


@dataclass(frozen=True)
class Launch:
    spec: ScanSpec  # sensor_event_id is a placeholder when `event` is set (the id is minted on store)
    event: dict[str, Any] | None  # a new event to store
    sensor_event_id: str | None  # an existing event to reuse


def _size(body: ScanRequestBody, name: str, alias: str, fallback: str | int) -> int:
    """The size the request gives (the canonical name wins over its alias), else the default; in bytes."""
    given = getattr(body, name)
    if given is None and getattr(body, alias) is not None:
        name, given = alias, getattr(body, alias)
    raw = fallback if given is None else given
    try:
        size = parse_size(raw)
        if size > INTEGER_MAX:  # the bound of every integer of a Scan
            raise SizeTooLarge(raw)
    except SizeTooLarge:
        raise bad_request(f"'{name}': must be no more than {INTEGER_MAX} bytes") from None
    except InvalidSize:
        raise bad_request(
            f"invalid size: {raw}",
            f"'{name}' is not a size: give bytes, or a number with a unit such as 8GB or 512MiB.",
        ) from None
    return size


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def n_workers_too_many(field: str, n_workers: int, most: int) -> ApiError | None:
    """The deployment's bound on one request's workers (`SKYSCAN_MAX_N_WORKERS`), worded as the model's."""
    if n_workers <= most:
        return None
    return bad_request(
        f"'{field}': must be no more than {most}",
        f"This deployment takes at most {most} workers per cluster location in one request "
        "(SKYSCAN_MAX_N_WORKERS); add-workers asks for more once the scan runs.",
    )


def unknown_cluster(name: str, known: Mapping[str, int | None]) -> ApiError | None:
    """A cluster location this deployment does not offer (`SKYSCAN_KNOWN_CLUSTERS`): launch's and
    add-workers' 400."""
    if name in known:
        return None
    return bad_request(f"requested unknown cluster: {name} (available: {', '.join(known)})")


def _clusters(body: ScanRequestBody, defaults: Defaults) -> list[tuple[str, int]]:
    field = "request_clusters" if body.request_clusters is not None else "cluster"
    given = _first(body.request_clusters, body.cluster)
    if given is None:
        raise bad_request("'request_clusters' is a required property")
    pairs = list(given.items()) if isinstance(given, dict) else [tuple(p) for p in given]
    for i, (name, n_workers) in enumerate(pairs):
        if unknown := unknown_cluster(name, defaults.known_clusters):
            raise unknown
        where = f"{field}.{name}" if isinstance(given, dict) else f"{field}.{i}.1"
        if too_many := n_workers_too_many(where, n_workers, defaults.max_n_workers):
            raise too_many
    return pairs


def _event(body: ScanRequestBody) -> dict[str, Any] | None:
    event: Any = body.event_live_json
    if isinstance(event, str):
        try:
            event = json.loads(event)
        except json.JSONDecodeError as e:
            raise bad_request(f"event_live_json is not valid JSON: {e}") from None
        if not isinstance(event, dict):
            raise bad_request("event_live_json is not valid JSON: not an object")
        try:
            finite(event)  # Python's parser takes NaN, Infinity and 1e400; JSON has none of them
        except ValueError as e:
            raise bad_request(f"event_live_json is not valid JSON: {e}") from None
    if bool(event) == bool(body.sensor_event_id):
        raise bad_request("Must provide either 'event_live_json' or 'sensor_event_id' (xor)")
    return event or None


def _scanner_env(body: ScanRequestBody, allowed: frozenset[str]) -> dict[str, Any]:
    env = _first(body.scanner_server_env_from_user, body.scanner_server_env) or {}
    for name in env:
        if not scanner_env_allowed(name, allowed):
            raise bad_request(
                f"cannot set '{name}' in the scanner's environment",
                "A scan may set the scanner's own SKYSCAN_ tuning variables and the names this deployment "
                "allows (SKYSCAN_SCANNER_ENV_ALLOWED); variables such as proxies, CA bundles or PATH would "
                "change where the scanner sends its credential or what it runs.",
            )
    return env


def normalise(body: ScanRequestBody, tags: Iterable[str], defaults: Defaults) -> Launch:
    if body.memory:
        raise bad_request("argument 'memory' is deprecated -- use 'worker_memory_bytes'")
    try:
        docker_tag = resolve_tag(body.docker_tag, tags, defaults.min_tag)
    except TagError as e:
        raise bad_request(str(e)) from None
    scanner_memory = _size(
        body, "scanner_server_memory_bytes", "scanner_server_memory", defaults.scanner_server_memory
    )
    for key in RESERVED_CLASSIFIER_KEYS:
        if key in body.classifiers:
            raise bad_request(f"classifier cannot contain '{key}' sub-field")
    clusters = _clusters(body, defaults)
    worker_memory = _size(body, "worker_memory_bytes", "worker_memory", defaults.worker_memory)
    worker_disk = _size(body, "worker_disk_bytes", "worker_disk", defaults.worker_disk)
    debug_mode = (
        [body.debug_mode] if isinstance(body.debug_mode, DebugMode) else list(dict.fromkeys(body.debug_mode))
    )
    event = _event(body)
    if DebugMode.CLIENT_LOGS in debug_mode:
        for name, n_workers in clusters:
            cap = defaults.known_clusters[name]
            if cap is not None and n_workers > cap:
                raise bad_request(
                    f"Too many workers: Cluster '{name}' can only have {cap} workers "
                    "when 'debug_mode' includes 'client-logs'"
                )
    normalised = {
        "docker_tag": docker_tag,
        "sensor_event_id": body.sensor_event_id or "pending",
        "request_clusters": [{"location": n, "n_workers": w} for n, w in clusters],
        "scanner_server_memory_bytes": scanner_memory,
        "worker_memory_bytes": worker_memory,
        "worker_disk_bytes": worker_disk,
        "debug_mode": debug_mode,
        "scanner_server_env_from_user": _scanner_env(body, defaults.scanner_env_allowed),
    }
    try:
        spec = ScanSpec(**{**{f: getattr(body, f) for f in _AS_GIVEN}, **normalised})
    except ValidationError as e:  # the request model mirrors ScanSpec; this guards drift
        raise ApiError(400, validation_reason(e) or "unspecified validation error") from None
    _check_size(spec)
    return Launch(spec=spec, event=event, sensor_event_id=body.sensor_event_id)


def _check_size(spec: ScanSpec) -> None:
    """The Scan holds its request: one too large for it (a megabyte of `reco_algo`) is a 413 naming the
    largest field, not an object etcd refuses."""
    sizes = {
        k: len(json.dumps(v, ensure_ascii=False).encode()) for k, v in spec.model_dump(mode="json").items()
    }
    if sum(sizes.values()) > SPEC_MAX_BYTES:
        largest = max(sizes, key=lambda k: sizes[k])
        raise ApiError(
            413,
            f"'{largest}' too large",
            f"The scan request is {sum(sizes.values())} bytes as JSON, '{largest}' {sizes[largest]} of them; "
            f"at most {SPEC_MAX_BYTES} bytes are stored (docs/rest-api/index.md).",
        )
