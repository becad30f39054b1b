"""The reference's wire names beside the interface's (api_shim.wire_names, and their OpenAPI form)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api_shim import openapi, rest_models
from api_shim.find.query import FilterError, parse
from api_shim.routes import ROUTES, SCAN_ID
from api_shim.wire_names import (
    INTERFACE,
    REFERENCE,
    Names,
    field_names,
    spoken,
    spoken_scan,
)
from skyscan.manifest import EVENT_PLACEHOLDER, WMS_TASK_PLACEHOLDER


def test_the_two_tables_are_one_anothers_inverse_and_no_name_is_both() -> None:
    assert {INTERFACE[theirs]: theirs for theirs in INTERFACE} == dict(REFERENCE)
    assert not set(REFERENCE) & set(INTERFACE)


def test_an_answer_speaks_one_dialect_in_the_same_order() -> None:
    doc = {"scan_id": "s", "wms_deactivated": None, "wms_workforce": {"n_running": 1}, "is_deleted": False}
    assert spoken(doc, Names.INTERFACE) is doc
    assert list(spoken(doc, Names.REFERENCE).items()) == [
        ("scan_id", "s"),
        ("ewms_deactivated", None),
        ("ewms_workforce", {"n_running": 1}),
        ("is_deleted", False),
    ]


def test_the_deprecated_placeholders_name_the_field_in_the_dialect() -> None:
    doc = {"wms_task": WMS_TASK_PLACEHOLDER, "event_live_json_dict": EVENT_PLACEHOLDER}
    assert spoken(doc, Names.REFERENCE) == {
        "ewms_task": "use 'ewms_workflow_id'",
        "event_i3live_json_dict": "use 'i3_event_id'",
    }
    event = {"event_live_json_dict": {"run": 1}, "wms_task": "use 'i3_event_id'"}
    assert spoken(event, Names.REFERENCE) == {
        "event_i3live_json_dict": {"run": 1},
        "ewms_task": "use 'i3_event_id'",
    }


def test_a_scan_speaks_in_its_manifest_and_its_result() -> None:
    got = spoken_scan({"sensor_event_id": "e"}, {"scan_result": {}, "is_final": True}, Names.REFERENCE)
    assert got == {"manifest": {"i3_event_id": "e"}, "result": {"skyscan_result": {}, "is_final": True}}
    assert spoken_scan({"sensor_event_id": "e"}, {"scan_result": {}}, Names.INTERFACE) == {
        "manifest": {"sensor_event_id": "e"},
        "result": {"scan_result": {}},
    }


def test_projections_take_either_name_of_a_field_and_of_a_path_into_it() -> None:
    assert field_names(
        ["ewms_workflow_id", "scan_id", "event_i3live_json_dict.value.run", "i3_event_idx"]
    ) == [
        "wms_workflow_id",
        "scan_id",
        "event_live_json_dict.value.run",
        "i3_event_idx",
    ]


def test_a_filter_names_fields_the_interfaces_way_wherever_it_names_them() -> None:
    query: dict[str, Any] = {
        "ewms_workflow_id": "wf",
        "$or": [{"i3_event_id": {"$in": ["i3_event_id"]}}, {"$nor": [{"ewms_address.host": "x"}]}],
        "$and": [{"scan_id": {"$not": {"$eq": "ewms_task"}}}, {"ewms_task": {"$exists": True}}],
        "classifiers": {"$elemMatch": {"i3_event_id": 1}},
    }
    assert parse(query) == parse(
        {
            "wms_workflow_id": "wf",
            "$or": [{"sensor_event_id": {"$in": ["i3_event_id"]}}, {"$nor": [{"wms_address.host": "x"}]}],
            "$and": [{"scan_id": {"$not": {"$eq": "ewms_task"}}}, {"wms_task": {"$exists": True}}],
            "classifiers": {"$elemMatch": {"i3_event_id": 1}},  # a value's own keys: not a manifest's
        }
    )


@pytest.mark.parametrize(
    ("query", "given"),
    [
        ({"i3_event_id": "a", "sensor_event_id": "b"}, "'i3_event_id' and 'sensor_event_id'"),
        ({"$or": [{"wms_address.x": 1, "ewms_address.x": 2}]}, "'wms_address.x' and 'ewms_address.x'"),
    ],
)
def test_a_filter_naming_one_field_both_ways_in_one_document_is_refused(
    query: dict[str, Any], given: str
) -> None:
    with pytest.raises(FilterError) as refused:
        parse(query)
    assert str(refused.value) == f"{given} name the same field: give one"


def test_a_body_takes_either_name_but_not_both() -> None:
    body = rest_models.PutResultBody.model_validate_json('{"skyscan_result": {"a": 1}, "is_final": true}')
    assert body.scan_result == {"a": 1}
    with pytest.raises(ValidationError, match="skyscan_result"):
        rest_models.PutResultBody.model_validate_json(
            '{"skyscan_result": {}, "scan_result": {}, "is_final": true}'
        )
    assert (
        rest_models.WorkflowIdBody.model_validate_json(
            '{"workflow_id": "w", "ewms_address": "a"}'
        ).wms_address
        == "a"
    )


def test_the_openapi_document_describes_both_names_one_or_the_other() -> None:
    document = openapi.document(ROUTES)
    schemas = document["components"]["schemas"]
    status = schemas["StatusResponse"]
    assert {"wms_deactivated", "ewms_deactivated"} <= set(status["properties"])
    assert "wms_deactivated" not in status["required"]
    assert {"oneOf": [{"required": ["wms_deactivated"]}, {"required": ["ewms_deactivated"]}]} in status[
        "allOf"
    ]
    request = schemas[next(k for k in schemas if k.startswith("ScanRequestBody"))]
    assert {"not": {"required": ["sensor_event_id", "i3_event_id"]}} in request["allOf"]
    for theirs in ("/ewms/workflow-id", "/ewms/workforce", "/ewms/taskforces", "/i3-event"):
        assert SCAN_ID + theirs in document["paths"]
    assert "_reference" in document["paths"][SCAN_ID + "/i3-event"]["get"]["operationId"]
    untouched = schemas["Workforce"]
    assert "allOf" not in untouched


def test_an_objects_schema_describes_each_renamed_field_under_both_names() -> None:
    """The pure rewrite itself (the document is built once a process: a test of it alone sees the first)."""
    untouched = {
        "type": "object",
        "properties": {"n_running": {"type": "integer"}},
        "required": ["n_running"],
    }
    assert openapi.with_reference_names(untouched) is untouched
    assert openapi.with_reference_names(plain := {"type": "string"}) is plain  # no properties at all
    schema = {
        "type": "object",
        "properties": {"scan_result": {"type": "object"}, "wms_address": {"type": "string"}, "is_final": {}},
        "required": ["scan_result", "is_final"],
        "allOf": [{"description": "kept"}],
    }
    described = openapi.with_reference_names(schema)
    assert described["properties"]["skyscan_result"] == {
        "type": "object",
        "description": "The reference's name for `scan_result`: either is taken; an answer has the caller's.",
    }
    assert described["properties"]["ewms_address"]["type"] == "string"
    assert set(described["properties"]) == {
        "scan_result",
        "wms_address",
        "is_final",
        "skyscan_result",
        "ewms_address",
    }
    assert described["required"] == ["is_final"] and described["type"] == "object"
    assert described["allOf"] == [
        {"description": "kept"},
        {"oneOf": [{"required": ["scan_result"]}, {"required": ["skyscan_result"]}]},
        {"not": {"required": ["wms_address", "ewms_address"]}},
    ]
    assert schema["required"] == ["scan_result", "is_final"] and "skyscan_result" not in schema["properties"]
    only_renamed = openapi.with_reference_names(
        {"properties": {"scan_result": {}}, "required": ["scan_result"]}
    )
    assert "required" not in only_renamed  # the oneOf says it
    optional = openapi.with_reference_names({"properties": {"sensor_event_id": {}}})
    assert "required" not in optional and optional["allOf"] == [
        {"not": {"required": ["sensor_event_id", "i3_event_id"]}}
    ]
