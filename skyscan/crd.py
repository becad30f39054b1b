"""Generate the CRDs (Scan, ScanSubscription) from the pydantic models (`python -m skyscan.crd [--check]`).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from skyscan import model, subscription

CRDS = Path(__file__).resolve().parents[1] / "crds"

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

SCAN_COLUMNS: list[dict[str, Any]] = [
    {"name": "State", "type": "string", "jsonPath": ".status.state"},
    {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
    {"name": "Position", "type": "integer", "jsonPath": ".status.backlog.position"},
    {"name": "Waiting", "type": "string", "jsonPath": ".status.backlog.waitReason", "priority": 1},
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


SUBSCRIPTION_COLUMNS: list[dict[str, Any]] = [
    {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
    {"name": "Last delivery", "type": "string", "jsonPath": ".status.lastDelivery.result"},
    {"name": "Pending", "type": "integer", "jsonPath": ".status.backlog"},
    {"name": "Failures", "type": "integer", "jsonPath": ".status.failures"},
    {"name": "Given up", "type": "integer", "jsonPath": ".status.givenUp", "priority": 1},
    {"name": "Owner", "type": "string", "jsonPath": ".spec.owner", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


@dataclass(frozen=True)
class Kind:
    """A custom resource of ours: its names, its spec and status models, its `kubectl get` columns."""

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    spec: type[model.KubeModel]
    status: type[model.KubeModel]
    columns: list[dict[str, Any]]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{model.GROUP}"

    @property
    def file(self) -> Path:
        return CRDS / f"{self.crd_name}.yaml"


SCAN = Kind(
    model.KIND,
    model.PLURAL,
    model.SINGULAR,
    model.SHORT_NAMES,
    model.ScanSpec,
    model.ScanStatus,
    SCAN_COLUMNS,
)
SUBSCRIPTION = Kind(
    subscription.KIND,
    subscription.PLURAL,
    subscription.SINGULAR,
    subscription.SHORT_NAMES,
    subscription.SubscriptionSpec,
    subscription.SubscriptionStatus,
    SUBSCRIPTION_COLUMNS,
)
KINDS = (SCAN, SUBSCRIPTION)
CRD_NAME, CRD_FILE = SCAN.crd_name, SCAN.file


def build_crd(of: Kind = SCAN) -> dict[str, Any]:
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {"spec": schema_of(of.spec), "status": schema_of(of.status)},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": of.crd_name},
        "spec": {
            "group": model.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": of.kind,
                "plural": of.plural,
                "singular": of.singular,
                "shortNames": of.short_names,
                "categories": ["skyscan"],
            },
            "versions": [
                {
                    "name": model.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": of.columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render(of: Kind = SCAN) -> str:
    header = "# Generated by `python -m skyscan.crd` from the models in skyscan/. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(of), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed CRD differs")
    args = parser.parse_args(argv)
    stale = [of.file for of in KINDS if not of.file.exists() or of.file.read_text() != render(of)]
    if args.check:
        for file in stale:
            print(f"{file} is stale: run `python -m skyscan.crd`", file=sys.stderr)
        return 1 if stale else 0
    CRDS.mkdir(parents=True, exist_ok=True)
    for of in KINDS:
        of.file.write_text(render(of))
        print(of.file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
