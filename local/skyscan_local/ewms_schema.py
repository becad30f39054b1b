"""A model of the EWMS routes Skyscan and a task manager use, written from EWMS's published OpenAPI
documents: the WMS's `wms/schema/openapi.json` at commit 079f9e1f9cf203c439b5ed206ef26d381cf0ba5a
(Observation-Management-Service/ewms-workflow-management-service) and the MQS's `mqs/openapi.json`
at commit 7ccfa14c56aedc5fea93d63f5492a0dfe8bec47b (…/ewms-message-queue-service).

Every object forbids extra keys (their `additionalProperties: false`). Types follow JSON Schema
2020-12 (OpenAPI 3.1, what EWMS validates with): an integer is a JSON number without a fraction
(`4` and `4.0`, never `"4"` or `true`), a number is any JSON number but a boolean, and a string is a
string only. `uniqueItems` compares items as JSON values. A violation raises `SchemaError`, whose
message names the field, as EWMS's 400 does.

Stored objects (workflows, task directives, taskforces) are checked whole (`check`): the WMS's
database requires every property of them. Query answers with a projection are checked field by field
(`check_partial`), as the OpenAPI document requires none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainValidator,
    TypeAdapter,
    ValidationError,
)

# The pilot tag pattern, as the document writes it: its alternatives are not grouped, so the first is
# anchored at the start only and the last at the end only (JSON Schema patterns search).
PILOT_TAG_PATTERN = re.compile(
    r"^([0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3})|(latest)|([a-z0-9._-]+-[a-z0-9]{1,128})$"
)
TASKFORCE_PHASES = (
    "pre-mq-activation", "pre-launch", "pending-starter", "condor-submit", "pending-stopper", "condor-rm",
    "condor-complete",
)  # fmt: skip
ENDING_PHASES = ("pending-stopper", "condor-rm", "condor-complete")


class SchemaError(ValueError):
    """A document the model does not allow; the message names the field."""


# --- JSON Schema scalar types ---


def _integer(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("is not of type 'integer'")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("is not of type 'integer'")
    return value


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("is not of type 'number'")
    return value


def _string(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("is not of type 'string'")
    return value


def _boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("is not of type 'boolean'")
    return value


def _object(value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError("is not of type 'object'")
    return value


def _unique(items: list[Any]) -> list[Any]:
    seen = [json.dumps(item, sort_keys=True) for item in items]
    if len(set(seen)) != len(seen):
        raise ValueError("has non-unique elements")
    return items


def _unique_list(items: Any) -> Any:
    return _unique(items) if isinstance(items, list) else items  # a non-list fails the list check


def _non_empty(items: list[Any]) -> list[Any]:
    if not items:
        raise ValueError("should be non-empty")
    return items


def _pilot_tag(tag: str) -> str:
    if not PILOT_TAG_PATTERN.search(tag):
        raise ValueError(f"does not match {PILOT_TAG_PATTERN.pattern!r}")
    return tag


Integer = Annotated[int, PlainValidator(_integer)]
Number = Annotated[float, PlainValidator(_number)]
String = Annotated[str, PlainValidator(_string)]
Boolean = Annotated[bool, PlainValidator(_boolean)]
AnyObject = Annotated[dict[str, Any], PlainValidator(_object)]
UniqueStrings = Annotated[list[String], AfterValidator(_unique)]
NonEmptyUniqueStrings = Annotated[list[String], AfterValidator(_unique), AfterValidator(_non_empty)]
EnvValue = Integer | String | Annotated[list[String], AfterValidator(_non_empty)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- component schemas (WMS) ---


class WorkflowObject(Strict):
    workflow_id: String
    timestamp: Number
    priority: Integer
    deactivated: Literal["ABORTED", "FINISHED"] | None
    deactivated_ts: Number | None


class TaskDirectiveObject(Strict):
    task_id: String
    workflow_id: String
    cluster_locations: NonEmptyUniqueStrings
    task_image: String
    task_args: String
    task_env: dict[str, String]
    init_image: String
    init_args: String
    init_env: dict[str, String]
    timestamp: Number
    input_queues: UniqueStrings
    output_queues: UniqueStrings


class PilotConfig(Strict):
    tag: Annotated[String, AfterValidator(_pilot_tag)]
    image_source: Literal["cvmfs", "auto"]
    environment: dict[str, EnvValue]
    input_files: UniqueStrings


class WorkerConfig(Strict):
    do_transfer_worker_stdouterr: Boolean
    max_worker_runtime: Integer
    n_cores: Integer
    priority: Integer
    worker_disk: String | Integer
    worker_memory: String | Integer
    condor_requirements: String


class PhaseChange(Strict):
    target_phase: String
    timestamp: Number
    was_successful: Boolean
    source_event_time: Number | None
    source_entity: String
    context: String


Phase = Literal[
    "pre-mq-activation", "pre-launch", "pending-starter", "condor-submit", "pending-stopper", "condor-rm",
    "condor-complete",
]  # fmt: skip
CompoundStatuses = dict[str, dict[str, Integer]]


class TaskforceObject(Strict):
    """No cluster name: a taskforce names its HTCondor `schedd` (the cluster's submit host)."""

    taskforce_uuid: String
    task_id: String
    workflow_id: String
    timestamp: Number
    priority: Integer
    collector: String | None
    schedd: String
    n_workers: Integer | None
    pilot_config: PilotConfig
    worker_config: WorkerConfig
    cluster_id: Integer | None
    submit_dict: dict[str, String | Integer]
    job_event_log_fpath: String
    phase: Phase
    phase_change_log: list[PhaseChange]
    compound_statuses: CompoundStatuses
    top_task_errors: dict[str, Integer]


# --- request bodies (WMS) ---


class TaskRequest(Strict):
    cluster_locations: NonEmptyUniqueStrings
    task_image: String
    task_args: String
    task_env: dict[str, String] | None = None
    init_image: String | None = None
    init_args: String | None = None
    init_env: dict[str, String] | None = None
    input_queue_aliases: UniqueStrings
    output_queue_aliases: UniqueStrings
    pilot_config: PilotConfig | None = None
    worker_config: WorkerConfig
    n_workers: Integer | None = None


class WorkflowRequest(Strict):
    tasks: Annotated[list[TaskRequest], BeforeValidator(_unique_list), AfterValidator(_non_empty)]
    public_queue_aliases: UniqueStrings
    priority: Integer | None = None


class FindRequest(Strict):
    query: AnyObject
    projection: NonEmptyUniqueStrings | None = None
    after: String | None = None


class AddWorkersRequest(Strict):
    cluster_location: String
    n_workers: Integer | None


class TMSErrorRequest(Strict):
    error: String | None = None


class CondorCompleteRequest(Strict):
    condor_complete_ts: Integer


class StatusesRequest(Strict):
    top_task_errors_by_taskforce: dict[str, dict[str, Integer]] | None = None
    compound_statuses_by_taskforce: dict[str, CompoundStatuses] | None = None


# --- answers (WMS) ---


class WorkflowCreated(Strict):
    workflow: WorkflowObject
    task_directives: list[TaskDirectiveObject]
    taskforces: list[TaskforceObject]


class Deactivated(Strict):
    workflow_id: String
    n_taskforces: Integer


class TaskforceUUID(Strict):
    taskforce_uuid: String


class StatusResult(Strict):
    uuid: String
    status: String
    error: String | None = None


class StatusesAnswer(Strict):
    results: Annotated[list[StatusResult], AfterValidator(_non_empty)]


class PendingStarter(BaseModel):
    """The one answer the document leaves open (no additionalProperties: false): a taskforce with its
    task directive and mq-profiles, or `{}` when none is pending."""

    taskforce: TaskforceObject
    task_directive: TaskDirectiveObject
    mqprofiles: Annotated[list[AnyObject], AfterValidator(_non_empty)]


class Empty(Strict):
    pass


class ErrorResponse(Strict):
    code: Integer
    error: String


# --- MQS ---


class MQProfileObject(Strict):
    mqid: String
    workflow_id: String
    timestamp: Number
    alias: String
    is_public: Boolean
    is_activated: Boolean
    auth_token: String | None
    broker_type: String | None
    broker_address: String | None


class PublicMQProfiles(Strict):
    mqprofiles: list[MQProfileObject]


# --- checks ---


def _message(error: ValidationError) -> str:
    first = error.errors()[0]
    loc = [str(p) for p in first["loc"] if "[" not in str(p)]  # no union branch names
    if first["type"] == "extra_forbidden":
        where = ".".join(loc[:-1]) or "body"
        return f"{where}: additional properties are not allowed ({loc[-1]!r} was unexpected)"
    return f"{'.'.join(loc) or 'body'}: {first['msg'].removeprefix('Value error, ')}"


def check(model: type[BaseModel], doc: Any) -> Any:
    """`doc` itself if `model` allows it, else SchemaError naming the first violation."""
    try:
        model.model_validate(doc)
    except ValidationError as e:
        raise SchemaError(_message(e)) from None
    return doc


def check_partial(model: type[BaseModel], doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """Each key of `doc` is a field of `model` of its type (an object the document requires none of)."""
    for key, value in doc.items():
        info = model.model_fields.get(key)
        if info is None:
            raise SchemaError(f"additional properties are not allowed ({key!r} was unexpected)")
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]
            adapter.validate_python(value, strict=True)
        except ValidationError as e:
            raise SchemaError(f"{key}.{_message(e)}") from None
    return doc


def check_query_answer(kind: str, answer: Mapping[str, Any]) -> Mapping[str, Any]:
    """A `/v1/query/{kind}` answer: `{<kind>: [objects], next_after: str | null}`."""
    key = kind.replace("-", "_")
    model: dict[str, type[BaseModel]] = {
        "workflows": WorkflowObject,
        "taskforces": TaskforceObject,
        "task_directives": TaskDirectiveObject,
    }
    if set(answer) != {key, "next_after"} or not isinstance(answer[key], list):
        raise SchemaError(f"a query answer is {{{key}, next_after}}, not {sorted(answer)}")
    if answer["next_after"] is not None and not isinstance(answer["next_after"], str):
        raise SchemaError("next_after: is not of type 'string' or null")
    for doc in answer[key]:
        check_partial(model[key], doc)
    return answer
