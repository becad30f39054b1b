"""The Scan custom resource: its spec (the normalised scan request) and status.

This module is the one source of the CRD (see `skyscan.crd`). Python names are snake_case; the
Kubernetes wire names are camelCase aliases. The few rules the CRD schema cannot carry are model
validators, so REST input is checked by the same source.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "skyscan.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Scan"
PLURAL = "scans"
SINGULAR = "scan"
SHORT_NAMES = ["scn"]

# Sizes the reference service applies when a request names none (decimal units, as it parses them).
DEFAULT_SCANNER_SERVER_MEMORY_BYTES = 1_024_000_000  # "1024M"
DEFAULT_WORKER_MEMORY_BYTES = 8_000_000_000  # "8GB"
DEFAULT_WORKER_DISK_BYTES = 1_000_000_000  # "1GB"

CLASSIFIER_MAX_ENTRIES = 25
CLASSIFIER_MAX_KEY_LENGTH = 25
CLASSIFIER_MAX_STRING_LENGTH = 25
RESERVED_CLASSIFIER_KEYS = ("rescan", "origin_scan_id")
ENV_MAX_ENTRIES = 25
ENV_MAX_KEY_LENGTH = 128
ENV_MAX_STRING_LENGTH = 4096

# A CRD's integers are int64s, and its bounds float64s: the largest int64 a bound states exactly is
# 2**63 - 1024. These bounds are in the CRD too, so a REST request and a kubectl apply are refused alike,
# naming the field, instead of the API server failing on a number it cannot hold.
INTEGER_MIN = -(2**63)
INTEGER_MAX = 2**63 - 1024


def _integral(value: Any) -> Any:
    """JSON Schema counts an integral number (`91.0`) as an integer, so the strict REST models take it
    as one; `91.5`, booleans and strings stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, Field(ge=INTEGER_MIN, le=INTEGER_MAX), BeforeValidator(_integral)]
NonNegativeInteger = Annotated[int, Field(ge=0, le=INTEGER_MAX), BeforeValidator(_integral)]
PositiveInteger = Annotated[int, Field(ge=1, le=INTEGER_MAX), BeforeValidator(_integral)]


def new_scan_id(now: float, random_hex: str) -> str:
    """A scan id: the time in ms as 11 hex digits (ids sort by creation), 'x', then the last 20 hex
    digits of a random hex string (of a uuid4's, the first of them is its version nibble)."""
    return f"{int(now * 1000):011x}x{random_hex[-20:]}"


