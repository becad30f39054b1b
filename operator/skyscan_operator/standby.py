"""What a standby replica serves while it waits for the Lease: the liveness endpoint (so its probes
pass) and the metrics (`skyscan_operator_leader` 0, the process families). On takeover it closes
both, and kopf and the controller open them again on the same addresses."""

from __future__ import annotations

import logging
from types import TracebackType
from urllib.parse import urlsplit

from aiohttp import web

from skyscan_operator import metrics
from skyscan_operator.settings import OperatorSettings

log = logging.getLogger(__name__)


async def alive(request: web.Request) -> web.Response:
    return web.json_response({"standby": True})


class StandbyEndpoints:
    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.runner: web.AppRunner | None = None

    async def __aenter__(self) -> StandbyEndpoints:
        app = web.Application()
        addresses: list[tuple[str | None, int]] = []
        if self.settings.liveness_endpoint:
            url = urlsplit(self.settings.liveness_endpoint)
            app.router.add_get(url.path or "/", alive)
            addresses.append((url.hostname, url.port or 80))
        if self.settings.metrics_port:
            app.router.add_get("/metrics", metrics.metrics)
            addresses.append((self.settings.metrics_host, self.settings.metrics_port))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        for host, port in addresses:
            try:
                await web.TCPSite(self.runner, host, port).start()
            except OSError as e:  # as the controller's metrics: not worth failing for
                log.error("standby: cannot listen on %s:%d (%s)", host or "*", port, e)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
