"""Generate the Scan CRD from the pydantic model (`python -m skyscan.crd [--check]`).

Pydantic emits JSON Schema; a CRD wants a *structural* OpenAPI v3 schema. `structural` bridges the
two: references are inlined, `Optional[X]` becomes `nullable`, and keywords Kubernetes lacks are
dropped (titles, `additionalProperties: false`, `propertyNames`, the key patterns of
`patternProperties`, whose value schema becomes `additionalProperties`). A union of scalars cannot be typed
structurally, so it becomes an untyped node with value rules that hold for any scalar and refuse
every list and object (`minItems: 1` with `maxItems: 0`, likewise for properties); its string
variant's `maxLength` and `pattern` apply as they are (to strings only). CEL cannot see untyped
values, which is why these are plain value rules.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from skyscan import model

CRD_NAME = f"{model.PLURAL}.{model.GROUP}"
CRD_FILE = Path(__file__).resolve().parents[1] / "crds" / f"{CRD_NAME}.yaml"

_SCALAR_TYPES = {"string", "boolean", "integer", "number", "null"}
_ANY_SCALAR = {
    "x-kubernetes-preserve-unknown-fields": True,
    "minItems": 1,
    "maxItems": 0,  # no array satisfies both
    "minProperties": 1,
    "maxProperties": 0,  # nor any object
}
_DROPPED = {
    "title",
    "$defs",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "anyOf",
    "$ref",
    "uniqueItems",
}

PRINTER_COLUMNS = [
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
    {"name": "Algo", "type": "string", "jsonPath": ".spec.recoAlgo"},
    {"name": "Tag", "type": "string", "jsonPath": ".spec.dockerTag", "priority": 1},
    {"name": "Workflow", "type": "string", "jsonPath": ".status.workflow.id", "priority": 1},
    {"name": "Deleted", "type": "boolean", "jsonPath": ".spec.deleted", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Translate one pydantic JSON Schema node into a Kubernetes structural schema node."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}

    out: dict[str, Any] = {}
    if "anyOf" in node:
        variants = node["anyOf"]
        non_null = [v for v in variants if v.get("type") != "null"]
        if all(v.get("type") in _SCALAR_TYPES for v in variants) and len(non_null) > 1:
            out.update(_ANY_SCALAR)
            out["nullable"] = len(non_null) < len(variants)
            out.update({k: v[k] for v in variants for k in ("maxLength", "minLength", "pattern") if k in v})
        else:
            (inner,) = non_null  # Optional[X]: the only union the model uses besides scalars
            out.update(structural(inner, defs))
            out["nullable"] = True

    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "default" and value is None:
            continue
        if key == "properties":
            out["properties"] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        else:
            out[key] = value

    extra = node.get("additionalProperties")
    if "patternProperties" in node:  # a map whose keys have a grammar: the keys' rule is the model's or CEL
        (extra,) = node["patternProperties"].values()
    if isinstance(extra, dict):
        out["additionalProperties"] = structural(extra, defs)
    return out


def schema_of(cls: type[model.KubeModel]) -> dict[str, Any]:
    raw = cls.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": schema_of(model.ScanSpec),
            "status": schema_of(model.ScanStatus),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": model.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": model.KIND,
                "plural": model.PLURAL,
                "singular": model.SINGULAR,
                "shortNames": model.SHORT_NAMES,
                "categories": ["skyscan"],
            },
            "versions": [
                {
                    "name": model.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated by `python -m skyscan.crd` from operator/skyscan/model.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed CRD differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not CRD_FILE.exists() or CRD_FILE.read_text() != text:
            print(f"{CRD_FILE} is stale: run `python -m skyscan.crd`", file=sys.stderr)
            return 1
        return 0
    CRD_FILE.parent.mkdir(parents=True, exist_ok=True)
    CRD_FILE.write_text(text)
    print(CRD_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
