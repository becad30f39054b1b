"""REST request and response models (interface names, snake_case on the wire).

Requests are validated with these models (strict JSON types, unknown fields refused) and the
OpenAPI document is generated from them, so the two cannot disagree. As in JSON Schema, an integral
number (`91.0`) is an integer; integers are int64s (the Scan CRD's bounds); numbers are finite.
`validation_reason` renders pydantic's errors in the reference service's wording
(`'docker_tag' is a required property`, ...).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel, ValidationError
from pydantic_core import ErrorDetails

from api_shim.wire_names import alias
from skyscan import subscription
from skyscan.manifest import (
    ClassifiersOut,
    HeldJsonObject,
    JsonObject,
    Progress,
    Threshold,
)
from skyscan.manifest import Manifest as Manifest  # the REST manifest is the domain's
from skyscan.model import (
    SENSOR_EVENT_ID_MAX_LENGTH,
    SENSOR_EVENT_ID_PATTERN,
    Classifiers,
    DebugMode,
    EventMetadata,
    Integer,
    Location,
    NonBlank,
    NonNegativeInteger,
    Nsides,
    NWorkers,
    PositiveInteger,
    RealOrSimulatedEvent,
    RecoAlgo,
    ScannerServerEnv,
)

# A size: bytes, or a number with a unit (`8GB`); a blank string is refused here, naming the field.
DataSize = NonBlank | NonNegativeInteger
RequestClusters = (
    Annotated[dict[Location, NWorkers], Field(min_length=1)]
    | Annotated[list[tuple[Location, NWorkers]], Field(min_length=1)]
)
# The largest progress, event_metadata or scan_metadata a PATCH may store, as compact JSON: the Scan
# holds them (and their field ownership), and etcd caps the whole object near 1.5 MiB; the scanner's
# reports are a few KB.
MANIFEST_FIELD_MAX_BYTES = 64 * 1024


def _unique(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("items must be unique")
    return names


ManifestProjection = (
    Literal["*"]
    | Annotated[list[NonBlank], AfterValidator(_unique), Field(json_schema_extra={"uniqueItems": True})]
)


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


# ---------------------------------------------------------------------------------------- requests
class ScanRequestBody(Body):
    docker_tag: NonBlank
    scanner_server_memory_bytes: DataSize | None = None
    scanner_server_memory: DataSize | None = Field(default=None, json_schema_extra={"deprecated": True})
    worker_memory_bytes: DataSize | None = None
    worker_memory: DataSize | None = Field(default=None, json_schema_extra={"deprecated": True})
    memory: str | int | None = Field(
        default=None, json_schema_extra={"deprecated": True}, description="Refused when set."
    )
    worker_disk_bytes: DataSize | None = None
    worker_disk: DataSize | None = Field(default=None, json_schema_extra={"deprecated": True})
    request_clusters: RequestClusters | None = None
    cluster: RequestClusters | None = Field(default=None, json_schema_extra={"deprecated": True})
    reco_algo: RecoAlgo
    event_live_json: (
        Annotated[str, Field(min_length=2, pattern=r"^\s*\{[\s\S]*\}\s*$")] | JsonObject | None
    ) = Field(default=None, validation_alias=alias("event_live_json"))
    sensor_event_id: (
        Annotated[str, Field(max_length=SENSOR_EVENT_ID_MAX_LENGTH, pattern=SENSOR_EVENT_ID_PATTERN)] | None
    ) = Field(default=None, validation_alias=alias("sensor_event_id"))
    nsides: Nsides
    real_or_simulated_event: RealOrSimulatedEvent
    predictive_scanning_threshold: Threshold = 1.0
    max_pixel_reco_time: PositiveInteger
    debug_mode: DebugMode | list[DebugMode] = Field(default_factory=list)
    classifiers: Classifiers = Field(default_factory=dict)
    priority: Integer = 0
    scanner_server_env_from_user: ScannerServerEnv | None = None
    scanner_server_env: ScannerServerEnv | None = Field(default=None, json_schema_extra={"deprecated": True})
    manifest_projection: ManifestProjection = "*"


class SubscribeBody(Body):
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    secret: Annotated[str, Field(min_length=1, max_length=200)] | None = None  # none: one is made
    states: Annotated[list[subscription.StateName], Field(min_length=1, max_length=subscription.MAX_STATES)]
    scan_ids: Annotated[list[subscription.ScanId], Field(max_length=subscription.MAX_SCAN_IDS)] = []
    classifiers: Classifiers = Field(default_factory=dict)


class FindBody(Body):
    filter: JsonObject
    include_deleted: bool = False
    manifest_projection: ManifestProjection = "*"


class RescanBody(Body):
    no_redirect: bool = False
    abort_first: bool = False
    replace_scan: bool = False
    manifest_projection: ManifestProjection = "*"


class AddWorkersBody(Body):
    no_redirect: bool = False
    n_workers: NWorkers
    cluster_location: Location


class DeleteBody(Body):
    no_redirect: bool = False
    delete_completed_scan: bool = False
    manifest_projection: ManifestProjection = "*"


class PatchManifestBody(Body):
    """Each of the three is at most `MANIFEST_FIELD_MAX_BYTES` as compact JSON (else 413)."""

    progress: Progress | None = None
    event_metadata: EventMetadata | None = None
    scan_metadata: HeldJsonObject | None = None

    def oversized(self) -> tuple[str, int] | None:
        """The first field larger than the limit, and its size."""
        for name in ("progress", "event_metadata", "scan_metadata"):
            value = getattr(self, name)
            if value is None:
                continue
            data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
            if size > MANIFEST_FIELD_MAX_BYTES:
                return name, size
        return None


class PutResultBody(Body):
    scan_result: JsonObject = Field(validation_alias=alias("scan_result"))
    is_final: bool


class WorkflowIdBody(Body):
    workflow_id: NonBlank
    wms_address: NonBlank = Field(validation_alias=alias("wms_address"))


# --------------------------------------------------------------------------------------- responses
class ProjectedManifest(BaseModel):
    """A Manifest restricted to the requested fields."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"description": "Any subset of Manifest."})


