"""The service itself: its root, its health, and its OpenAPI description."""

from __future__ import annotations

from aiohttp import web

from api_shim import openapi
from api_shim.errors import ApiError
from api_shim.plumbing import ROUTE_TABLE, SHIM, ok, unvouched


async def root(request: web.Request) -> web.Response:
    return ok({})


async def healthz(request: web.Request) -> web.Response:
    """For probes: ready once the Scan cache has synced, and while its watch is not broken for longer
    than `cache_broken_seconds` (a replica that cannot see the cluster leaves the Service)."""
    shim = request.app[SHIM]
    if not shim.scans.synced:
        raise ApiError(503, "not ready", "The Scan cache has not synced yet.")
    if stale := unvouched(shim):
        raise ApiError(503, "not ready", stale)
    return ok({})


async def livez(request: web.Request) -> web.Response:
    """For the liveness probe: the process serves. Nothing outside it counts: restarting a shim cures
    no API-server outage, and a replica in crash-loop back-off would come back late after one."""
    return ok({})


async def openapi_json(request: web.Request) -> web.Response:
    return ok(openapi.document(request.app[ROUTE_TABLE]))
