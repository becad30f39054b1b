"""HTTP plumbing every handler shares: the `Shim` state on the app, the `Route` declaration, and
request parsing (JSON bodies, query booleans, the scan named in the path) and answering."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from kubernetes_asyncio import client
from pydantic import BaseModel, ValidationError

from api_shim import models, view
from api_shim.auth import Identity
from api_shim.cache import ScanCache
from api_shim.errors import bad_request, not_found
from api_shim.settings import ShimSettings
from api_shim.store import ScanStore
from api_shim.tags import TagCatalog
from api_shim.writes import ScanWrites
from skyscan import payloads
from skyscan.status import ScanRecord

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
IDENTITY = web.RequestKey("identity", Identity)


@dataclass
class Shim:
    """Everything a handler needs, stored on the app under `SHIM`."""

    settings: ShimSettings
    api: client.ApiClient
    cache: ScanCache
    store: ScanStore
    writes: ScanWrites
    tags: TagCatalog
    events: OrderedDict[str, Any] = field(default_factory=OrderedDict)  # immutable, so cacheable

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    async def event(self, sensor_event_id: str) -> Any | None:
        if sensor_event_id in self.events:
            self.events.move_to_end(sensor_event_id)
            return self.events[sensor_event_id]
        payload = await payloads.read_event(self.api, self.namespace, sensor_event_id)
        if payload is not None:
            self.events[sensor_event_id] = payload
            while len(self.events) > 16:
                self.events.popitem(last=False)
        return payload

    async def result(self, scan: dict[str, Any]) -> dict[str, Any]:
        """The REST result of a scan: its stored payload, or {} when there is none."""
        record = ScanRecord(scan)
        if not record.has_result:
            return {}
        payload = await payloads.read_result(self.api, self.namespace, record.name)
        if payload is None:
            return {}
        return {"scan_id": record.name, "scan_result": payload, "is_final": record.has_final_result}


SHIM = web.AppKey("shim", Shim)


@dataclass(frozen=True)
class Query:
    name: str
    kind: str  # "boolean" | "string" | "integer"
    description: str
    required: bool = False


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    roles: frozenset[str] | None  # None: public
    response: type[BaseModel] | None  # None: an open object
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    errors: tuple[int, ...] = ()
    redirect: bool = False


ROUTE_TABLE = web.AppKey("routes", tuple[Route, ...])  # the served routes, for the OpenAPI document
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise bad_request(f"'{name}': must be a boolean (true/false, 1/0, yes/no)")


def query_bool(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    return False if value is None else parse_bool(name, value)


async def parse_body(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    try:
        return model.model_validate_json(raw if raw.strip() else b"{}")
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise bad_request(
                "request body is not valid JSON", str(first.get("ctx", {}).get("error", ""))
            ) from None
        if first["type"] == "model_type" and not first["loc"]:
            raise bad_request("request body must be a JSON object") from None
        raise bad_request(models.validation_reason(e)) from None


def body_flag(raw: bytes, name: str) -> bool:
    """A boolean flag from a JSON body, for checks that run before the body is validated."""
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return False
    return isinstance(body, dict) and body.get(name) is True


def scan_for(request: web.Request, *, include_deleted: bool = True) -> dict[str, Any]:
    scan = request.app[SHIM].cache.get(request.match_info["scan_id"])
    if scan is None or (view.is_deleted(scan) and not include_deleted):
        raise not_found()
    return scan


def ok(body: Any) -> web.Response:
    return web.json_response(body)
