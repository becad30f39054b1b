"""A scan as a whole: launch, its request, rescan, read, soft delete, status and logs."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from api_shim import models, view
from api_shim.errors import not_found
from api_shim.launch import Defaults, normalise
from api_shim.plumbing import SHIM, Shim, ok, parse_body, query_bool, scan_for
from api_shim.settings import ShimSettings
from skyscan import manifest


def _defaults(s: ShimSettings) -> Defaults:
    return Defaults(
        s.default_scanner_server_memory,
        s.default_worker_memory,
        s.default_worker_disk,
        s.known_clusters,
        s.min_tag,
        frozenset(s.scanner_env_allowed),
        s.max_n_workers,
    )


def _projected(scan: dict[str, Any], projection: str | list[str]) -> dict[str, Any]:
    return view.project(manifest.of(scan), view.body_projection(projection))


def _logs_url(shim: Shim, scan: dict[str, Any]) -> str | None:
    return view.logs_url(scan, shim.settings.logs_url_template, shim.namespace)


async def launch_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.ScanRequestBody)
    launch = normalise(body, await shim.tags.tags(), _defaults(shim.settings))
    scan = await shim.writes.launch(launch)
    return ok(_projected(scan, body.manifest_projection))


async def get_scan_request(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    scan = await shim.scans.get(request.match_info["scan_id"])
    if scan is None:
        raise not_found("scan request")
    return ok(view.scan_request(scan, await shim.scans.rescan_ids(view.scan_id(scan))))


async def rescan(request: web.Request) -> web.Response:
    body = await parse_body(request, models.RescanBody)
    new = await request.app[SHIM].writes.rescan(
        await scan_for(request), abort_first=body.abort_first, replace_scan=body.replace_scan
    )
    return ok(_projected(new, body.manifest_projection))


async def get_scan(request: web.Request) -> web.Response:
    scan = await scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    return ok({"manifest": manifest.of(scan), "result": await request.app[SHIM].scans.result(scan)})


async def delete_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.DeleteBody)
    scan = await shim.writes.delete(await scan_for(request), delete_completed_scan=body.delete_completed_scan)
    result = await shim.scans.result(scan)
    return ok({"manifest": _projected(scan, body.manifest_projection), "result": result})


async def get_status(request: web.Request) -> web.Response:
    scan = await scan_for(request)
    return ok(view.scan_status(scan, _logs_url(request.app[SHIM], scan)))


async def get_logs(request: web.Request) -> web.Response:
    scan = await scan_for(request)
    return ok({"scanner_server": {"url": _logs_url(request.app[SHIM], scan)}})
