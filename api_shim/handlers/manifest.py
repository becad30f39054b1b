"""A scan's manifest: read (with the scanner's event, for the system role) and update."""

from __future__ import annotations

from aiohttp import web

from api_shim import rest_models, view
from api_shim.auth import SYSTEM
from api_shim.errors import ApiError, not_found
from api_shim.plumbing import (
    IDENTITY,
    SHIM,
    live_scan_for,
    ok_spoken,
    parse_body,
    query_bool,
    scan_for,
    served,
)
from api_shim.repository import Form
from skyscan import manifest

MANIFEST: Form = ("manifest", None)  # the whole manifest


async def get_manifest(request: web.Request) -> web.Response:
    if not request.query_string and SYSTEM not in request[IDENTITY].roles:
        # What clients poll: the whole manifest of a scan not deleted, the kept bytes when there are.
        return await served(request, MANIFEST, manifest.of, include_deleted=False)
    include_deleted = query_bool(request, "include_deleted")
    fields = view.pipe_projection(request.query.get("projection"))
    # The scanner (system role) reads its event through the deprecated field, as with the reference
    # (IceCube's scanner by its reference name, `event_i3live_json_dict`).
    if SYSTEM in request[IDENTITY].roles and (fields is None or "event_live_json_dict" in fields):
        scan = await scan_for(request, include_deleted=include_deleted)
        doc = view.project(manifest.of(scan), fields)
        event = await request.app[SHIM].scans.event(scan)
        if event is None:
            raise not_found("sensor event")
        doc["event_live_json_dict"] = event
        return ok_spoken(request, doc)
    form: Form = ("manifest", None if fields is None else frozenset(fields))
    return await served(
        request, form, lambda scan: view.project(manifest.of(scan), fields), include_deleted=include_deleted
    )


async def patch_manifest(request: web.Request) -> web.Response:
    body = await parse_body(request, rest_models.PatchManifestBody)
    name = view.scan_id(await live_scan_for(request))
    if oversized := body.oversized():
        field, size = oversized
        raise ApiError(
            413,
            f"'{field}' too large",
            f"'{field}' is {size} bytes as JSON; at most {rest_models.MANIFEST_FIELD_MAX_BYTES} bytes are "
            "stored (docs/rest-api/index.md).",
        )
    scan = await request.app[SHIM].writes.update_manifest(name, body)
    return ok_spoken(request, manifest.of(scan))