class KubeModel(BaseModel):
    """A model whose wire form is the Kubernetes camelCase one."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_kube(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_patch(self) -> dict[str, Any]:
        """A merge patch of just the fields that were set (defaults would overwrite stored values)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class StatusPart(KubeModel):
    """A part of the status. Read back leniently: a key an older or newer version wrote is ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class RealOrSimulatedEvent(StrEnum):
    REAL = "real"
    REAL_EVENT = "real_event"
    SIM = "sim"
    SIMULATED = "simulated"
    SIMULATED_EVENT = "simulated_event"

    @property
    def is_real(self) -> bool:
        return self.value.startswith("real")


class DebugMode(StrEnum):
    CLIENT_LOGS = "client-logs"


NonBlank = Annotated[str, Field(min_length=1, pattern=r"\S")]
Scalar = str | bool | int | float | None


def _int64(value: Any) -> Any:
    """A free-form value's integer stays an integer the API server can hold, or is refused: a union
    would otherwise take 2**70 as a float, rounded."""
    if isinstance(value, int) and not isinstance(value, bool) and not INTEGER_MIN <= value <= INTEGER_MAX:
        raise ValueError(f"integers are at most {INTEGER_MAX} and at least {INTEGER_MIN}")
    return value


# Maps of scalars. The API server cannot type a union, so the CRD leaves each value untyped and
# refuses lists and objects by value rules (see `skyscan.crd`); CEL cannot see untyped values, so key
# limits and reserved keys are checked here, by the model the REST shim validates with.
Classifiers = Annotated[
    dict[
        Annotated[str, Field(max_length=CLASSIFIER_MAX_KEY_LENGTH)],
        Annotated[
            Annotated[str, Field(max_length=CLASSIFIER_MAX_STRING_LENGTH)] | bool | int | float | None,
            BeforeValidator(_int64),
        ],
    ],
    Field(max_length=CLASSIFIER_MAX_ENTRIES),
]

# What Skyscan itself hands the scanner (its REST address and credential, scan id, WMS and message-queue
# connection, logging), and what could change how the interpreter starts: never a user's, whatever a
# deployment allows.
RESERVED_ENV_PREFIXES = ("SKYSCAN_SKYDRIVER_", "SKYSCAN_EWMS_", "SKYSCAN_MQ_", "SKYSCAN_STARTUP_", "EWMS_",
                         "KUBERNETES_", "PYTHON", "LD_")  # fmt: skip
# A user's variable is on an allow-list, as proxies, CA bundles, PATH, BASH_ENV and the like would
# redirect the scanner's traffic (and its bearer token) or change what it runs, and a deny-list always
# misses one. The list: the scanner's own tuning variables (skymap_scanner.server's ServerEnvConfig: its
# log levels, how often it reports progress and results and how it predicts runtimes, how often it polls
# its kill switch), none of which names an address, a credential, a file or a program; and what a
# deployment adds (`scanner_env_allowed`): names, or prefixes ending in `*`.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a C identifier: what every shell and the API server take
SCANNER_TUNING_ENV_PATTERN = r"^SKYSCAN_(LOG|LOG_THIRD_PARTY|(PROGRESS|RESULT|KILL_SWITCH)_[A-Z0-9_]+)$"
ENV_ALLOWED_ENTRY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*\*?$"
_SCANNER_TUNING_ENV = re.compile(SCANNER_TUNING_ENV_PATTERN)
EnvAllowList = list[Annotated[str, Field(pattern=ENV_ALLOWED_ENTRY_PATTERN)]]


def is_reserved_env(name: str) -> bool:
    return name.upper().startswith(RESERVED_ENV_PREFIXES)


def _on_list(name: str, allowed: Collection[str]) -> bool:
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allowed)


def scanner_env_allowed(name: str, allowed: Collection[str] = ()) -> bool:
    """May a user set the scanner's variable `name`? `allowed`: the names (or `PREFIX*`) a deployment adds."""
    if is_reserved_env(name):
        return False
    return _SCANNER_TUNING_ENV.fullmatch(name) is not None or _on_list(name, allowed)


# Validation context for reading back what the API server stored: the request policies above were
# checked when the scan was admitted (REST) or are enforced where it runs (the operator), so a view of
# a Scan made with kubectl never fails on them.
STORED = {"stored": True}


def _checking_policy(info: ValidationInfo) -> bool:
    return not (info.context or {}).get("stored")


def _no_reserved_env(env: dict[str, Scalar], info: ValidationInfo) -> dict[str, Scalar]:
    if not _checking_policy(info):
        return env
    for key in env:
        if is_reserved_env(key):
            raise ValueError(
                f"cannot set '{key}': Skyscan sets the scanner's own variables "
                f"(reserved prefixes: {', '.join(RESERVED_ENV_PREFIXES)})"
            )
    return env


# An environment value is text a process receives: no NUL, which no exec can carry (the API server
# would store it and the container would fail to start).
ENV_VALUE_PATTERN = r"^[^\x00]*$"
ScannerServerEnv = Annotated[
    dict[
        Annotated[str, Field(min_length=1, max_length=ENV_MAX_KEY_LENGTH, pattern=ENV_NAME_PATTERN)],
        Annotated[
            Annotated[str, Field(max_length=ENV_MAX_STRING_LENGTH, pattern=ENV_VALUE_PATTERN)]
            | bool
            | int
            | float
            | None,
            BeforeValidator(_int64),
        ],
    ],
    Field(max_length=ENV_MAX_ENTRIES),
    AfterValidator(_no_reserved_env),
]

