"""The generated parts of the documentation site (docs/): each component's settings, from the settings
classes it parses, and the REST routes and their bodies, from the shim's OpenAPI document. As the chart's
values.schema.json is generated from the same classes (skyscan_local.chart_schema), a page can neither
miss a setting nor show a stale default.

A generated part sits in a hand-written page between two markers, so prose and tables share a page:

    <!-- begin generated: settings operator -->
    ...
    <!-- end generated: settings operator -->

`python -m skyscan_local.docs_reference` rewrites every part; `--check` fails (exit 1) when a page has
drifted from the code, naming it (`make docs` runs the check before it builds the site).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from api_shim import openapi
from api_shim.routes import ROUTES
from api_shim.settings import ShimSettings
from skyscan_local.scanner_pod import ScannerSimSettings
from skyscan_local.wms_controls import SimulatorSettings
from skyscan_operator.settings import OperatorSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = re.compile(
    r"(<!-- begin generated: (?P<name>[a-z -]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
    re.DOTALL,
)
SETTINGS: dict[str, type[BaseSettings]] = {
    "operator": OperatorSettings,
    "shim": ShimSettings,
    "wms-simulator": SimulatorSettings,
    "scanner-simulator": ScannerSimSettings,
}
HTTP_METHODS = ("get", "put", "post", "patch", "delete")


# --- settings -------------------------------------------------------------------------------------------


def shown(value: object) -> str:
    """A default as the pages show it: JSON for structured values, `unset` for none."""
    if value is None:
        return "unset"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return '`""`' if value == "" else f"`{value}`"


def cell(text: str) -> str:
    """Text safe in a table cell: pipes escaped, and `<...>` outside code spans shown rather than taken
    for HTML."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def variable(settings: type[BaseSettings], name: str) -> str:
    alias = settings.model_fields[name].validation_alias
    if isinstance(alias, str):
        return alias
    return str(settings.model_config.get("env_prefix", "")) + name.upper()


def default_of(settings: type[BaseSettings], name: str) -> object:
    field = settings.model_fields[name]
    return field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]


def settings_table(settings: type[BaseSettings]) -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in settings.model_fields.items():
        meaning = cell((field.description or "").replace("\n", " "))
        rows.append(f"| `{variable(settings, name)}` | {shown(default_of(settings, name))} | {meaning} |")
    return "\n".join(rows) + "\n"


# --- the REST API -----------------------------------------------------------------------------------------


def schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def route_anchor(method: str, path: str) -> str:
    return method + "-" + (re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "root")


