"""A scan's startup.json: uploaded by the scanner Pod's sidecar with the scan's credential, fetched by
the WMS workers through the presigned URL of their init command (no bearer token)."""

from __future__ import annotations

import time

from aiohttp import web

from api_shim.bodies import body_of
from api_shim.errors import ApiError
from api_shim.plumbing import SHIM, live_scan_for, ok
from skyscan import presign


def forbidden(reason: str, message: str) -> ApiError:
    return ApiError(403, reason, message)


async def put_startup(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    scan = await live_scan_for(request)
    raw = await body_of(request)
    await shim.writes.store_startup(scan, raw)
    return ok({"scan_id": scan["metadata"]["name"], "size": len(raw)})


async def get_startup(request: web.Request) -> web.Response:
    """Public, but only through a URL signed for this scan and not yet expired."""
    shim = request.app[SHIM]
    scan_id = request.match_info["scan_id"]
    key = shim.settings.presign_key
    if key is None:
        raise forbidden("presigned URLs are not configured", "The shim has no SKYSCAN_PRESIGN_KEY_FILE.")
    try:
        expires = int(request.query.get("expires", ""))
    except ValueError:
        raise forbidden("invalid signature", "The URL needs `expires` (Unix seconds), `signature`.") from None
    now = time.time()
    if now > expires:
        raise forbidden("expired signature", f"This URL expired at {expires} (Unix seconds).")
    if not presign.verify(key, scan_id, expires, request.query.get("signature", ""), now):
        raise forbidden("invalid signature", "This URL is not signed for this scan's startup.json.")
    raw = await shim.scans.startup(scan_id)
    if raw is None:
        raise ApiError(
            404, "startup.json not uploaded yet", "The scanner has not uploaded it yet; retry later."
        )
    return web.Response(body=raw, content_type="application/json")