# The scanner's command line (`skyscan.scanner_args`): every user value is one argument of a known
# grammar. The reference takes any algorithm name; a name is an identifier here, so it cannot carry an
# option, a space or a `$(VAR)` the kubelet would expand. nsides are HEALPix resolutions the scanner
# can reach, written plainly (no sign, no leading zero), a few of them; a pixel extension counts pixels,
# so at most the finest sky's (12 * 8192**2, within an int32).
RECO_ALGO_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
NSIDE_MAX = 8192
NSIDES_MAX_ENTRIES = 16
NSIDE_PATTERN = r"^[1-9][0-9]{0,3}$"
PIXEL_EXTENSION_MAX = 12 * NSIDE_MAX**2
PixelExtension = Annotated[int, Field(ge=0, le=PIXEL_EXTENSION_MAX), BeforeValidator(_integral)]
RecoAlgo = Annotated[str, Field(pattern=RECO_ALGO_PATTERN, max_length=64)]


def _nsides_in_range(nsides: dict[str, int]) -> dict[str, int]:
    for key in nsides:
        if int(key) > NSIDE_MAX:
            raise ValueError(f"nside {key} is beyond the scanner's range (at most {NSIDE_MAX})")
    return nsides


Nsides = Annotated[
    dict[Annotated[str, Field(pattern=NSIDE_PATTERN)], PixelExtension],
    Field(
        min_length=1,
        max_length=NSIDES_MAX_ENTRIES,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.all(k, k.matches('{NSIDE_PATTERN}') && int(k) <= {NSIDE_MAX})",
                    "message": f"nsides keys are integers from 1 to {NSIDE_MAX}, written plainly",
                }
            ]
        },
    ),
    AfterValidator(_nsides_in_range),
]
# Workers per cluster location in one request: the reference forwards any int64 to the WMS; a hundred
# thousand is far beyond any scan yet run and well within what the WMS counts.
N_WORKERS_MAX = 100_000
NWorkers = Annotated[int, Field(ge=1, le=N_WORKERS_MAX), BeforeValidator(_integral)]
LOCATION_MAX_LENGTH = 64
Location = Annotated[str, Field(min_length=1, max_length=LOCATION_MAX_LENGTH, pattern=r"\S")]


class ClusterRequest(KubeModel):
    """Workers requested at one WMS cluster location; a location may appear more than once."""

    location: Location
    n_workers: NWorkers


class WorkerRequest(KubeModel):
    """An add-workers action, carried out by the operator and answered in status."""

    id: NonBlank
    location: Location
    n_workers: NWorkers


# A sensor event's id, as REST takes one to reuse (it mints uuid4 hex ids itself): the name of the event's
# ConfigMap ends with it (`names.event_object_name`), so it stays within a DNS label's characters.
SENSOR_EVENT_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SENSOR_EVENT_ID_MAX_LENGTH = 48


