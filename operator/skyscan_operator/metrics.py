"""The operator's Prometheus metrics, served at `GET /metrics` on `SKYSCAN_METRICS_PORT`.

Counters and histograms are incremented where the operator decides (the backlog's admissions, a start
attempt's failure, a WMS request, a reconcile); what the store already indexes (scans by state, the
backlog, the work queue, the archiver's moves) is read at scrape time by a collector, so keeping it
costs nothing per event. The endpoint runs in the operator's event loop, so a scrape reads the store
between two events, never during one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from skyscan_operator.archiver import Archiver
from skyscan_operator.live_scans import Key, LiveScans
from skyscan_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
REGISTRY = CollectorRegistry()  # one operator per process
ProcessCollector(registry=REGISTRY)

WEBHOOK_DELIVERIES = Counter(
    "skyscan_operator_webhook_deliveries",
    "Webhook delivery attempts, by result (delivered, failed).",
    ["result"],
    registry=REGISTRY,
)
WEBHOOK_RETRIES = Counter(
    "skyscan_operator_webhook_retries",
    "Webhook deliveries scheduled again after a failed attempt.",
    registry=REGISTRY,
)
WEBHOOK_GIVE_UPS = Counter(
    "skyscan_operator_webhook_give_ups",
    "Webhook events given up: still undelivered after SKYSCAN_WEBHOOK_RETRY_SECONDS.",
    registry=REGISTRY,
)
WEBHOOK_LATENCY = Histogram(
    "skyscan_operator_webhook_delivery_seconds",
    "From a scan event seen to its delivery.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300, 3600),
    registry=REGISTRY,
)
ADMISSIONS = Counter("skyscan_operator_admissions", "Scans the backlog admitted to start.", registry=REGISTRY)
START_FAILURES = Counter(
    "skyscan_operator_start_failures",
    "Start attempts that ended without a start, by the reason the Admitted condition shows.",
    ["reason"],
    registry=REGISTRY,
)
WMS_REQUESTS = Counter(
    "skyscan_operator_wms_requests",
    "HTTP requests to the WMS (each retry counts), by operation and outcome (ok, refused, unavailable).",
    ["operation", "outcome"],
    registry=REGISTRY,
)
WMS_DURATION = Histogram(
    "skyscan_operator_wms_request_duration_seconds",
    "Time for one HTTP request to the WMS, answered or not, by operation.",
    ["operation"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "skyscan_operator_reconcile_duration_seconds",
    "Time for one reconcile of one scan (plan and execute).",
    registry=REGISTRY,
)
LEADER = Gauge(
    "skyscan_operator_leader",
    "1 while this replica holds the operator's Lease and acts, 0 while it stands by.",
    registry=REGISTRY,
)
# A path segment after one of these is an id: a label value names the operation, never the object.
ID_AFTER = frozenset({"workflows", "task-directives"})


def wms_operation(method: str, path: str) -> str:
    """`POST /v1/workflows/{id}/actions/abort` for `POST /v1/workflows/wf-1/actions/abort`."""
    parts = path.strip("/").split("/")
    named = ["{id}" if i and parts[i - 1] in ID_AFTER else part for i, part in enumerate(parts)]
    return f"{method} /" + "/".join(named)


def wms_outcome(status: int | None) -> str:
    """`unavailable`: no answer, 5xx, 408 or 429 (retried); `refused`: another 4xx; `ok` otherwise."""
    if status is None or status >= 500 or status in (408, 429):
        return "unavailable"
    return "refused" if status >= 400 else "ok"


def wms_request(method: str, path: str, status: int | None, seconds: float) -> None:
    operation = wms_operation(method, path)
    WMS_REQUESTS.labels(operation, wms_outcome(status)).inc()
    WMS_DURATION.labels(operation).observe(seconds)


class StoreCollector(Collector):
    """What the store, the work queue and the archiver hold, read at scrape time."""

    def __init__(
        self, store: LiveScans, queue: WorkQueue[Key], archiver: Archiver | None, clock: Callable[[], float]
    ) -> None:
        self.store, self.queue, self.archiver, self.clock = store, queue, archiver, clock

    def collect(self) -> Iterator[Metric]:
        store = self.store
        waiting, running = len(store.waiting), len(store.running)
        scans = GaugeMetricFamily(
            "skyscan_operator_scans",
            "Live scans the operator holds, by state (other: starting, or ended and not yet settled).",
            labels=["state"],
        )
        scans.add_metric(["waiting"], waiting)
        scans.add_metric(["running"], running)
        scans.add_metric(["other"], max(0, len(store) - waiting - running))
        yield scans
        yield GaugeMetricFamily(
            "skyscan_operator_backlog_scans", "Scans in the backlog's line, waiting to be admitted.",
            len(store.line),
        )  # fmt: skip
        oldest = store.line.oldest_entry()
        yield GaugeMetricFamily(
            "skyscan_operator_backlog_oldest_wait_seconds",
            "How long the scan longest in the backlog's line has waited (0: none waits).",
            0.0 if oldest is None else max(0.0, self.clock() - oldest),
        )
        yield GaugeMetricFamily(
            "skyscan_operator_reconcile_queue_depth", "Scans queued for a reconcile.", len(self.queue)
        )
        moved, failed = (self.archiver.moved, self.archiver.failed) if self.archiver else (0, 0)
        yield CounterMetricFamily(
            "skyscan_operator_archive_moves", "Finished scans moved to the archive.", moved
        )
        yield CounterMetricFamily(
            "skyscan_operator_archive_failures", "Moves to the archive that failed (retried).", failed
        )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


class MetricsServer:
    """`GET /metrics` on its own port. A port that cannot be bound is logged and left: metrics are not
    worth stopping the operator's work for."""

    def __init__(self, collector: StoreCollector) -> None:
        self.collector = collector
        self.runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as e:
            log.error("metrics: cannot listen on port %d (%s); serving no metrics", port, e)
            await runner.cleanup()
            return
        REGISTRY.register(self.collector)
        self.runner = runner

    async def stop(self) -> None:
        if self.runner is not None:
            REGISTRY.unregister(self.collector)
            await self.runner.cleanup()
            self.runner = None
