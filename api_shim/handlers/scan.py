"""A scan as a whole: launch, its request, rescan, read, soft delete, status and logs."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from api_shim import rest_models, view
from api_shim.errors import not_found
from api_shim.launch import Defaults, normalise
from api_shim.plumbing import (
    SHIM,
    Shim,
    answer,
    encode,
    keep_form,
    kept_form,
    names_of,
    ok,
    ok_spoken,
    parse_body,
    query_bool,
    scan_for,
    served,
)
from api_shim.settings import ShimSettings
from api_shim.wire_names import spoken, spoken_scan
from skyscan import manifest
from skyscan.scan_record import ScanRecord


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
    """The manifest as a body's `manifest_projection` asks for it (in the interface's names)."""
    return view.project(manifest.of(scan), view.body_projection(projection))


def _logs_url(shim: Shim, scan: dict[str, Any]) -> str | None:
    return view.logs_url(scan, shim.settings.logs_url_template, shim.namespace)


async def launch_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, rest_models.ScanRequestBody)
    launch = normalise(body, await shim.tags.tags(), _defaults(shim.settings))
    scan = await shim.writes.launch(launch)
    return ok_spoken(request, _projected(scan, body.manifest_projection))


async def get_scan_request(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    name = request.match_info["scan_id"]
    live = shim.scans.is_live(name)  # a live scan is unpacked only when its form is not kept
    scan = None if live else await shim.scans.get(name)
    if not live and scan is None:
        raise not_found("scan request")
    ids = await shim.scans.rescan_ids(name)
    form = ("request", *ids)  # its rescans are other Scans: part of the form
    if (body := kept_form(request, form)) is None:
        scan = scan or await shim.scans.get(name)
        if scan is None:
            raise not_found("scan request")
        body = keep_form(request, scan, form, spoken(view.scan_request(scan, ids), names_of(request)))
    return answer(body)


async def rescan(request: web.Request) -> web.Response:
    body = await parse_body(request, rest_models.RescanBody)
    new = await request.app[SHIM].writes.rescan(
        await scan_for(request), abort_first=body.abort_first, replace_scan=body.replace_scan
    )
    return ok_spoken(request, _projected(new, body.manifest_projection))


async def get_scan(request: web.Request) -> web.Response:
    include_deleted = query_bool(request, "include_deleted")
    if (body := kept_form(request, ("scan",), include_deleted=include_deleted)) is not None:
        return answer(body)
    scan = await scan_for(request, include_deleted=include_deleted)
    doc = spoken_scan(manifest.of(scan), await request.app[SHIM].scans.result(scan), names_of(request))
    if ScanRecord(scan).has_result:  # a payload of its own, read anew each time
        return answer(encode(doc))
    return answer(keep_form(request, scan, ("scan",), doc))


async def delete_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, rest_models.DeleteBody)
    scan = await shim.writes.delete(await scan_for(request), delete_completed_scan=body.delete_completed_scan)
    result = await shim.scans.result(scan)
    return ok(spoken_scan(_projected(scan, body.manifest_projection), result, names_of(request)))


async def get_status(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    return await served(request, ("status",), lambda scan: view.scan_status(scan, _logs_url(shim, scan)))


async def get_logs(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    return await served(request, ("logs",), lambda scan: {"scanner_server": {"url": _logs_url(shim, scan)}})
