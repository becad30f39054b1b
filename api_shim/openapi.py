"""The OpenAPI 3.1 document, generated from the route table and the pydantic models the routes
validate with (requests) and answer with (responses).

The routes come in as an argument (the OpenAPI handler passes the app's route table), so this module
never imports the table, whose handlers import it."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from api_shim import rest_models
from api_shim.plumbing import Route
from api_shim.wire_names import REFERENCE

TITLE = "Skyscan scan orchestration API"
VERSION = "2.x"
REF = "#/components/schemas/{model}"
_ERROR_TEXT = {
    400: "Argument validation failed or a request-level precondition was violated.",
    401: "No or invalid bearer token.",
    403: "The token lacks a role this route needs (presigned URL: bad, expired or another scan's signature).",
    404: "The scan (or its record) does not exist, or is deleted (see include_deleted).",
    413: "A payload does not fit even compressed, or a request, progress or metadata is over its limit.",
    422: "The request is well-formed but the scan's state disallows the action.",
    500: "Internal or upstream (WMS) failure.",
    503: "The Kubernetes API server (or the archive of finished scans) is unavailable; nothing was written."
    " For GET /scan/{scan_id}/events also: the shim serves its most event streams (poll GET .../status).",
    504: "The operator did not answer in time.",
}
_EVENT_STREAM_TEXT = (
    "Server-Sent Events. `event: scan` messages: `id:` the Scan's resourceVersion, `data:` one JSON line"
    " `{scan_id, status (as GET /scan/{scan_id}/status), progress (as the manifest's, or null), result:"
    " null or {is_final}}`; the current state first, then the latest state after each change (a slow"
    " reader skips versions, never queues them); a `: keepalive` comment while idle; once the scan has"
    " ended, `event: end` with `data: {}`, and the stream closes. Closed without `end`: follow again."
)


def _schemas(routes: tuple[Route, ...]) -> tuple[dict[Any, Any], dict[str, Any]]:
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(rest_models.Error, "serialization")]
    for route in routes:
        if route.body:
            wanted.append((route.body, "validation"))
        if route.response:
            wanted.append((route.response, "serialization"))
    keys, top = models_json_schema(list(dict.fromkeys(wanted)), ref_template=REF)
    return dict(keys), top.get("$defs", {})


def with_reference_names(schema: dict[str, Any]) -> dict[str, Any]:
    """An object's schema where each field the reference names otherwise is described under both names,
    one or the other present (`api_shim.wire_names`): requests take either, answers give the caller's."""
    properties: dict[str, Any] = schema.get("properties", {})
    renamed = {ours: REFERENCE[ours] for ours in properties if ours in REFERENCE}
    if not renamed:
        return schema
    required = schema.get("required", [])
    described = {k: v for k, v in schema.items() if k != "required"}
    described["properties"] = dict(properties)
    either: list[dict[str, Any]] = []
    for ours, theirs in renamed.items():
        described["properties"][theirs] = {
            **properties[ours],
            "description": f"The reference's name for `{ours}`: either is taken; an answer has the caller's.",
        }
        if ours in required:
            either.append({"oneOf": [{"required": [ours]}, {"required": [theirs]}]})
        else:
            either.append({"not": {"required": [ours, theirs]}})
    if kept := [name for name in required if name not in renamed]:
        described["required"] = kept
    described["allOf"] = [*schema.get("allOf", []), *either]
    return described


@cache
def _document(routes: tuple[Route, ...]) -> dict[str, Any]:
    refs, components = _schemas(routes)
    components = {name: with_reference_names(schema) for name, schema in components.items()}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__ + ("_reference" if route.names else ""),
            "parameters": [],
            "responses": {},
        }
        if "{scan_id}" in route.path:
            op["parameters"].append(
                {"name": "scan_id", "in": "path", "required": True, "schema": {"type": "string"}}
            )
        for q in route.query:
            op["parameters"].append(
                {
                    "name": q.name,
                    "in": "query",
                    "required": q.required,
                    "description": q.description,
                    "schema": {"type": q.kind},
                }
            )
        if route.body:
            op["requestBody"] = {
                "required": any(f.is_required() for f in route.body.model_fields.values()),
                "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
            }
        ok_schema = refs[(route.response, "serialization")] if route.response else {"type": "object"}
        if route.content_type != "application/json":
            ok_schema = {"type": "string"}
        ok_text = _EVENT_STREAM_TEXT if route.content_type == "text/event-stream" else "OK"
        op["responses"]["200"] = {
            "description": ok_text,
            "content": {route.content_type: {"schema": ok_schema}},
        }
        statuses = set(route.errors) | ({401, 403} if route.roles else set())
        if route.query or route.body:
            statuses.add(400)  # a malformed query value or body
        if route.redirect:
            op["responses"]["302"] = {"description": "GET of a replaced scan by a user: see Location."}
            if route.method != "GET":
                op["responses"]["307"] = {"description": "Same, method kept: see Location."}
        error_ref = refs[(rest_models.Error, "serialization")]
        for status in sorted(statuses):
            op["responses"][str(status)] = {
                "description": _ERROR_TEXT[status],
                "content": {"application/json": {"schema": error_ref}},
            }
        if route.roles:
            op["security"] = [{"bearer": []}]
            op["x-roles"] = sorted(route.roles)
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "version": VERSION},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def document(routes: tuple[Route, ...]) -> dict[str, Any]:
    return _document(routes)
