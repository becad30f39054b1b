"""A scan's payloads: its sensor event and its result."""

from __future__ import annotations

from aiohttp import web

from api_shim import models, view
from api_shim.errors import bad_request, not_found
from api_shim.plumbing import SHIM, names_of, ok, parse_body, query_bool, refuse_archived, scan_for
from api_shim.wire_names import spoken


async def get_sensor_event(request: web.Request) -> web.Response:
    scan = await scan_for(request)
    event = await request.app[SHIM].scans.event(scan)
    if event is None:
        raise not_found("sensor event")
    return ok(spoken({"sensor_event": event}, names_of(request)))


async def get_result(request: web.Request) -> web.Response:
    scan = await scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    return ok(spoken(await request.app[SHIM].scans.result(scan), names_of(request)))


async def put_result(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.PutResultBody)
    scan = await shim.scans.get(request.match_info["scan_id"])
    if scan is None:
        raise bad_request("unknown scan", "A result can only be stored for an existing scan.")
    refuse_archived(scan)
    if not body.scan_result:
        return ok({})
    await shim.writes.store_result(scan, body.scan_result, body.is_final)
    stored = {"scan_id": view.scan_id(scan), "scan_result": body.scan_result, "is_final": body.is_final}
    return ok(spoken(stored, names_of(request)))
