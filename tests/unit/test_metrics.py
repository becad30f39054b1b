"""Metric labels never carry an object's id: the shim's routes by template, the WMS's by operation;
each route's handler counts what clients got and leaves scrapes out."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api_shim.app import answer_unmatched, guard
from api_shim.bodies import BODIES, BodyBudget
from api_shim.metrics import METRICS, METRICS_PATH, ShimMetrics, metrics, route_template
from api_shim.plumbing import Route
from skyscan_local import processes
from skyscan_operator.backlog import Candidate, Line
from skyscan_operator.metrics import MetricsServer, StoreCollector, wms_operation, wms_outcome
from skyscan_operator.settings import OperatorSettings


def test_wms_operations_name_the_call_not_the_workflow() -> None:
    assert wms_operation("GET", "/v1/workflows/wf-123") == "GET /v1/workflows/{id}"
    abort = wms_operation("POST", "/v1/workflows/wf-9/actions/abort")
    assert abort == "POST /v1/workflows/{id}/actions/abort"
    assert wms_operation("POST", "/v1/workflows") == "POST /v1/workflows"
    assert wms_operation("POST", "/v1/query/taskforces") == "POST /v1/query/taskforces"
    assert wms_operation("POST", "/v1/query/workflows") == "POST /v1/query/workflows"
    assert (
        wms_operation("GET", "/v1/mqs/workflows/wf-1/mq-profiles/public")
        == "GET /v1/mqs/workflows/{id}/mq-profiles/public"
    )
    assert (
        wms_operation("POST", "/v1/task-directives/td-7/actions/add-workers")
        == "POST /v1/task-directives/{id}/actions/add-workers"
    )


def test_wms_outcomes_follow_the_clients_retry_rules() -> None:
    assert [wms_outcome(s) for s in (200, 201, 404, 400, 408, 429, 500, 503, None)] == [
        "ok", "ok", "refused", "refused", "unavailable", "unavailable", "unavailable", "unavailable",
        "unavailable",
    ]  # fmt: skip


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hi")


async def test_shim_routes_are_labelled_by_template() -> None:
    app = web.Application()
    app.router.add_get("/scan/{scan_id}/status", hello)
    found = await app.router.resolve(make_mocked_request("GET", "/scan/abc-123/status", app=app))
    assert route_template(found) == "/scan/{scan_id}/status"
    missing = await app.router.resolve(make_mocked_request("GET", "/scan-abc-123", app=app))
    assert route_template(missing) == "unmatched"


async def test_each_route_counts_answers_by_template_and_not_the_scrapes() -> None:
    counted = ShimMetrics()
    app = web.Application()
    app[METRICS] = counted
    app[BODIES] = BodyBudget(1 << 20, 1 << 20, 1.0)
    for method, path, handler in [
        ("GET", "/scan/{scan_id}/status", hello),
        ("PUT", "/scan/{scan_id}/result", hello),
        ("GET", METRICS_PATH, metrics),
    ]:
        app.router.add_route(method, path, guard(Route(method, path, handler, "", None, None), counted))
    answer_unmatched(app, counted)
    async with TestClient(TestServer(app)) as client:
        for path in ("/scan/a/status", "/scan/b/status", "/nowhere/c"):
            await client.get(path)
        await client.put("/scan/a/result", data=b"x" * 10)
        assert (await client.delete("/scan/a/status")).headers["Allow"] == "GET"
        for _ in range(3):
            text = await (await client.get(METRICS_PATH)).text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    requests = {
        (s.labels["route"], s.labels["method"], s.labels["code"]): s.value
        for s in samples
        if s.name == "skyscan_shim_requests_total"
    }
    assert requests == {
        ("/scan/{scan_id}/status", "GET", "200"): 2,
        ("unmatched", "GET", "404"): 1,
        ("unmatched", "DELETE", "405"): 1,
        ("/scan/{scan_id}/result", "PUT", "200"): 1,
    }
    stored = [s.value for s in samples if s.name == "skyscan_shim_payload_bytes_total"]
    assert stored == [10]


def test_the_oldest_wait_is_the_earliest_entry_in_the_line() -> None:
    line = Line(OperatorSettings())
    assert line.oldest_entry() is None
    line.put(Candidate(("ns", "late-high"), 200, 50.0, 0.0, 0), now=100.0)
    line.put(Candidate(("ns", "early-low"), 0, 10.0, 0.0, 0), now=100.0)
    assert line.oldest_entry() == 10.0
    line.remove(("ns", "early-low"))
    assert line.oldest_entry() == 50.0


async def test_the_operators_metrics_listen_only_on_the_address_they_are_given() -> None:
    assert OperatorSettings().metrics_host == "0.0.0.0"  # a cluster scrapes the Pod's address
    server = MetricsServer(StoreCollector(None, [], None, lambda: 0.0))  # type: ignore[arg-type]
    port = processes.free_port()
    await server.start("127.0.0.1", port)
    try:
        assert server.runner is not None
        assert [a[:2] for a in server.runner.addresses] == [("127.0.0.1", port)]
    finally:
        await server.stop()


async def test_the_request_figures_are_those_a_counter_and_a_histogram_would_give() -> None:
    reference = CollectorRegistry()
    requests = Counter("skyscan_shim_requests", "x", ["route", "method", "code"], registry=reference)
    duration = Histogram(
        "skyscan_shim_request_duration_seconds", "x", ["route", "method"], registry=reference
    )
    counted = ShimMetrics()
    app = web.Application()
    app.router.add_get("/scan/{scan_id}/status", hello)
    seconds = (0.0, 0.005, 0.0051, 0.3, 1.0, 9.99, 10.0, 12.5, 0.07)
    for i, (path, status) in enumerate([("/scan/a/status", 200), ("/scan/b/status", 404), ("/x", 404)] * 3):
        request = make_mocked_request("GET", path, app=app)
        match = await app.router.resolve(request)
        request._match_info = match
        counted.observe(request, status, seconds[i])
        requests.labels(route_template(match), "GET", str(status)).inc()
        duration.labels(route_template(match), "GET").observe(seconds[i])

    def samples(registry: CollectorRegistry) -> list[tuple[str, list[tuple[str, str]], float]]:
        text = generate_latest(registry).decode()
        return sorted(
            (s.name, sorted(s.labels.items()), 0.0 if s.name.endswith("_created") else s.value)
            for f in text_string_to_metric_families(text)
            if f.name in ("skyscan_shim_requests", "skyscan_shim_request_duration_seconds")
            for s in f.samples
        )

    ours = samples(counted.registry)
    assert sum(name.endswith("_bucket") for name, _, _ in ours) == 2 * 15  # two (route, method)s
    assert ours == samples(reference)
