"""HTTP plumbing every handler shares: the `Shim` state on the app, the `Route` declaration, and
request parsing (JSON bodies, query booleans, the scan named in the path) and answering."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from api_shim import rest_models, view
from api_shim.auth import Identity
from api_shim.bodies import body_of
from api_shim.errors import ApiError, bad_request, not_found
from api_shim.repository import Form, Scans, ScanWrites
from api_shim.settings import ShimSettings
from api_shim.wire_names import Names, spoken
from skyscan.io.kube import Kube
from skyscan.tags import TagCatalog

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)
IDENTITY = web.RequestKey("identity", Identity)
NAMES = web.RequestKey("names", Names)  # the wire names this request's answer speaks
FOUND = web.RequestKey("found", dict[str, Any])  # the scan named in the path: one archive query a request


def unvouched(shim: Shim) -> str | None:
    """Why the shim cannot vouch for its copy of the Scans (its watch broken beyond the bound), or None."""
    broken, bound = shim.scans.broken_for(), shim.settings.cache_broken_seconds
    if broken <= bound:
        return None
    return (
        f"The Scan watch has been broken for {broken:.0f} s (more than {bound:g} s): the API server does "
        "not answer, and this shim serves nothing it cannot vouch for."
    )


@dataclass
class Shim:
    """Everything a handler needs, stored on the app under `SHIM`."""

    settings: ShimSettings
    api: Kube
    scans: Scans  # where every scan is, and how it is read and changed
    writes: ScanWrites
    tags: TagCatalog

    @property
    def namespace(self) -> str:
        return self.settings.namespace


SHIM = web.AppKey("shim", Shim)


def encode(doc: Any) -> bytes:
    """A JSON document as the shim answers it (`aiohttp.web.json_response`'s encoding)."""
    return json.dumps(doc).encode()


@dataclass(frozen=True)
class Query:
    name: str
    kind: str  # "boolean" | "string" | "integer" | "number"
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
    # The answer's wire names whoever calls (the reference's paths); None: the caller's.
    names: Names | None = None


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
    if "Content-Encoding" not in request.headers and "Transfer-Encoding" not in request.headers:
        return  # most requests: no list made
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
        raise bad_request(rest_models.validation_reason(e)) from None


def body_flag(raw: bytes, name: str) -> bool:
    """A boolean flag from a JSON body, for checks that run before the body is validated."""
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return False
    return isinstance(body, dict) and body.get(name) is True


async def scan_for(request: web.Request, *, include_deleted: bool = True) -> dict[str, Any]:
    """The scan named in the path, live or archived (looked up once per request)."""
    scan = request.get(FOUND) or await request.app[SHIM].scans.get(request.match_info["scan_id"])
    if scan is None or (view.is_deleted(scan) and not include_deleted):
        raise not_found()
    request[FOUND] = scan
    return scan


def refuse_archived(scan: dict[str, Any]) -> None:
    """A write that only a running scan can take."""
    if Scans.is_archived(scan):
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


def ok_spoken(request: web.Request, doc: dict[str, Any]) -> web.Response:
    """`doc`, in the interface's names, answered in the request's wire names."""
    return ok(spoken(doc, names_of(request)))


_JSON = {"Content-Type": "application/json; charset=utf-8"}  # as `ok` answers; aiohttp copies it


def answer(body: bytes) -> web.Response:
    """An encoded JSON document, answered as `ok` answers one (its headers made once: the polled reads)."""
    return web.Response(body=body, headers=_JSON)


def names_of(request: web.Request) -> Names:
    """The wire names the answer speaks (the interface's for a public route)."""
    names: Names = request.get(NAMES, Names.INTERFACE)
    return names


def kept_form(request: web.Request, form: Form, *, include_deleted: bool = True) -> bytes | None:
    """The scan named in the path as `form` in the request's wire names, if it is kept encoded for the
    version the cache holds (404 for a deleted scan unless `include_deleted`); None: build it
    (`keep_form`)."""
    kept = request.app[SHIM].scans.kept(request.match_info["scan_id"], (*form, names_of(request)))
    if kept is None:
        return None
    if kept.deleted and not include_deleted:
        raise not_found()
    return kept.body


def keep_form(request: web.Request, scan: dict[str, Any], form: Form, doc: Any) -> bytes:
    """`doc`, the form `form` of `scan` in the request's wire names, encoded and kept for the next read
    of that version."""
    body = encode(doc)
    request.app[SHIM].scans.keep(scan, (*form, names_of(request)), body)
    return body


async def served(
    request: web.Request,
    form: Form,
    build: Callable[[dict[str, Any]], Any],
    *,
    include_deleted: bool = True,
) -> web.Response:
    """A read of the scan named in the path whose answer, `build(scan)` (in the interface's names),
    depends on nothing but that version of the Scan and `form`: the kept bytes, else built in the
    request's wire names, kept and answered."""
    body = kept_form(request, form, include_deleted=include_deleted)
    if body is None:
        scan = await scan_for(request, include_deleted=include_deleted)
        body = keep_form(request, scan, form, spoken(build(scan), names_of(request)))
    return answer(body)
