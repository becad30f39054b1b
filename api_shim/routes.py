"""Every REST route of the interface, as one table the app and the OpenAPI document both read.

Handlers live in `api_shim.handlers`, one module per resource. Auth, role checks and replaced-scan
redirects are applied around each handler by `app.guard`, from the route's declared roles and
`redirect` flag.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel

from api_shim import metrics, rest_models
from api_shim.auth import SYSTEM, USER, VIEWER
from api_shim.handlers import (
    events,
    find,
    manifest,
    results,
    scan,
    scanner_log,
    service,
    startup,
    subscriptions,
    table,
    wms,
)
from api_shim.plumbing import Handler, Query, Route
from api_shim.wire_names import REFERENCE_PATHS, Names

NO_REDIRECT = Query("no_redirect", "boolean", "Do not redirect a replaced scan to its replacement.")
INCLUDE_DELETED = Query("include_deleted", "boolean", "Also return deleted scans.")
PROJECTION = Query("projection", "string", "`*` or pipe-delimited Manifest field names.")
EXPIRES = Query("expires", "integer", "Presigned URL: its expiry (Unix seconds).", required=True)
SIGNATURE = Query("signature", "string", "Presigned URL: HMAC-SHA256 of scan id and expiry.", required=True)
U, S, US = frozenset({USER}), frozenset({SYSTEM}), frozenset({USER, SYSTEM})
# Reads: a viewer may read all a user may (and change nothing).
R, RS = U | {VIEWER}, US | {VIEWER}
SCAN_ID = "/scan/{scan_id}"


def scan_read(
    path: str, handler: Handler, summary: str, roles: frozenset[str], response: type[BaseModel], *query: Query
) -> Route:
    """A GET of one scan (`path` below `SCAN_ID`): 404 for an unknown scan, 503 while the archive it may
    be in cannot answer, users redirected from a replaced one unless they ask `no_redirect`."""
    return Route(
        "GET",
        SCAN_ID + path,
        handler,
        summary,
        roles,
        response,
        query=(NO_REDIRECT, *query),
        errors=(404, 503),
        redirect=True,
    )


INTERFACE_ROUTES: tuple[Route, ...] = (
    Route("GET", "/", service.root, "Service root.", R, rest_models.Empty),
    Route("GET", "/openapi.json", service.openapi_json, "This API description (OpenAPI 3.1).", None, None),
    Route(
        "GET",
        "/healthz",
        service.healthz,
        "Readiness (no auth): 503 until the Scan cache has synced, and while its watch is broken.",
        None,
        rest_models.Empty,
        errors=(503,),
    ),
    Route("GET", "/livez", service.livez, "Liveness (no auth): the process serves.", None, rest_models.Empty),
    Route(
        "GET",
        metrics.METRICS_PATH,
        metrics.metrics,
        "Prometheus metrics (text exposition format; no auth).",
        None,
        None,
        content_type="text/plain",
    ),
    Route(
        "POST",
        "/scans/find",
        find.find_scans,
        "Find manifests matching a MongoDB-style filter.",
        R,
        rest_models.FindResponse,
        body=rest_models.FindBody,
        errors=(400, 503),
    ),
    Route(
        "GET", "/scans/backlog", find.backlog, "Scans waiting on the backlog.", R, rest_models.BacklogResponse
    ),
    Route(
        "POST",
        "/subscriptions",
        subscriptions.subscribe,
        "Subscribe to scan events: each scan entering one of `states` (whole, or either half) is POSTed to "
        "`url` as a CloudEvent signed as Standard Webhooks sign (`secret`: `whsec_` + base64; made and "
        "answered once when absent), at least once, in order.",
        U,
        rest_models.SubscriptionView,
        body=rest_models.SubscribeBody,
        errors=(400, 503),
    ),
    Route(
        "GET",
        "/subscriptions",
        subscriptions.subscriptions,
        "Your subscriptions, with their deliveries.",
        U,
        rest_models.SubscriptionsResponse,
    ),
    Route(
        "DELETE",
        "/subscriptions/{subscription_id}",
        subscriptions.unsubscribe,
        "Delete one of your subscriptions.",
        U,
        rest_models.SubscriptionView,
        errors=(404, 503),
    ),
    Route(
        "GET",
        "/scans",
        table.scans_table,
        "The dashboard's table: a page of scans (their state and key fields), newest first; the next page "
        "is asked with `before` = this one's `next`.",
        R,
        rest_models.TableResponse,
        query=(
            Query("run_id", "integer", "Only this run's scans."),
            Query("event_id", "integer", "Only this event's scans."),
            Query("classifier", "string", "`key=value` (repeated): only scans with each classifier."),
            Query("since", "number", "Only scans created at or after (Unix seconds)."),
            Query("until", "number", "Only scans created before (Unix seconds)."),
            Query("state", "string", "A state or either half of one (repeated: any of them)."),
            Query("archived", "boolean", "Archived scans too."),
            Query("deleted", "boolean", "Deleted scans too."),
            Query("before", "string", "Only scans whose id sorts before this (a page's `next`)."),
            Query("limit", "integer", f"Rows (1 to {table.MAX_ROWS}, {table.DEFAULT_ROWS} by default)."),
        ),
        errors=(400, 503),
    ),
    Route(
        "GET",
        "/scans/events",
        events.scans_events,
        "Follow a page of scans (the dashboard's table): each named scan's row as it changes, `gone` when "
        f"one leaves the cluster, `new` when scans arrive; Server-Sent Events (at most {events.MAX_ROWS} "
        f"scans, a message per scan per {events.ROWS_EVERY} s at most).",
        R,
        None,
        query=(Query("scan_id", "string", "A scan to follow (repeated: one per scan)."),),
        errors=(400, 503),
        content_type="text/event-stream",
    ),
    Route(
        "POST",
        "/scan",
        scan.launch_scan,
        "Start a new scan.",
        U,
        rest_models.ManifestView,
        body=rest_models.ScanRequestBody,
        errors=(400, 413, 503),
    ),
    Route(
        "GET",
        "/scan-request/{scan_id}",
        scan.get_scan_request,
        "The request that started a scan.",
        R,
        rest_models.ScanRequestObj,
        errors=(404, 503),
    ),
    Route(
        "POST",
        SCAN_ID + "/actions/rescan",
        scan.rescan,
        "Start a new scan from this scan's request.",
        US,
        rest_models.ManifestView,
        body=rest_models.RescanBody,
        query=(NO_REDIRECT,),
        errors=(404, 503),
        redirect=True,
    ),
    Route(
        "POST",
        SCAN_ID + "/actions/add-workers",
        wms.add_workers,
        "Add WMS workers to a running scan.",
        U,
        rest_models.AddWorkersResponse,
        body=rest_models.AddWorkersBody,
        query=(NO_REDIRECT,),
        errors=(400, 404, 422, 500, 503, 504),
        redirect=True,
    ),
    scan_read("", scan.get_scan, "Manifest and result.", RS, rest_models.ManifestAndResult, INCLUDE_DELETED),
    Route(
        "DELETE",
        SCAN_ID,
        scan.delete_scan,
        "Abort a scan and mark it deleted.",
        U,
        rest_models.ManifestAndResult,
        body=rest_models.DeleteBody,
        query=(NO_REDIRECT,),
        errors=(400, 404, 503),
        redirect=True,
    ),
    scan_read(
        "/manifest",
        manifest.get_manifest,
        "The manifest.",
        RS,
        rest_models.ManifestView,
        INCLUDE_DELETED,
        PROJECTION,
    ),
    Route(
        "PATCH",
        SCAN_ID + "/manifest",
        manifest.patch_manifest,
        "Update progress and set event/scan metadata.",
        S,
        rest_models.Manifest,
        body=rest_models.PatchManifestBody,
        errors=(400, 404, 413, 503),
    ),
    scan_read(
        "/sensor-event",
        results.get_sensor_event,
        "The scan's sensor event.",
        RS,
        rest_models.SensorEventResponse,
    ),
    scan_read(
        "/result",
        results.get_result,
        "The stored result, or {}.",
        R,
        rest_models.ResultOrEmpty,
        INCLUDE_DELETED,
    ),
    Route(
        "PUT",
        SCAN_ID + "/result",
        results.put_result,
        "Store a result.",
        S,
        rest_models.ResultOrEmpty,
        body=rest_models.PutResultBody,
        errors=(400, 404, 413, 503),
    ),
    Route(
        "PUT",
        SCAN_ID + "/startup.json",
        startup.put_startup,
        "Store the scanner's startup.json (its sidecar uploads it).",
        S,
        rest_models.StartupStored,
        body=rest_models.StartupJson,
        errors=(400, 404, 413, 503),
    ),
    Route(
        "GET",
        SCAN_ID + "/startup.json",
        startup.get_startup,
        "The scanner's startup.json, for workers: a presigned URL, no bearer token (404: not uploaded yet).",
        None,
        rest_models.StartupJson,
        query=(EXPIRES, SIGNATURE),
        errors=(403, 404, 503),
    ),
    scan_read("/status", scan.get_status, "Aggregated scan status.", RS, rest_models.StatusResponse),
    Route(
        "GET",
        SCAN_ID + "/events",
        events.scan_events,
        "Follow the scan: its state, then each change, as Server-Sent Events until it ends.",
        RS,
        None,
        query=(NO_REDIRECT,),
        errors=(404, 503),
        redirect=True,
        content_type="text/event-stream",
    ),
    scan_read("/logs", scan.get_logs, "Log URLs.", R, rest_models.LogsResponse),
    # Not redirected: a replaced scan's log is that scan's own (why its scanner died).
    Route(
        "GET",
        SCAN_ID + "/logs/scanner-server",
        scanner_log.scanner_server_log,
        "The scanner server's log as text: kept with the scan once its container ended (head and tail, "
        "a marker where bytes were cut), read live while it runs; `follow` streams it until it ends.",
        R,
        None,
        query=(Query("follow", "boolean", "Go on sending the log as it is written, until it ends."),),
        errors=(404, 503),
        content_type="text/plain",
    ),
    scan_read(
        "/wms/workflow-id", wms.get_workflow_id, "The WMS workflow id.", RS, rest_models.WorkflowIdResponse
    ),
    Route(
        "POST",
        SCAN_ID + "/wms/workflow-id",
        wms.set_workflow_id,
        "Assign the WMS workflow id (once).",
        S,
        rest_models.Manifest,
        body=rest_models.WorkflowIdBody,
        errors=(400, 404, 503),
    ),
    scan_read(
        "/wms/workforce", wms.get_workforce, "Workers of the scan's workflow.", RS, rest_models.Workforce
    ),
    scan_read(
        "/wms/taskforces",
        wms.get_taskforces,
        "Batch submissions of the scan.",
        RS,
        rest_models.TaskforcesResponse,
    ),
)


def reference_routes(routes: tuple[Route, ...]) -> tuple[Route, ...]:
    """The reference's paths of the interface's `routes` (`wire_names.REFERENCE_PATHS`): the same
    handlers, answering in the reference's names whoever calls, as IceCube's scanner and its init
    container read them."""
    paths = {SCAN_ID + ours: SCAN_ID + theirs for ours, theirs in REFERENCE_PATHS.items()}
    return tuple(
        dataclasses.replace(
            route,
            path=paths[route.path],
            summary=f"{route.summary} The reference's path of {route.path.removeprefix(SCAN_ID)}.",
            names=Names.REFERENCE,
        )
        for route in routes
        if route.path in paths
    )


ROUTES = INTERFACE_ROUTES + reference_routes(INTERFACE_ROUTES)
