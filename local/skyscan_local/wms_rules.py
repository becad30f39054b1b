"""EWMS's rules that the simulated WMS holds requests to, as the real one does: its ids, the MongoDB
query subset its clients use, the pilot tag's resolution on CVMFS, a workflow request's checks, and the
roles its routes admit. Pure: no state, no HTTP."""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from skyscan_local import ewms_schema as schema

FORBIDDEN_PILOT_ENV = (
    "EWMS_PILOT_TASK_IMAGE", "EWMS_PILOT_TASK_ARGS", "EWMS_PILOT_TASK_ENV_JSON",
    "EWMS_PILOT_INIT_IMAGE", "EWMS_PILOT_INIT_ARGS", "EWMS_PILOT_INIT_ENV_JSON",
)  # fmt: skip
ROLE_USER, ROLE_TMS = "user", "system-tms"


class SimError(Exception):
    """A refusal, answered with its status as EWMS answers it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def new_id(prefix: str, base: str | None = None) -> str:
    """The WMS's ids: WF-<hex epoch>-<8 hex>; a task's and a taskforce's extend their parent's."""
    return f"{prefix}-{base or f'{int(time.time()):x}'}-{secrets.token_hex(4)}"


def dig(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def matches(doc: dict[str, Any], query: dict[str, Any]) -> bool:
    """The MongoDB filter subset clients use: dotted-path equality, `$in`, `$nin`, `$eq`, `$ne`."""
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "$in": lambda v, a: v in a, "$nin": lambda v, a: v not in a,
        "$eq": lambda v, a: v == a, "$ne": lambda v, a: v != a,
    }  # fmt: skip
    for key, cond in query.items():
        value = dig(doc, key)
        if isinstance(cond, dict) and cond and all(k.startswith("$") for k in cond):
            for op, arg in cond.items():
                if op not in ops:
                    raise SimError(400, f"unsupported query operator {op}")
                if not ops[op](value, arg):
                    return False
        elif value != cond:
            return False
    return True


def resolve_pilot_tag(tag: str, catalog: list[str]) -> str:
    """As the WMS resolves pilot_config.tag on CVMFS: an existing tag is itself, "latest" the newest
    X.Y.Z; anything else is a 400. (Its resolver also takes "X" and "X.Y", which the schema refuses.)"""
    if tag in catalog:
        return tag
    semver = [t for t in catalog if re.fullmatch(r"\d+\.\d+\.\d+", t)]
    if tag == "latest" and semver:
        return max(semver, key=lambda t: tuple(int(p) for p in t.split(".")))
    raise SimError(
        400,
        "Pilot image tag not found. It is possible that the image has not finished uploading to its "
        "registry. If this error persists, contact an EWMS admin.",
    )


def phase_change(phase: str, at: float, who: str, context: str = "", ok: bool = True) -> dict[str, Any]:
    return {"target_phase": phase, "timestamp": at, "was_successful": ok, "source_event_time": None,
            "source_entity": who, "context": context}  # fmt: skip


def validate_workflow_request(body: Any, clusters: set[str] | dict[str, str]) -> schema.WorkflowRequest:
    """POST /v1/workflows as the WMS checks it: the schema, the reserved pilot env, known clusters."""
    try:
        request = schema.WorkflowRequest.model_validate(schema.check(schema.WorkflowRequest, body))
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None
    for i, task in enumerate(request.tasks):
        env = task.pilot_config.environment if task.pilot_config else {}
        for name in FORBIDDEN_PILOT_ENV:
            if name in env:
                raise SimError(
                    400, f"tasks[{i}].pilot_config.environment cannot include the attribute '{name}'"
                )
        for location in task.cluster_locations:
            if location not in clusters:
                raise SimError(400, f"condor cluster location not found: {location}")
    return request


def check_request(model: type[BaseModel], body: Any) -> Any:
    """A request body the model allows, else a 400 naming the field (as EWMS's validation answers)."""
    try:
        return schema.check(model, body)
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None


def check_partial_request(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise SimError(400, "JSON-encoded requests body must be a 'dict'")
    try:
        return schema.check_partial(model, body)
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None


def fake_jwt(claims: dict[str, Any], lifetime: float) -> str:
    """A syntactically valid, unsigned JWT (clients only read its `exp`)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({**claims, 'exp': int(time.time() + lifetime)})}.sig"


def roles_for(path: str, method: str) -> tuple[str, ...]:
    """The roles the real route admits (its auth decorator): the TMS's routes take system-tms, a few
    take either role, the rest a user."""
    if path.startswith("/v1/tms/") and method == "POST":
        return (ROLE_TMS,)
    either = ("/v1/query/workflows", "/v1/query/taskforces", "/v1/tms/", "/v1/taskforces/")
    if path.startswith(either) or path.endswith("/actions/add-workers"):
        return (ROLE_USER, ROLE_TMS)
    return (ROLE_USER,)
