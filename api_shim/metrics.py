"""The shim's Prometheus metrics, served at `GET /metrics` (public, text exposition format).

Requests are counted by route template (the matched resource's canonical path, so a scan id never
becomes a label value), method and status code, and timed, by each route's handler (`api_shim.app.guard`,
`unmatched`) once the answer is what the client gets. Each (route, method, status) binds its label values
once: a request then adds to a tally it looks up by identity (or by status alone, a route's own), not by
label values. The cache's
figures are read at scrape time by a collector; the cache itself only keeps two plain numbers up to
date. Each app has its own registry (tests run several apps in one process).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource, UrlMappingMatchInfo
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from api_shim.repository import Scans

METRICS_PATH = "/metrics"
UNMATCHED = "unmatched"  # no route matched: the raw path is never a label value
# The template of the route of every request no other route takes (404, 405), labelled UNMATCHED.
CATCH_ALL = "/{unmatched}"
# Request bodies that the shim stores, by kind: the payload bytes it takes in.
PAYLOAD_KINDS = {
    ("POST", "/scan"): "scan_request",
    ("PUT", "/scan/{scan_id}/result"): "result",
    ("PUT", "/scan/{scan_id}/startup.json"): "startup",
    ("PATCH", "/scan/{scan_id}/manifest"): "manifest",
}


# The methods a label or a log line names; a client may send any token as a method.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_name(method: str) -> str:
    return method if method in METHODS else "OTHER"


def template(resource: AbstractResource | None) -> str:
    """A resource's template (`/scan/{scan_id}/status`), never the path asked for; UNMATCHED for none
    (a request aiohttp refused before routing) and for the catch-all."""
    if resource is None or (canonical := resource.canonical) == CATCH_ALL:
        return UNMATCHED
    return canonical


def route_template(match: UrlMappingMatchInfo) -> str:
    """The matched route's template, never the path asked for."""
    return template(match.route.resource)


class CacheCollector(Collector):
    """The Scan cache, read at scrape time."""

    def __init__(self, scans: Scans) -> None:
        self.scans = scans

    def collect(self) -> Iterator[Metric]:
        figures = self.scans.watch_figures()
        yield GaugeMetricFamily(
            "skyscan_shim_cached_scans", "Scans held in the shim's cache.", figures.cached
        )
        yield CounterMetricFamily(
            "skyscan_shim_cache_relists",
            "Listings of every Scan after the first (the watch's history was compacted: 410 Gone).",
            figures.relists,
        )
        yield GaugeMetricFamily(
            "skyscan_shim_cache_watch_idle_seconds",
            "Seconds since the cache's watch last brought an event or a bookmark (or a listing ended).",
            figures.idle_seconds,
        )
        yield GaugeMetricFamily(
            "skyscan_shim_cache_watch_broken_seconds",
            "Seconds the cache's list and watch of the API server have been failing (0: they work).",
            figures.broken_seconds,
        )


REQUESTS = ("skyscan_shim_requests", "REST requests answered, by route template, method and status code.")
DURATION = (
    "skyscan_shim_request_duration_seconds",
    "Time to answer a REST request, by route template and method.",
)
BUCKETS = Histogram.DEFAULT_BUCKETS  # the last is +Inf
LE = tuple("+Inf" if b == float("inf") else repr(float(b)) for b in BUCKETS)  # as Histogram writes them


@dataclass(slots=True)
class Timing:
    """One (route, method)'s durations: as a Histogram keeps them, in plain numbers."""

    created: float = field(default_factory=time.time)
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))  # each bucket's own
    total: float = 0.0


@dataclass(slots=True)
class Tally:
    """The figures one (route, method, status) adds to: plain numbers on the event loop (every request
    and every scrape run there), samples only at scrape time (`RequestsCollector`)."""

    labels: tuple[str, str, str]  # route, method, code
    timing: Timing  # shared by the statuses of a (route, method)
    payload_bytes: Counter | None  # a stored body's kind, answered with success
    created: float = field(default_factory=time.time)
    count: int = 0

    def add(self, request: web.BaseRequest, seconds: float) -> None:
        """One request answered with this tally's status after `seconds`."""
        self.count += 1
        timing = self.timing
        timing.counts[bisect_left(BUCKETS, seconds)] += 1  # the first bound >= seconds, as Histogram's
        timing.total += seconds
        if self.payload_bytes is not None and request.content_length:
            self.payload_bytes.inc(request.content_length)


class RequestsCollector(Collector):
    """`skyscan_shim_requests_total` and `skyscan_shim_request_duration_seconds`, the samples a Counter
    and a Histogram of these names and labels would give, made from the tallies at scrape time."""

    def __init__(
        self, tallies: dict[tuple[str, str, str], Tally], timings: dict[tuple[str, str], Timing]
    ) -> None:
        self.tallies, self.timings = tallies, timings

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(*REQUESTS, labels=["route", "method", "code"])
        for tally in list(self.tallies.values()):
            requests.add_metric(tally.labels, tally.count, created=tally.created)
        yield requests
        duration = HistogramMetricFamily(*DURATION, labels=["route", "method"])
        for labels, timing in list(self.timings.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(LE, timing.counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            duration.add_metric(labels, buckets, timing.total)
            created = dict(zip(("route", "method"), labels, strict=True))
            duration.samples.append(Sample(f"{DURATION[0]}_created", created, timing.created))
        yield duration


class ShimMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.payload_bytes = Counter(
            "skyscan_shim_payload_bytes",
            "Bytes of request bodies stored, by kind (scan_request, result, startup, manifest).",
            ["kind"],
            registry=self.registry,
        )
        self.event_streams = Gauge(
            "skyscan_shim_event_streams",
            "Open GET /scan/{scan_id}/events streams (Server-Sent Events).",
            registry=self.registry,
        )
        # Keys are few: the route table's resources (None: unmatched) x METHODS x status codes.
        self._bound: dict[tuple[AbstractResource | None, str, int], Tally] = {}
        self._tallies: dict[tuple[str, str, str], Tally] = {}
        self._timings: dict[tuple[str, str], Timing] = {}
        self.registry.register(RequestsCollector(self._tallies, self._timings))

    def watch(self, scans: Scans) -> None:
        self.registry.register(CacheCollector(scans))

    def bind(self, route: str, method: str, status: int) -> Tally:
        """The tally of (route template, method, status), made at its first request."""
        labels = (route, method, str(status))
        if (tally := self._tallies.get(labels)) is None:  # two resources may share a template
            kind = PAYLOAD_KINDS.get((method, route)) if status < 300 else None
            timing = self._timings.setdefault((route, method), Timing())
            payload = self.payload_bytes.labels(kind) if kind is not None else None
            tally = self._tallies[labels] = Tally(labels, timing, payload)
        return tally

    def observe(self, request: web.Request, status: int, seconds: float) -> None:
        match, method = request.match_info, method_name(request.method)
        key = (match.route.resource, method, status)
        if (tally := self._bound.get(key)) is None:
            tally = self._bound[key] = self.bind(route_template(match), method, status)
        tally.add(request, seconds)


METRICS = web.AppKey("metrics", ShimMetrics)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
