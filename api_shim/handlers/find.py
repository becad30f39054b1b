"""Searching scans: the MongoDB-style find over manifests, and the backlog."""

from __future__ import annotations

from aiohttp import web

from api_shim import models, view
from api_shim.errors import bad_request
from api_shim.filters import FilterError, compile_filter
from api_shim.plumbing import SHIM, ok, parse_body


async def find_scans(request: web.Request) -> web.Response:
    body = await parse_body(request, models.FindBody)
    fields = view.find_projection(body.manifest_projection)
    refused = sorted(fields & view.FIND_DISALLOWED)
    if refused:
        raise bad_request(
            f"manifest_projection cannot include: {', '.join(refused)}",
            "These deprecated fields are too large to return from /scans/find.",
        )
    query = dict(body.filter)
    if "is_deleted" not in query and not body.include_deleted:
        query["is_deleted"] = False
    try:
        matches = compile_filter(query)
    except FilterError as e:
        raise bad_request(f"invalid filter: {e}") from None
    cache = request.app[SHIM].cache
    found = [m for m in (view.manifest(s) for s in cache) if matches(m)]
    found.sort(key=lambda m: m["scan_id"])
    return ok({"manifests": [view.project(m, fields) for m in found]})


async def backlog(request: web.Request) -> web.Response:
    entries = [e for e in (view.backlog_entry(s) for s in request.app[SHIM].cache.backlog()) if e]
    entries.sort(key=lambda e: (e["timestamp"], e["scan_id"]))
    return ok({"entries": entries})