class Result(BaseModel):
    scan_id: str
    scan_result: JsonObject
    is_final: bool


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestView(RootModel[Manifest | ProjectedManifest]):
    """The manifest, or the fields asked for with `manifest_projection` or `projection`."""


class ResultOrEmpty(RootModel[Result | Empty]):
    """The stored result, or `{}` before the scanner has sent one."""


class ManifestAndResult(BaseModel):
    manifest: Manifest | ProjectedManifest
    result: Result | Empty


class FindResponse(BaseModel):
    manifests: list[ProjectedManifest]


class BacklogEntry(BaseModel):
    scan_id: str
    timestamp: float
    pickled_k8s_job: str | None = Field(default=None, json_schema_extra={"deprecated": True})
    priority: int
    pending_timestamp: float
    next_attempt: int
    position: int | None = Field(
        default=None,
        description="1-based place in admission order (priority, then age) among the waiting scans; "
        "null for a scan in a start attempt (those come first).",
    )


class BacklogResponse(BaseModel):
    entries: list[BacklogEntry]


class TableRow(BaseModel):
    """A scan as the dashboard's table shows it (`view.table_row`)."""

    scan_id: str
    timestamp: float
    is_deleted: bool
    priority: int
    classifiers: ClassifiersOut
    event_metadata: EventMetadata | None
    progress: Progress | None
    scan_state: str


class TableResponse(BaseModel):
    scans: list[TableRow]
    next: str | None  # the next page's `before`; null: the last page


class SubscriptionView(BaseModel):
    id: str
    url: str
    states: list[str]
    scan_ids: list[str]
    classifiers: ClassifiersOut
    created: str  # RFC 3339
    pending: int
    delivered: int
    failures: int
    given_up: int
    last_delivery: JsonObject | None
    secret: str | None = None  # only in the answer to the POST that made one


class SubscriptionsResponse(BaseModel):
    subscriptions: list[SubscriptionView]


class ScanRequestObj(BaseModel):
    scan_id: str
    rescan_ids: list[str]
    docker_tag: str
    scanner_server_memory_bytes: int
    reco_algo: str
    nsides: dict[str, int]
    real_or_simulated_event: RealOrSimulatedEvent
    predictive_scanning_threshold: float
    classifiers: ClassifiersOut
    request_clusters: list[tuple[str, int]]
    worker_memory_bytes: int
    worker_disk_bytes: int
    max_pixel_reco_time: int
    priority: int
    debug_mode: list[str]
    sensor_event_id: str
    scanner_server_env_from_user: JsonObject


class LogUrlLink(BaseModel):
    url: str | None


class Workforce(BaseModel):
    model_config = ConfigDict(extra="allow")
    workflow_id: str | None
    statuses: JsonObject
    n_running: int
    top_errors: JsonObject


class BacklogPlace(BaseModel):
    """Where a waiting scan stands, as the operator last wrote it."""

    position: int | None = Field(
        description="1-based place in admission order; null beyond the first the operator shows "
        "(SKYSCAN_BACKLOG_POSITIONS_SHOWN; GET /scans/backlog numbers them all)."
    )
    wait_reason: str = Field(description="Rate, Priority, Quota, Outage or Retry (docs: the backlog).")
    estimated_start: float | None = Field(
        description="Unix seconds, at the recent admission rate; null without a position or a recent "
        "admission."
    )
    estimated_wait_seconds: float | None = Field(description="From now until `estimated_start`.")


class StatusResponse(BaseModel):
    scan_state: str
    is_deleted: bool
    wms_deactivated: str | None
    scan_complete: bool
    scanner_server_logs: LogUrlLink
    wms_workforce: Workforce
    backlog: BacklogPlace | None = Field(default=None, description="Null unless the scan waits.")


class LogsResponse(BaseModel):
    scanner_server: LogUrlLink


class SensorEventResponse(BaseModel):
    sensor_event: JsonObject