class ScanSpec(KubeModel):
    """The normalised scan request (sizes in bytes, clusters as pairs, the resolved image tag)."""

    docker_tag: NonBlank = Field(description="Resolved skymap-scanner image tag, without a leading 'v'.")
    reco_algo: RecoAlgo
    sensor_event_id: NonBlank = Field(description="Name of the stored sensor event this scan reads.")
    nsides: Nsides = Field(description="nside -> pixel extension, as the scanner's --nsides takes them.")
    real_or_simulated_event: RealOrSimulatedEvent
    max_pixel_reco_time: PositiveInteger = Field(description="Seconds.")
    request_clusters: list[ClusterRequest] = Field(min_length=1)
    scanner_server_memory_bytes: NonNegativeInteger = DEFAULT_SCANNER_SERVER_MEMORY_BYTES
    worker_memory_bytes: NonNegativeInteger = DEFAULT_WORKER_MEMORY_BYTES
    worker_disk_bytes: NonNegativeInteger = DEFAULT_WORKER_DISK_BYTES
    predictive_scanning_threshold: float = Field(default=1.0, ge=0, le=1)
    priority: Integer = 0
    debug_mode: list[DebugMode] = Field(
        default_factory=list, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    classifiers: Classifiers = Field(
        default_factory=dict,
        description=f"Scalars; strings at most {CLASSIFIER_MAX_STRING_LENGTH} characters; "
        f"keys at most {CLASSIFIER_MAX_KEY_LENGTH}; not {', '.join(RESERVED_CLASSIFIER_KEYS)}.",
    )
    scanner_server_env_from_user: ScannerServerEnv = Field(
        default_factory=dict,
        description=f"Extra environment for the scanner server: its tuning variables "
        f"({SCANNER_TUNING_ENV_PATTERN}) and the names the deployment allows; Skyscan's own variables win. "
        f"Scalars; strings at most {ENV_MAX_STRING_LENGTH} characters, without NUL; names at most "
        f"{ENV_MAX_KEY_LENGTH}, not starting with {', '.join(RESERVED_ENV_PREFIXES)}.",
    )
    rescan_of: str | None = Field(default=None, description="The scan this one rescans.")
    deleted: bool = Field(default=False, description="Soft delete: abort the scan but keep its record.")
    replaced_by: str | None = Field(default=None, description="The scan that replaces this one.")
    worker_requests: list[WorkerRequest] = Field(
        default_factory=list,
        description="Add-workers actions; not for GitOps (outcomes are recorded in status).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"]},
    )

    @field_validator("classifiers")
    @classmethod
    def _no_reserved_classifiers(cls, value: dict[str, Scalar], info: ValidationInfo) -> dict[str, Scalar]:
        if not _checking_policy(info):
            return value
        for key in RESERVED_CLASSIFIER_KEYS:
            if key in value:
                raise ValueError(f"classifier cannot contain '{key}' sub-field")
        return value


# Spec fields that belong to one scan's life, not to its request: a rescan does not copy them.
SCAN_LIFE_FIELDS = ("deleted", "replacedBy", "workerRequests", "rescanOf")


def rescan_spec(spec: Mapping[str, Any], origin_id: str) -> dict[str, Any]:
    """The wire-form spec of a rescan (or replacement) of scan `origin_id`: its request, pointing back."""
    return {**{k: v for k, v in spec.items() if k not in SCAN_LIFE_FIELDS}, "rescanOf": origin_id}


class Condition(KubeModel):
    """A Kubernetes API convention condition."""

    type: NonBlank
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$")
    message: str = ""
    last_transition_time: str = Field(description="RFC 3339 time of the last status change.")
    observed_generation: int | None = None


class EventMetadata(BaseModel):
    """The sensor event's metadata as the scanner reports it (REST form, snake_case); unknown keys
    are dropped, as the reference does."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    run_id: Integer
    event_id: Integer
    event_type: str
    mjd: float
    is_real_event: bool


class EventMetadataStatus(EventMetadata, KubeModel):
    """The same fields as stored in the Scan's status (camelCase)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)


FreeForm = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]
# A free-form object replaced whole by each write (server-side apply owns it as one value).
Replaced = Annotated[
    dict[str, Any],
    Field(
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "x-kubernetes-map-type": "atomic"}
    ),
]


class WorkflowStatus(StatusPart):
    """The scan's WMS workflow. `requested_at` is the intent marker written *before* the request is
    sent, so a restart that finds it without an `id` knows a workflow may exist and must not
    silently create a second one."""

    requested_at: str | None = Field(default=None, description="RFC 3339; set before POST /v1/workflows.")
    id: str | None = None
    address: str | None = None
    queues_activated: bool = False
    deactivated: str | None = Field(default=None, description="ABORTED or FINISHED, as the WMS says.")
    finish_requested_at: str | None = None
    abort_requested_at: str | None = None


class BacklogStatus(StatusPart):
    """Bookkeeping while the scan waits for admission (the REST backlog entry). Unix seconds."""

    entered_at: float
    pending_since: float = 0.0
    attempts: int = Field(default=0, description="Start attempts made; interrupted ones are not counted.")
    interruptions: int = Field(
        default=0,
        description="Start attempts in a row interrupted by a WMS or API-server outage or a quota refusal "
        "(not counted as attempts; they set the backoff).",
    )
    wait_reason: str | None = Field(
        default=None,
        description="Why it waits: Rate (next of its class, held by the admission rate), Priority "
        "(scans ahead of it go first), Quota (the cap on running scanners, or a quota refusal), Outage "
        "(its start attempt was interrupted by a WMS or API-server outage), Retry (its last attempt "
        "failed). Absent while it is in a start attempt.",
    )
    position: PositiveInteger | None = Field(
        default=None,
        description="1-based place in admission order among the waiting scans; written for the first "
        "SKYSCAN_BACKLOG_POSITIONS_SHOWN only (GET /scans/backlog gives every place).",
    )
    estimated_start: float | None = Field(
        default=None,
        description="When it may start at the recent admission rate (Unix seconds); with `position` "
        "only, absent while nothing was admitted recently.",
    )


