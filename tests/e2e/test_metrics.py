"""Both metrics endpoints, scraped over HTTP around a real scan: every documented family is served,
and the counters the scan touches moved (the stack is shared, so the test compares before and after)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.conftest import Rest, Stack, follow_states

SHIM_FAMILIES = {
    "skyscan_shim_requests", "skyscan_shim_request_duration_seconds", "skyscan_shim_cached_scans",
    "skyscan_shim_cache_relists", "skyscan_shim_cache_watch_idle_seconds", "skyscan_shim_payload_bytes",
    "skyscan_shim_cache_watch_broken_seconds",
}  # fmt: skip
OPERATOR_FAMILIES = {
    "skyscan_operator_scans", "skyscan_operator_backlog_scans",
    "skyscan_operator_backlog_oldest_wait_seconds", "skyscan_operator_admissions",
    "skyscan_operator_start_failures", "skyscan_operator_wms_requests",
    "skyscan_operator_wms_request_duration_seconds", "skyscan_operator_reconcile_duration_seconds",
    "skyscan_operator_reconcile_queue_depth", "skyscan_operator_archive_moves",
    "skyscan_operator_archive_failures", "skyscan_operator_webhook_deliveries",
    "skyscan_operator_webhook_retries", "skyscan_operator_webhook_give_ups",
    "skyscan_operator_webhook_delivery_seconds",
}  # fmt: skip


class Scrape:
    def __init__(self, text: str) -> None:
        families = list(text_string_to_metric_families(text))
        self.families = {f.name for f in families}
        self.samples: list[Sample] = [s for f in families for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum over the samples of `name` whose labels include `labels`."""
        return sum(s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items())


async def scrape(url: str) -> Scrape:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.get(url)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return Scrape(r.text)


async def test_a_scan_moves_the_documented_metrics_of_both_processes(rest: Rest, stack: Stack) -> None:
    shim_url = f"{stack.url}/metrics"
    shim_before, operator_before = await scrape(shim_url), await scrape(stack.operator_metrics_url)

    scan_id = await rest.launch()
    await follow_states(rest, scan_id, [], until="SCAN_HAS_FINAL_RESULT")
    await rest.ok("GET", f"/scan/{scan_id}/result")

    shim, operator = await scrape(shim_url), await scrape(stack.operator_metrics_url)
    assert SHIM_FAMILIES <= shim.families, SHIM_FAMILIES - shim.families
    assert OPERATOR_FAMILIES <= operator.families, OPERATOR_FAMILIES - operator.families

    def moved(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    # The shim: the scan's routes by template (the scanner's reports too), its bodies, its cache.
    requests = "skyscan_shim_requests_total"
    assert moved(shim_before, shim, requests, route="/scan", method="POST", code="200") >= 1
    assert moved(shim_before, shim, requests, route="/scan/{scan_id}/status", method="GET", code="200") >= 2
    assert moved(shim_before, shim, requests, route="/scan/{scan_id}/result", method="PUT", code="200") >= 1
    assert moved(shim_before, shim, "skyscan_shim_request_duration_seconds_count", route="/scan") >= 1
    assert moved(shim_before, shim, "skyscan_shim_payload_bytes_total", kind="scan_request") > 0
    assert moved(shim_before, shim, "skyscan_shim_payload_bytes_total", kind="result") > 0
    assert shim.value("skyscan_shim_cached_scans") >= 1
    routes = {s.labels["route"] for s in shim.samples if s.name == requests}
    assert not any(scan_id in route for route in routes) and "/metrics" not in routes, routes

    # The operator: the admission, its WMS calls by operation, its reconciles.
    assert moved(operator_before, operator, "skyscan_operator_admissions_total") >= 1
    wms = "skyscan_operator_wms_requests_total"
    assert moved(operator_before, operator, wms, operation="POST /v1/workflows", outcome="ok") >= 1
    assert moved(operator_before, operator, wms, operation="POST /v1/query/workflows", outcome="ok") >= 1
    operations = {s.labels["operation"] for s in operator.samples if s.name == wms}
    assert not any(scan_id in op for op in operations), operations
    assert moved(operator_before, operator, "skyscan_operator_reconcile_duration_seconds_count") >= 3
