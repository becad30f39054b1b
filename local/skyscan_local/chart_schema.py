"""The `settings` part of the Helm chart's values.schema.json, generated from the settings classes the
operator and the shim parse, so the chart accepts exactly the settings they read and refuses the rest
(a misspelt name, a word where a number goes). `python -m skyscan_local.chart_schema` (`make
chart-schema`) rewrites it; `--check` fails when the schema and the classes drifted apart.

A setting's value is what its environment variable holds: the chart passes a string as it is and
anything else as JSON (templates/_helpers.tpl), so each setting takes its type or a string spelling it
(`"20"` for 20, as `make up NODE=real` passes its timers); bounds apply to numbers, not to such strings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from api_shim.settings import ShimSettings
from skyscan_operator.settings import OperatorSettings

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "charts" / "skyscan" / "values.schema.json"
PREFIX = "SKYSCAN_"
CLASSES: tuple[type[BaseSettings], ...] = (OperatorSettings, ShimSettings)

# Settings the chart sets itself (from the release's names and its Pod specs) or other values own:
# refused in `settings`, where they would break what the chart wired (docs/operating/deploy.md).
CHART_OWNED = frozenset(
    {
        "SKYSCAN_NAMESPACE",  # the Pod's namespace
        "SKYSCAN_KUBECONFIG",  # in-cluster
        "SKYSCAN_LIVENESS_ENDPOINT",  # the operator's probes' port
        "SKYSCAN_METRICS_PORT",  # the operator's metrics port and Service
        "SKYSCAN_HOST",  # the shim listens on the Pod's address ...
        "SKYSCAN_PORT",  # ... on the port its probes, Service and NetworkPolicies name
        "SKYSCAN_TLS_CERT_FILE",  # shim.tls
        "SKYSCAN_TLS_KEY_FILE",
        "SKYSCAN_LEASE_NAME",  # named as the operator's Role allows
        "SKYSCAN_LEASE_NAMESPACE",
        "SKYSCAN_LEASE_IDENTITY",  # the Pod's name
        "SKYSCAN_SCANNER_SERVICE_ACCOUNT",  # the release's scanner ServiceAccount
        "SKYSCAN_OIDC_ISSUERS",  # oidc.issuers
        "SKYSCAN_UI_OIDC_ISSUER",  # oidc.dashboard
        "SKYSCAN_UI_OIDC_CLIENT_ID",
        "SKYSCAN_UI_OIDC_SCOPES",
        "SKYSCAN_WMS_ADDRESS",  # wms.*
        "SKYSCAN_WMS_OIDC_ISSUER",
        "SKYSCAN_WMS_CLIENT_ID",
        "SKYSCAN_WMS_CLIENT_SECRET",
        "SKYSCAN_ARCHIVE_DSN",  # archive.dsnSecret
        "SKYSCAN_TOKEN_FILE",  # tokens.secretName
        "SKYSCAN_PRESIGN_KEY_FILE",  # presignKey.secretName
    }
)

INTEGER = r"^[-+]?[0-9]+$"
NUMBER = r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
BOOLEAN = r"^([Tt]rue|TRUE|[Ff]alse|FALSE|[01]|yes|no|on|off)$"  # what pydantic reads as a bool
JSON_LIST, JSON_MAP = r"^\s*\[", r"^\s*\{"
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def env_names(settings: type[BaseSettings]) -> set[str]:
    return {PREFIX + name.upper() for name in settings.model_fields}


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A union of unconstrained types (`int | None`, `str | int`) as one `type` list."""
    if "anyOf" not in schema:
        return {k: v for k, v in schema.items() if k not in ("title", "format", "default")}
    branches = schema["anyOf"]
    if any(set(b) != {"type"} for b in branches):
        raise ValueError(f"a union of constrained types: {schema}")
    return {"type": [b["type"] for b in branches]}


def value_schema(field: dict[str, Any]) -> dict[str, Any]:
    """What the chart may pass for a setting whose pydantic JSON schema is `field` (None is no value:
    Helm drops a null, so the setting keeps its default)."""
    if "anyOf" in field:
        branches = [b for b in field["anyOf"] if b.get("type") != "null"]
        field = branches[0] if len(branches) == 1 else {"anyOf": branches}
    schema = _plain(field)
    kind = schema.get("type")
    bounds = {k: schema[k] for k in BOUNDS if k in schema}
    if "enum" in schema:
        return {"enum": schema["enum"]}
    if kind == "boolean":
        return {"type": ["boolean", "string"], "pattern": BOOLEAN}
    if kind in ("integer", "number"):
        return {"type": [kind, "string"], "pattern": INTEGER if kind == "integer" else NUMBER, **bounds}
    if kind == "string" or isinstance(kind, list):
        return {"type": kind}
    if kind == "array":
        return {"type": ["array", "string"], "items": _plain(schema["items"]), "pattern": JSON_LIST}
    if kind == "object":
        values = _plain(schema["additionalProperties"])
        return {"type": ["object", "string"], "additionalProperties": values, "pattern": JSON_MAP}
    raise ValueError(f"no chart value for {field}")


def settings_schema() -> dict[str, Any]:
    properties: dict[str, dict[str, Any]] = {}
    for settings in CLASSES:
        schema = settings.model_json_schema()
        for name, field in schema["properties"].items():
            if "$ref" in field:  # an enumeration of its own (pydantic describes it once, under $defs)
                field = {**schema["$defs"][field.pop("$ref").rsplit("/", 1)[1]], **field}
            variable = PREFIX + name.upper()
            if variable in CHART_OWNED:
                continue
            prop = {"description": field.get("description", ""), **value_schema(field)}
            if not prop["description"]:
                del prop["description"]
            seen = properties.setdefault(variable, prop)
            if {k: v for k, v in seen.items() if k != "description"} != value_schema(field):
                raise ValueError(f"{variable}: the components read it differently")
    return {
        "description": "Any other setting of the operator or the shim (docs/settings.md), named as its "
        "environment variable: strings as they are, anything else as JSON. Generated from their settings "
        "classes (make chart-schema); the ones other values own or the chart sets are refused.",
        "type": "object",
        "additionalProperties": False,
        "properties": dict(sorted(properties.items())),
    }


def render(current: str) -> str:
    """`current` (values.schema.json's text) with its `settings` generated anew."""
    schema = json.loads(current)
    schema["properties"]["settings"] = settings_schema()
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if values.schema.json has drifted")
    args = parser.parse_args(argv)
    current = SCHEMA_FILE.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(f"{SCHEMA_FILE} has drifted from the settings classes: run `make chart-schema`")
            return 1
        return 0
    SCHEMA_FILE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