class WorkflowIdResponse(BaseModel):
    workflow_id: str | None
    requested_wms_workflow: bool
    eligible_for_wms: bool
    wms_address: str | None


class TaskforcesResponse(BaseModel):
    taskforces: list[JsonObject]


class AddWorkersResponse(BaseModel):
    taskforce_uuid: str
    n_workers: int


class StartupJson(RootModel[JsonObject]):
    """The scanner's startup.json (100-530 KB): a JSON object, stored and served byte for byte."""


class StartupStored(BaseModel):
    scan_id: str
    size: int = Field(description="Bytes stored (uncompressed).")


class Error(BaseModel):
    error: str = Field(description="The HTTP reason phrase.")
    reason: str = Field(description="The specific reason, e.g. `invalid size: 12XB`.")
    message: str = Field(description="A human explanation.")


# ------------------------------------------------------------------------------ error wording
_UNION_TAG = re.compile(
    r"^(constrained-\w+|str|int|float|bool|none|(dict|list|tuple|str-enum|literal|function-\w+)\[.*\])$"
)
_TYPE_HINTS = {
    "string": "'string' (str)",
    "int": "'integer' (int)",
    "float": "'number' (float or int)",
    "bool": "'boolean' (bool)",
    "dict": "'object' (dict)",
    "list": "'array' (list)",
    "model": "'object' (dict)",
    "tuple": "'array' (list)",
}


def _wording(error: ErrorDetails) -> str:
    kind: str = error["type"]
    ctx = error.get("ctx") or {}
    for prefix, hint in _TYPE_HINTS.items():
        if kind in (f"{prefix}_type", f"{prefix}_parsing", f"{prefix}_attributes_type"):
            return f"must be type {hint}"
    if kind == "string_too_short":
        return f"must be at least {ctx['min_length']} characters long"
    if kind == "string_too_long":
        return f"must be no more than {ctx['max_length']} characters long"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx['pattern']!r}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"must be at least {ctx.get('ge', ctx.get('gt'))}"
    if kind in ("less_than_equal", "less_than"):
        return f"must be no more than {ctx.get('le', ctx.get('lt'))}"
    if kind in ("enum", "literal_error"):
        return "must be one of: " + str(ctx["expected"]).replace(" or ", ", ")
    if kind in ("too_short", "too_long"):
        noun = "entries" if ctx.get("field_type") == "Dictionary" else "items"
        if kind == "too_short":
            return f"must have at least {ctx['min_length']} {noun}"
        return f"must have no more than {ctx['max_length']} {noun}"
    if kind == "value_error":
        return str(ctx.get("error", "invalid value"))
    if kind == "int_from_float":
        return "must be type 'integer' (int)"
    if kind == "finite_number":
        return "must be a finite number"
    return f"failed '{kind}' constraint"


def validation_reason(exc: ValidationError) -> str:
    """One line per problem, `; `-joined: `'<dotted.path>': <wording>` (no path for missing/extra)."""
    reasons: list[str] = []
    extras: dict[tuple[str, ...], list[str]] = {}
    unions: dict[str, list[tuple[int, str]]] = {}
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error["loc"]]
        if error["type"] == "extra_forbidden":
            extras.setdefault(tuple(loc[:-1]), []).append(loc[-1])
            continue
        tags = [i for i, part in enumerate(loc) if _UNION_TAG.match(part)]
        if error["type"] == "missing" and not tags:
            where = "'" + ".".join(loc[:-1]) + "': " if loc[:-1] else ""
            reasons.append(f"{where}'{loc[-1]}' is a required property")
            continue
        if "[key]" in loc:
            path, text = loc[: loc.index("[key]")], _wording(error)
        elif tags:
            # A union: name the constraint a member of the right type broke (inside it, with its
            # path: `'request_clusters.osg': must be no more than 100000`), else the union itself.
            path = loc[: tags[0]]
            inner = [part for part in loc[tags[0] + 1 :] if not _UNION_TAG.match(part)]
            wrong_type = error["type"].endswith("_type") or error["type"] == "missing"
            where = ".".join(path + inner)
            literal = error["type"] in ("literal_error", "enum")
            if wrong_type:
                text, rank = f"'{'.'.join(path)}': must match one of the accepted types", 3
            else:  # a literal alternative (`"*"`) explains less than the constraint the other member broke
                text, rank = f"'{where}': {_wording(error)}", 1 if literal else 0
            unions.setdefault(".".join(path), []).append((rank, text))
            continue
        else:
            path, text = loc, _wording(error)
        reasons.append(f"'{'.'.join(path)}': {text}" if path else text)
    for ranked in unions.values():
        reasons.append(min(ranked)[1])
    for place, unexpected in extras.items():
        names = sorted(unexpected)
        path = list(place)
        quoted = ", ".join(repr(n) for n in names)
        verb = "was" if len(names) == 1 else "were"
        text = f"Additional properties are not allowed ({quoted} {verb} unexpected)"
        reasons.append(f"'{'.'.join(path)}': {text}" if path else text)
    return "; ".join(dict.fromkeys(reasons))
