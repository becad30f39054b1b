"""The service itself: its root, its health, and its OpenAPI description."""

from __future__ import annotations

from aiohttp import web

from api_shim import openapi
from api_shim.errors import ApiError
from api_shim.plumbing import ROUTE_TABLE, SHIM, ok


async def root(request: web.Request) -> web.Response:
    return ok({})


async def healthz(request: web.Request) -> web.Response:
    """For probes: the app serves only after its Scan cache has synced, so serving means healthy."""
    if not request.app[SHIM].cache.synced.is_set():
        raise ApiError(503, "not ready", "The Scan cache has not synced yet.")
    return ok({})


async def openapi_json(request: web.Request) -> web.Response:
    return ok(openapi.document(request.app[ROUTE_TABLE]))