class JobStatus(StatusPart):
    name: str
    created_at: str | None = None
    started_at: float | None = Field(default=None, description="Unix seconds when the scanner Pod started.")
    pod: str | None = Field(
        default=None, description="The scanner's Pod (the latest): whose log REST serves while it runs."
    )
    state: str | None = Field(default=None, description="Pending, Running, Succeeded, Failed or Deleted.")
    reason: str | None = None
    replacement: str | None = Field(
        default=None,
        description="The replacement scan chosen after this scanner died for a transient reason; written "
        "before that scan is created (the intent marker that makes the replacement happen exactly once).",
    )


class Workforce(StatusPart):
    """Summed over the workflow's taskforces (compound statuses, running workers, top errors)."""

    statuses: Replaced = Field(default_factory=dict)  # atomic: an apply may empty them
    n_running: int = 0
    top_errors: Replaced = Field(default_factory=dict)


class WorkerRequestOutcome(StatusPart):
    """The answer to one `spec.workerRequests` entry, keyed by its id: `Refused` when the scan's state
    does not allow it (reason says why; the WMS, if asked, said so too: its 422), `Rejected` when the
    WMS refused the request itself (a 4xx, such as a cluster it does not know: reason names it),
    `Failed` when the WMS could not serve it."""

    id: NonBlank
    state: Literal["Succeeded", "Failed", "Refused", "Rejected"]
    taskforce_uuid: str | None = None
    n_workers: int | None = None
    reason: str | None = None


class ScannerCredential(StatusPart):
    """The scanner's own credential: a service-account token (audience `skyscan-scanner`) bound to the
    per-scan Secret that holds it, so deleting that Secret revokes it. The token itself is only in there."""

    secret: str
    expires_at: float | None = Field(default=None, description="Unix seconds, as the API server granted.")
    revoked: bool = Field(default=False, description="The Secret was deleted: the token is void.")


class ResultStatus(StatusPart):
    """Written by the shim next to the stored result payload, so the operator can finish the workflow."""

    is_final: bool
    updated_at: float


class Transition(StatusPart):
    """The scan recorded in a state (`state`, as the REST interface names it): the webhooks' events."""

    seq: int = Field(ge=1, description="1 for the first state recorded, then one more per change.")
    state: str
    at: float = Field(description="Unix seconds: when the operator recorded it.")


class OperatorStatus(KubeModel):
    """The status keys the operator writes (and no one else)."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    state: str | None = Field(default=None, description="The REST scan_state, for kubectl get.")
    transitions: list[Transition] | None = Field(
        default=None,
        description="The states the scan was recorded in, oldest first (the last 32): what webhooks deliver.",
    )
    backlog: BacklogStatus | None = None
    workflow: WorkflowStatus | None = None
    job: JobStatus | None = None
    workforce: Workforce | None = None
    taskforces: list[FreeForm] | None = None
    worker_requests: list[WorkerRequestOutcome] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"]},
    )
    scanner_credential: ScannerCredential | None = None


class ShimStatus(KubeModel):
    """The status keys the shim writes: what the scanner reports, and when the manifest changed."""

    progress: Replaced | None = None
    event_metadata: EventMetadataStatus | None = None
    scan_metadata: FreeForm | None = None
    result: ResultStatus | None = None
    last_updated: float | None = Field(default=None, description="Unix seconds of the last manifest change.")


class ScanStatus(ShimStatus, OperatorStatus):
    """Operator keys and shim keys are disjoint; each writes only its own through the status subresource."""
