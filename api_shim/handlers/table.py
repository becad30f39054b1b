"""GET /scans: the dashboard's table, a page of scans newest first (`api_shim.repository.table`).

Its query names what a person filters a table by, each turned into a find filter (one filter language,
`api_shim.find`): `run_id`, `event_id`, `classifier` (`key=value`, repeated; a value that reads as JSON
is that value, else the text), `since`/`until` (Unix seconds of creation), `state` (repeated: a whole
state or either half of one), `archived` and `deleted` (also those), `before` (the cursor a page's
`next` gave) and `limit`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from api_shim.errors import bad_request
from api_shim.find.query import parse
from api_shim.find.search import LIMITS
from api_shim.plumbing import SHIM, ok
from api_shim.repository import TableAsk

DEFAULT_ROWS, MAX_ROWS = 50, 200
MAX_CLASSIFIERS = 10
STATE = re.compile(r"[A-Z_]{1,64}")
KNOWN = {
    "run_id",
    "event_id",
    "classifier",
    "since",
    "until",
    "state",
    "archived",
    "deleted",
    "before",
    "limit",
}


def _one(query: MultiMapping[str], name: str) -> str | None:
    values = query.getall(name, [])
    if len(values) > 1:
        raise bad_request(f"{name}: give it once")
    return values[0] if values else None


def _integer(query: MultiMapping[str], name: str, low: int, high: int) -> int | None:
    text = _one(query, name)
    if text is None:
        return None
    if not re.fullmatch(r"-?\d{1,19}", text) or not low <= int(text) <= high:
        raise bad_request(f"{name}: an integer from {low} to {high}")
    return int(text)


def _seconds(query: MultiMapping[str], name: str) -> float | None:
    text = _one(query, name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise bad_request(f"{name}: Unix seconds, a finite number")
    return value


def _flag(query: MultiMapping[str], name: str) -> bool:
    text = _one(query, name)
    if text not in (None, "true", "false"):
        raise bad_request(f"{name}: true or false")
    return text == "true"


def _classifier(text: str) -> tuple[str, Any]:
    """(key, value): a value that reads as a JSON number, string, boolean or null is that, any other its text
    (never an object or a list, which a filter would read as operators)."""
    key, equals, value = text.partition("=")
    if not equals or not key or key.startswith("$") or "." in key:
        raise bad_request("classifier: key=value, a key without `.` or a leading `$`")
    try:
        read = json.loads(value)
    except ValueError:
        return key, value
    scalar = (
        read is None
        or isinstance(read, bool | int | str)
        or (isinstance(read, float) and math.isfinite(read))
    )
    return key, read if scalar else value


def table_filter(query: MultiMapping[str]) -> dict[str, Any]:
    """The find filter the table's query asks for."""
    doc: dict[str, Any] = {}
    for name in ("run_id", "event_id"):
        if (value := _integer(query, name, -(2**63), 2**63 - 1)) is not None:
            doc[f"event_metadata.{name}"] = value
    classifiers = query.getall("classifier", [])
    if len(classifiers) > MAX_CLASSIFIERS:
        raise bad_request(f"classifier: at most {MAX_CLASSIFIERS}")
    for key, value in map(_classifier, classifiers):
        doc[f"classifiers.{key}"] = value
    window = {
        op: t
        for op, name in (("$gte", "since"), ("$lt", "until"))
        if (t := _seconds(query, name)) is not None
    }
    if window:
        doc["timestamp"] = window
    if not _flag(query, "deleted"):
        doc["is_deleted"] = False
    return doc


def table_ask(query: MultiMapping[str]) -> TableAsk:
    """The page the query asks for (400 for anything it cannot mean)."""
    if unknown := sorted(set(query) - KNOWN):
        raise bad_request(f"unknown parameters: {', '.join(unknown)}", f"Known: {', '.join(sorted(KNOWN))}.")
    states = query.getall("state", [])
    if len(states) > MAX_CLASSIFIERS or not all(STATE.fullmatch(s) for s in states):
        raise bad_request("state: a state or either half of one (e.g. ABORTED, SCAN_HAS_FINAL_RESULT)")
    before = _one(query, "before")
    if before is not None and not 0 < len(before) <= 253:
        raise bad_request("before: a scan id")
    parsed = parse(table_filter(query), LIMITS)  # scalars at fixed paths: always a valid filter
    limit = _integer(query, "limit", 1, MAX_ROWS)
    return TableAsk(parsed, frozenset(states), _flag(query, "archived"), before, limit or DEFAULT_ROWS)


async def scans_table(request: web.Request) -> web.Response:
    found = await request.app[SHIM].scans.table(table_ask(request.query))
    body: Mapping[str, Any] = {"scans": found.rows, "next": found.next}
    return ok(body)
