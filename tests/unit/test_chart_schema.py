"""The chart's values.schema.json names exactly the settings the operator and the shim read (its
`settings` are generated from their settings classes: skyscan_local.chart_schema), so it can neither
refuse a real setting nor let a misspelt one through. Helm's own refusals: tests/integration/test_helm.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from api_shim.settings import ShimSettings
from skyscan_local import chart_schema
from skyscan_operator.settings import OperatorSettings

SCHEMA: dict[str, Any] = json.loads(chart_schema.SCHEMA_FILE.read_text())
SETTINGS: dict[str, Any] = SCHEMA["properties"]["settings"]


def test_the_schema_is_what_the_settings_classes_generate() -> None:
    assert chart_schema.main(["--check"]) == 0, "run `make chart-schema`"


def test_every_setting_in_the_schema_is_a_real_setting_and_every_real_one_is_there_or_the_charts() -> None:
    real = chart_schema.env_names(OperatorSettings) | chart_schema.env_names(ShimSettings)
    named = set(SETTINGS["properties"])
    assert SETTINGS["additionalProperties"] is False  # nothing else passes
    assert named <= real, named - real
    assert chart_schema.CHART_OWNED <= real, chart_schema.CHART_OWNED - real  # none stale
    assert named | chart_schema.CHART_OWNED == real, real - named - chart_schema.CHART_OWNED
    assert not named & chart_schema.CHART_OWNED


def test_each_setting_takes_its_type_its_bounds_and_the_string_spelling_it() -> None:
    props = SETTINGS["properties"]
    assert props["SKYSCAN_WORKERS"] | {"description": ""} == {
        "description": "",
        "type": ["integer", "string"],
        "pattern": chart_schema.INTEGER,
        "minimum": 1,  # OperatorSettings.workers: ge=1
    }
    assert props["SKYSCAN_BACKLOG_TICK_SECONDS"]["exclusiveMinimum"] == 0
    assert props["SKYSCAN_MAX_N_WORKERS"]["maximum"] == 100_000
    assert props["SKYSCAN_LOG_FORMAT"]["enum"] == ["text", "json"]
    assert props["SKYSCAN_SCANNER_RESTRICTED"]["type"] == ["boolean", "string"]
    assert props["SKYSCAN_KNOWN_CLUSTERS"]["additionalProperties"] == {"type": ["integer", "null"]}
    assert props["SKYSCAN_DEFAULT_WORKER_DISK"]["type"] == ["string", "integer"]  # bytes or "2GB"
    assert "format" not in json.dumps(SETTINGS)  # pydantic's `path` is no format Helm knows


@pytest.mark.parametrize(
    ("pattern", "kind", "texts"),
    [
        (chart_schema.INTEGER, int, ["4", "-1", "+7", "four", "4.5", "", "1_000x"]),
        (chart_schema.NUMBER, float, ["1", "0.5", ".5", "1e3", "2.", "fast", "1,5", "", "."]),
        (chart_schema.BOOLEAN, bool, ["true", "False", "TRUE", "0", "on", "no", "maybe", "", "truee"]),
    ],
)
def test_a_string_the_schema_takes_is_one_pydantic_reads(pattern: str, kind: type, texts: list[str]) -> None:
    taken = [text for text in texts if re.fullmatch(pattern, text)]
    assert taken and len(taken) < len(texts)  # the cases take some and refuse some
    for text in taken:
        TypeAdapter(kind).validate_python(text)  # raises if pydantic would refuse it
    for text in set(texts) - set(taken):
        if text in ("", "four", "fast", "maybe", "truee", "1,5", "."):  # what neither takes
            with pytest.raises(ValidationError):
                TypeAdapter(kind).validate_python(text)


def test_a_setting_of_a_shape_the_chart_cannot_pass_stops_the_generator() -> None:
    with pytest.raises(ValueError, match="union of constrained types"):
        chart_schema.value_schema({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]})
    with pytest.raises(ValueError, match="no chart value"):
        chart_schema.value_schema({"$ref": "#/$defs/Something"})
