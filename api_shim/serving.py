"""The shim's one middleware: what every request passes through on its way in and out.

From the inside out: a write is answered with the Scan version it wrote (`api_shim.versions`), what a
handler raised is answered in the error body's shape (`api_shim.errors`), and the answer the client
gets is counted and timed (`api_shim.metrics`; scrapes of /metrics are not counted). One middleware,
not one for each: a middleware is a coroutine and a call more on every request, the shim's busiest path.
"""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.typedefs import Middleware

from api_shim import versions
from api_shim.errors import Handler, error_response
from api_shim.metrics import METRICS_PATH, ShimMetrics


def serving(metrics: ShimMetrics) -> Middleware:
    @web.middleware
    async def serving_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        status = 500  # what a request cut short (cancelled) is counted as
        written, token = versions.noting()
        try:
            try:
                response = await handler(request)
            except Exception as e:
                response = error_response(request, e)  # a redirection is raised again
            else:
                versions.answer_written(response, written)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            versions.noted(token)
            if request.path != METRICS_PATH:
                metrics.observe(request, status, time.monotonic() - started)

    return serving_middleware
