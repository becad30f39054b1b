"""The CRD is generated from the model; the committed YAML must match and be structural."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from skyscan import crd, model


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    if not isinstance(node, dict):
        return []
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        found += walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += walk(node[key], f"{path}[{key}]")
    return found


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crds_match_the_models() -> None:
    for of in crd.KINDS:
        assert of.file.read_text() == crd.render(of), "crds/ drifted: run `make crds`"
    assert crd.main(["--check"]) == 0


def test_schema_is_structural() -> None:
    for path, node in walk(spec_schema()):
        assert not {"$ref", "anyOf", "oneOf", "title", "propertyNames", "uniqueItems"} & node.keys(), path
        typed = "type" in node or node.get("x-kubernetes-preserve-unknown-fields")
        assert typed, f"{path} has no type"
        if "properties" in node:
            assert not isinstance(node.get("additionalProperties"), bool), path


def test_optional_becomes_nullable_and_scalar_union_refuses_lists_and_objects() -> None:
    spec = spec_schema()["properties"]["spec"]["properties"]
    assert spec["rescanOf"] == {
        "type": "string",
        "nullable": True,
        "description": "The scan this one rescans.",
    }
    value = spec["classifiers"]["additionalProperties"]
    assert value["x-kubernetes-preserve-unknown-fields"] is True and "type" not in value
    assert value["nullable"] is True and value["maxLength"] == 25
    assert value["minItems"] > value["maxItems"] and value["minProperties"] > value["maxProperties"]
    assert spec["scannerServerEnvFromUser"]["additionalProperties"]["maxLength"] == 4096


def test_spec_defaults_are_the_reference_ones() -> None:
    spec = spec_schema()["properties"]["spec"]["properties"]
    assert spec["scannerServerMemoryBytes"]["default"] == 1_024_000_000
    assert spec["workerMemoryBytes"]["default"] == 8_000_000_000
    assert spec["workerDiskBytes"]["default"] == 1_000_000_000
    assert spec["predictiveScanningThreshold"]["default"] == 1.0


def test_rendered_yaml_round_trips() -> None:
    assert yaml.safe_load(crd.render()) == crd.build_crd()


def minimal_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "dockerTag": "4.1.2",
        "recoAlgo": "millipede_wilks",
        "sensorEventId": "ev1",
        "nsides": {"8": 0},
        "realOrSimulatedEvent": "real",
        "maxPixelRecoTime": 600,
        "requestClusters": [{"location": "osg", "nWorkers": 10}],
    }
    return {**spec, **changes}


def test_model_speaks_camel_case_and_applies_defaults() -> None:
    spec = model.ScanSpec.model_validate(minimal_spec())
    wire = spec.to_kube()
    assert wire["workerMemoryBytes"] == model.DEFAULT_WORKER_MEMORY_BYTES
    assert wire["requestClusters"] == [{"location": "osg", "nWorkers": 10}]
    assert spec.real_or_simulated_event.is_real


@pytest.mark.parametrize(
    "changes",
    [
        {"classifiers": {"k": "x" * 26}},
        {"classifiers": {"k" * 26: "x"}},
        {"classifiers": {"rescan": True}},
        {"classifiers": {"origin_scan_id": "abc"}},
        {"scannerServerEnvFromUser": {"A": ["list"]}},
        {"workerDiskBytes": -1},
        {"requestClusters": []},
        {"realOrSimulatedEvent": "maybe"},
    ],
)
def test_model_rejects_what_the_crd_rejects(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.ScanSpec.model_validate(minimal_spec(**changes))
