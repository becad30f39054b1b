"""A scan's payloads: its sensor event and its result."""

from __future__ import annotations

from aiohttp import web

from api_shim import rest_models, view
from api_shim.errors import bad_request, not_found
from api_shim.plumbing import SHIM, ok, ok_spoken, parse_body, query_bool, refuse_archived, scan_for


async def get_sensor_event(request: web.Request) -> web.Response:
    scan = await scan_for(request)
    event = await request.app[SHIM].scans.event(scan)
    if event is None:
        raise not_found("sensor event")
    return ok_spoken(request, {"sensor_event": event})


async def get_result(request: web.Request) -> web.Response:
    scan = await scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    return ok_spoken(request, await request.app[SHIM].scans.result(scan))


async def put_result(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, rest_models.PutResultBody)
    scan = await shim.scans.get(request.match_info["scan_id"])
    if scan is None:
        raise bad_request("unknown scan", "A result can only be stored for an existing scan.")
    refuse_archived(scan)
    if not body.scan_result:
        return ok({})
    await shim.writes.store_result(scan, body.scan_result, body.is_final)
    stored = {"scan_id": view.scan_id(scan), "scan_result": body.scan_result, "is_final": body.is_final}
    return ok_spoken(request, stored)
