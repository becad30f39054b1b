"""HTTP plumbing every handler shares: the `Shim` state on the app, the `Route` declaration, and
request parsing (JSON bodies, query booleans, the scan named in the path) and answering."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from api_shim import models, view
from api_shim.auth import Identity
from api_shim.bodies import body_of
from api_shim.cache import ScanCache
from api_shim.errors import ARCHIVE_ERRORS, ApiError, archive_unavailable, bad_request, not_found
from api_shim.freshness import Freshness
from api_shim.settings import ShimSettings
from api_shim.store import ScanStore
from api_shim.tags import TagCatalog
from api_shim.writes import ScanWrites
from skyscan import payloads
from skyscan.archive import Archive
from skyscan.kube import Kube
from skyscan.names import is_object_name
from skyscan.status import ScanRecord

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)
IDENTITY = web.RequestKey("identity", Identity)
FOUND = web.RequestKey("found", dict[str, Any])  # the scan named in the path: one archive query a request
INLINE_DECODE_BYTES = 64 * 1024  # a larger archived payload is unpacked in a thread


async def unpacked(data: bytes) -> Any:
    """An archived payload (gzip JSON, as `skyscan.payloads` stores it), parsed."""

    def unpack() -> Any:
        return json.loads(gzip.decompress(data))

    return unpack() if len(data) <= INLINE_DECODE_BYTES else await asyncio.to_thread(unpack)


def unvouched(shim: Shim) -> str | None:
    """Why the shim cannot vouch for its copy of the Scans (its watch broken beyond the bound), or None."""
    broken, bound = shim.cache.broken_for(), shim.settings.cache_broken_seconds
    if broken <= bound:
        return None
    return (
        f"The Scan watch has been broken for {broken:.0f} s (more than {bound:g} s): the API server does "
        "not answer, and this shim serves nothing it cannot vouch for."
    )


def archived(scan: dict[str, Any]) -> bool:
    return ScanRecord(scan).archived_at is not None


@dataclass
class Shim:
    """Everything a handler needs, stored on the app under `SHIM`."""

    settings: ShimSettings
    api: Kube
    cache: ScanCache
    store: ScanStore
    writes: ScanWrites
    tags: TagCatalog
    freshness: Freshness
    archive: Archive | None = None  # finished scans moved out of the cluster; None: live-only
    events: OrderedDict[str, Any] = field(default_factory=OrderedDict)  # immutable, so cacheable

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    async def lookup(self, scan_id: str) -> dict[str, Any] | None:
        """The scan, live or archived. The cache is read first (then, for a scan created a moment ago
        through another replica, the API server: `Freshness.missing`), then the archive: the operator
        commits the archived copy before it deletes the Scan, and the cache drops a Scan only on seeing
        that deletion, so a scan archived between the two reads is still found in the second."""
        if not is_object_name(scan_id):  # a NUL, a newline, a capital: no object has such a name
            return None
        scan = self.cache.get(scan_id) or await self.freshness.missing(scan_id)
        if scan is None and self.archive is not None:
            try:
                scan = await self.archive.get(self.namespace, scan_id)
            except ARCHIVE_ERRORS as e:  # an ApiError: a stream that follows the scan reads it too
                raise archive_unavailable(e) from None
        return scan

    async def rescan_ids(self, scan_id: str) -> list[str]:
        """Every scan whose rescanOf chain leads to `scan_id`, in either store, in id (= creation)
        order. Live descendants come transitively from the cache; the archive answers one generation
        per query, so each round follows the archived children found by the previous one."""
        found: set[str] = set()
        frontier = [scan_id]
        while frontier:
            live = {child for parent in frontier for child in self.cache.rescan_ids(parent)}
            gone: set[str] = set()
            if self.archive is not None:
                gone = set(await self.archive.rescans_of(self.namespace, [*frontier, *sorted(live)]))
            frontier = sorted(gone - found - live)
            found |= live | gone
        return sorted(found)

    async def event(self, scan: dict[str, Any]) -> Any | None:
        """A scan's sensor event: from its ConfigMap, or from the archive (first, for an archived scan;
        else only when the ConfigMap is gone, as it is once every scan using it is archived)."""
        sensor_event_id = scan["spec"]["sensorEventId"]
        if sensor_event_id in self.events:
            self.events.move_to_end(sensor_event_id)
            return self.events[sensor_event_id]
        payload = None
        if archived(scan):
            payload = await self._archived_event(sensor_event_id)
        if payload is None:
            payload = await payloads.read_event(self.api, self.namespace, sensor_event_id)
        if payload is None and not archived(scan):
            payload = await self._archived_event(sensor_event_id)
        if payload is not None:
            self.events[sensor_event_id] = payload
            while len(self.events) > 16:
                self.events.popitem(last=False)
        return payload

    async def _archived_event(self, sensor_event_id: str) -> Any | None:
        data = None if self.archive is None else await self.archive.event(sensor_event_id)
        return None if data is None else await unpacked(data)

    async def result(self, scan: dict[str, Any]) -> dict[str, Any]:
        """The REST result of a scan: its stored payload, or {} when there is none."""
        record = ScanRecord(scan)
        if not record.has_result:
            return {}
        payload = None
        if not archived(scan):
            payload = await payloads.read_result(self.api, self.namespace, record.name)
        if payload is None and self.archive is not None:  # archived, maybe since the scan was read
            data = await self.archive.result(self.namespace, record.name)
            payload = None if data is None else await unpacked(data)
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
    content_type: str = "application/json"  # of the 200 answer; any other is a string


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


# How the shim's HTTP server runs (`web.run_app`, a test's server): request bodies are never inflated.
# aiohttp would inflate a compressed body on the event loop as it arrives, before any handler or
# authentication ran (a 40 KB gzip body is 40 MB of work and memory); REST clients send JSON as it is.
SERVER_OPTIONS: dict[str, Any] = {"auto_decompress": False}


def _codings(request: web.BaseRequest, header: str) -> list[str]:
    """Every coding a header names, over all its lines, lowercased."""
    return [c.strip().lower() for line in request.headers.getall(header, ()) for c in line.split(",")]


def refuse_encoded_body(request: web.BaseRequest) -> None:
    """A compressed request body is refused (415 naming the coding) before anything else is done with
    the request, and a transfer coding but chunked (400): the body would reach the handler undecoded."""
    if refused := [c for c in _codings(request, "Content-Encoding") if c != "identity"]:
        raise ApiError(
            415,
            "unsupported content encoding",
            f"Content-Encoding {refused[0][:40]!r} is not accepted: request bodies are accepted uncompressed "
            "only; send no Content-Encoding (or identity).",
            {"Accept-Encoding": "identity"},
        )
    if refused := [c for c in _codings(request, "Transfer-Encoding") if c != "chunked"]:
        raise bad_request(
            "unsupported transfer encoding",
            f"Transfer-Encoding {refused[0][:40]!r} is not accepted: only chunked is.",
        )


async def parse_body(request: web.Request, model: type[M]) -> M:
    raw = await body_of(request)
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


async def scan_for(request: web.Request, *, include_deleted: bool = True) -> dict[str, Any]:
    """The scan named in the path, live or archived (looked up once per request)."""
    scan = request.get(FOUND) or await request.app[SHIM].lookup(request.match_info["scan_id"])
    if scan is None or (view.is_deleted(scan) and not include_deleted):
        raise not_found()
    request[FOUND] = scan
    return scan


def refuse_archived(scan: dict[str, Any]) -> None:
    """A write that only a running scan can take."""
    if archived(scan):
        raise bad_request(
            "scan is archived",
            f"Scan {view.scan_id(scan)} is finished and archived; only reads, rescan and delete apply.",
        )


async def live_scan_for(request: web.Request) -> dict[str, Any]:
    """The scan named in the path, for writes that only a live scan takes (400 if it is archived)."""
    scan = await scan_for(request)
    refuse_archived(scan)
    return scan


def ok(body: Any) -> web.Response:
    return web.json_response(body)