def kind(schema: dict[str, Any]) -> str:
    """A JSON schema as a short phrase: `string`, `list of integer`, a link to a named schema."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{schema_anchor(name)})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(dict.fromkeys(kind(branch) for branch in schema[union]))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    type_ = schema.get("type", "any")
    if isinstance(type_, list):
        return " or ".join(type_)
    if type_ == "array":
        return "list of " + kind(schema.get("items", {}))
    if type_ == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return "map of " + kind(values)
        if patterns := schema.get("patternProperties"):
            return "map of " + kind(next(iter(patterns.values())))
        return "object"
    bounds = [
        f"{word} {schema[key]}"
        for key, word in (
            ("minimum", "≥"),
            ("maximum", "≤"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if key in schema
    ]
    return str(type_) + (f" ({', '.join(bounds)})" if bounds else "")


def notes(prop: dict[str, Any]) -> str:
    said = [prop.get("description", "")]
    if "default" in prop:
        said.append(f"Default `{json.dumps(prop['default'])}`.")
    if prop.get("deprecated"):
        said.append("Deprecated.")
    return cell(" ".join(s for s in said if s))


def either(schema: dict[str, Any]) -> Iterator[str]:
    """The one-name-or-the-other rules `openapi.with_reference_names` adds, in words."""
    for rule in schema.get("allOf", []):
        if "oneOf" in rule:
            names = [f"`{branch['required'][0]}`" for branch in rule["oneOf"]]
            yield f"Exactly one of {' and '.join(names)}."
        elif "not" in rule:
            names = [f"`{name}`" for name in rule["not"]["required"]]
            yield f"At most one of {' and '.join(names)}."


def schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{schema_anchor(name)}}}", ""]
    if description := schema.get("description"):
        lines += [" ".join(description.split()), ""]
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        lines += [f"A {kind({k: v for k, v in schema.items() if k not in ('title', 'description')})}.", ""]
        return lines
    required = set(schema.get("required", []))
    lines += ["| field | type | required | notes |", "|---|---|---|---|"]
    for field, prop in properties.items():
        lines.append(
            f"| `{field}` | {cell(kind(prop))} | {'yes' if field in required else ''} | {notes(prop)} |"
        )
    lines.append("")
    if extra := schema.get("additionalProperties"):
        lines += [f"Other fields: {kind(extra) if isinstance(extra, dict) else 'any'}.", ""]
    if rules := list(either(schema)):
        lines += [" ".join(rules), ""]
    return lines


def route_section(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{#{route_anchor(method, path)}}}", "", op["summary"], ""]
    roles = op.get("x-roles")
    lines += [
        "Who: a bearer token with the role " + " or ".join(f"`{r}`" for r in roles) + "."
        if roles
        else "Who: anyone, no token.",
        "",
    ]
    parameters = [p for p in op["parameters"] if p["in"] == "query"]
    if parameters:
        lines += ["| query parameter | type | required | meaning |", "|---|---|---|---|"]
        for p in parameters:
            required = "yes" if p["required"] else ""
            meaning = cell(p.get("description", ""))
            lines.append(f"| `{p['name']}` | {p['schema']['type']} | {required} | {meaning} |")
        lines.append("")
    if body := op.get("requestBody"):
        needed = "required" if body["required"] else "optional"
        lines += [f"Body ({needed}): {kind(body['content']['application/json']['schema'])}.", ""]
    lines += ["| answer | body | meaning |", "|---|---|---|"]
    for status, answer in op["responses"].items():
        content = answer.get("content", {})
        shape = ", ".join(f"{kind(c['schema'])} (`{media}`)" for media, c in content.items()) or "none"
        lines.append(f"| {status} | {cell(shape)} | {cell(' '.join(answer['description'].split()))} |")
    lines.append("")
    return lines


def routes_reference() -> str:
    document = openapi.document(ROUTES)
    paths: dict[str, dict[str, Any]] = document["paths"]
    ops = [(m, p, op) for p, by_method in paths.items() for m, op in by_method.items() if m in HTTP_METHODS]
    lines = ["| route | who | what |", "|---|---|---|"]
    for method, path, op in ops:
        roles = ", ".join(op.get("x-roles", [])) or "anyone"
        link = f"[`{method.upper()} {path}`](#{route_anchor(method, path)})"
        lines.append(f"| {link} | {roles} | {cell(op['summary'])} |")
    lines += ["", "## Routes", ""]
    for method, path, op in ops:
        lines += route_section(method, path, op)
    lines += ["## Bodies and answers", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += schema_section(name, schema)
    return "\n".join(lines).rstrip("\n") + "\n"


# --- the pages --------------------------------------------------------------------------------------------


def generators() -> dict[str, Callable[[], str]]:
    parts: dict[str, Callable[[], str]] = {
        f"settings {name}": functools.partial(settings_table, cls) for name, cls in SETTINGS.items()
    }
    parts["rest routes"] = routes_reference
    return parts


def render(text: str, parts: dict[str, Callable[[], str]], used: set[str]) -> str:
    def fill(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in parts:
            raise ValueError(f"no generator for the generated part {name!r}")
        used.add(name)
        return m.group(1) + parts[name]() + m.group(4)

    return MARKER.sub(fill, text)


def pages() -> dict[Path, tuple[str, str]]:
    """Each page holding a generated part: its text now and as the code would have it."""
    parts, used = generators(), set[str]()
    found: dict[Path, tuple[str, str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        current = page.read_text()
        wanted = render(current, parts, used)
        if "<!-- begin generated:" in current:
            found[page] = (current, wanted)
    if missing := set(parts) - used:
        raise ValueError(f"generated parts in no page: {sorted(missing)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a generated part has drifted")
    args = parser.parse_args(argv)
    drifted = {page: wanted for page, (current, wanted) in pages().items() if current != wanted}
    if args.check:
        for page in drifted:
            print(f"{page} has drifted from the code: run `python -m skyscan_local.docs_reference`")
        return 1 if drifted else 0
    for page, wanted in drifted.items():
        page.write_text(wanted)
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
