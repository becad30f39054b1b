"""Every REST route of the interface, as one table the app and the OpenAPI document both read.

Handlers read Scans from the cache and write through `ScanStore`; payloads (events, results) are
their own objects (`skyscan.payloads`). Auth, role checks and replaced-scan redirects are applied
around each handler by `app.guard`, from the route's declared roles and `redirect` flag.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from api_shim import models, view
from api_shim.auth import SYSTEM, USER, Identity
from api_shim.cache import ScanCache
from api_shim.errors import ApiError, bad_request, not_found
from api_shim.filters import FilterError, compile_filter
from api_shim.launch import Defaults, normalise
from api_shim.settings import ShimSettings
from api_shim.store import Change, ScanStore, now, replace_patch
from api_shim.tags import TagCatalog
from skyscan import model, payloads
from skyscan.state import NOT_YET_REQUESTED

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
IDENTITY = web.RequestKey("identity", Identity)


@dataclass
class Shim:
    """Everything a handler needs, stored on the app under `SHIM`."""

    settings: ShimSettings
    api: client.ApiClient
    cache: ScanCache
    store: ScanStore
    tags: TagCatalog
    events: OrderedDict[str, Any] = field(default_factory=OrderedDict)  # immutable, so cacheable

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    async def event(self, sensor_event_id: str) -> Any | None:
        if sensor_event_id in self.events:
            self.events.move_to_end(sensor_event_id)
            return self.events[sensor_event_id]
        payload = await payloads.read_event(self.api, self.namespace, sensor_event_id)
        if payload is not None:
            self.events[sensor_event_id] = payload
            while len(self.events) > 16:
                self.events.popitem(last=False)
        return payload


SHIM = web.AppKey("shim", Shim)


@dataclass(frozen=True)
class Query:
    name: str
    kind: str  # "boolean" | "string"
    description: str


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    roles: frozenset[str] | None  # None: public
    response: type[BaseModel] | None  # None: an open object
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    errors: tuple[int, ...] = ()
    redirect: bool = False


NO_REDIRECT = Query("no_redirect", "boolean", "Do not redirect a replaced scan to its replacement.")
INCLUDE_DELETED = Query("include_deleted", "boolean", "Also return deleted scans.")
PROJECTION = Query("projection", "string", "`*` or pipe-delimited Manifest field names.")
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


# ---------------------------------------------------------------------------------------- helpers
def parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise bad_request(f"'{name}': must be a boolean (true/false, 1/0, yes/no)")


def query_bool(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    return False if value is None else parse_bool(name, value)


async def parse_body(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    try:
        return model.model_validate_json(raw if raw.strip() else b"{}")
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise bad_request(
                "request body is not valid JSON", str(first.get("ctx", {}).get("error", ""))
            ) from None
        if first["type"] == "model_type" and not first["loc"]:
            raise bad_request("request body must be a JSON object") from None
        raise bad_request(models.validation_reason(e)) from None


def body_flag(raw: bytes, name: str) -> bool:
    """A boolean flag from a JSON body, for checks that run before the body is validated."""
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return False
    return isinstance(body, dict) and body.get(name) is True


def scan_for(request: web.Request, *, include_deleted: bool = True) -> dict[str, Any]:
    scan = request.app[SHIM].cache.get(request.match_info["scan_id"])
    if scan is None or (view.is_deleted(scan) and not include_deleted):
        raise not_found()
    return scan


def ok(body: Any) -> web.Response:
    return web.json_response(body)


def make_scan_id() -> str:
    return model.new_scan_id(time.time(), uuid.uuid4().hex)


async def result_of(shim: Shim, scan: dict[str, Any]) -> dict[str, Any]:
    recorded = (scan.get("status") or {}).get("result")
    if not recorded:
        return {}
    payload = await payloads.read_result(shim.api, shim.namespace, view.scan_id(scan))
    if payload is None:
        return {}
    return {"scan_id": view.scan_id(scan), "scan_result": payload, "is_final": bool(recorded.get("isFinal"))}


async def encoded(payload: Any, what: str) -> bytes:
    try:
        return await payloads.encode_async(payload, what)
    except payloads.PayloadTooLarge as e:
        raise ApiError(413, f"{what} too large", str(e)) from None


# --------------------------------------------------------------------------------------- handlers
async def root(request: web.Request) -> web.Response:
    return ok({})


async def healthz(request: web.Request) -> web.Response:
    """For probes: the app serves only after its Scan cache has synced, so serving means healthy."""
    if not request.app[SHIM].cache.synced.is_set():
        raise ApiError(503, "not ready", "The Scan cache has not synced yet.")
    return ok({})


async def openapi_json(request: web.Request) -> web.Response:
    from api_shim.openapi import document  # the document lists these routes

    return ok(document(ROUTES))


async def find_scans(request: web.Request) -> web.Response:
    body = await parse_body(request, models.FindBody)
    fields = view.find_projection(body.manifest_projection)
    refused = sorted(fields & view.FIND_DISALLOWED)
    if refused:
        raise bad_request(
            f"manifest_projection cannot include: {', '.join(refused)}",
            "These deprecated fields are too large to return from /scans/find.",
        )
    query = dict(body.filter)
    if "is_deleted" not in query and not body.include_deleted:
        query["is_deleted"] = False
    try:
        matches = compile_filter(query)
    except FilterError as e:
        raise bad_request(f"invalid filter: {e}") from None
    cache = request.app[SHIM].cache
    found = [m for m in (view.manifest(s) for s in cache) if matches(m)]
    found.sort(key=lambda m: m["scan_id"])
    return ok({"manifests": [view.project(m, fields) for m in found]})


async def backlog(request: web.Request) -> web.Response:
    entries = [e for e in (view.backlog_entry(s) for s in request.app[SHIM].cache.backlog()) if e]
    entries.sort(key=lambda e: (e["timestamp"], e["scan_id"]))
    return ok({"entries": entries})


async def _attach_event(shim: Shim, scan: dict[str, Any]) -> None:
    """Make the new scan an owner of its event; if the event vanished meanwhile, undo the scan."""
    try:
        await payloads.add_event_owner(shim.api, shim.namespace, scan["spec"]["sensorEventId"], scan)
    except ApiException as e:
        if e.status != 404:
            raise
        await shim.store.delete(view.scan_id(scan))
        shim.cache.forget(scan)
        raise bad_request("sensor event not found", "The sensor event was deleted meanwhile.") from None


async def launch_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.ScanRequestBody)
    s = shim.settings
    defaults = Defaults(
        s.default_scanner_server_memory,
        s.default_worker_memory,
        s.default_worker_disk,
        s.known_clusters,
        s.min_tag,
    )
    launch = normalise(body, await shim.tags.tags(), defaults)
    created_event = None
    if launch.event is not None:
        data = await encoded(launch.event, "sensor event")
        created_event = uuid.uuid4().hex
        await payloads.create_event(shim.api, shim.namespace, created_event, data)
        sensor_event_id = created_event
    else:
        sensor_event_id = launch.sensor_event_id or ""
        if not await payloads.event_exists(shim.api, shim.namespace, sensor_event_id):
            raise bad_request("sensor event not found", f"No stored sensor event has id {sensor_event_id!r}.")
    spec = {**launch.spec.to_kube(), "sensorEventId": sensor_event_id}
    timestamp = now()
    try:
        scan = await shim.store.create(make_scan_id(), spec, timestamp)
    except Exception:
        if created_event:  # nothing refers to it: do not leave it behind
            await client.CoreV1Api(shim.api).delete_namespaced_config_map(
                payloads.event_object_name(created_event), shim.namespace
            )
        raise
    await _attach_event(shim, scan)
    return ok(view.project(view.manifest(scan), view.body_projection(body.manifest_projection)))


async def get_scan_request(request: web.Request) -> web.Response:
    scan = request.app[SHIM].cache.get(request.match_info["scan_id"])
    if scan is None:
        raise not_found("scan request")
    return ok(view.scan_request(scan, request.app[SHIM].cache.rescan_ids(view.scan_id(scan))))


_NOT_COPIED = ("deleted", "replacedBy", "workerRequests", "rescanOf")


async def rescan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.RescanBody)
    original = scan_for(request)
    origin_id = view.scan_id(original)
    spec = {k: v for k, v in original["spec"].items() if k not in _NOT_COPIED}
    spec["rescanOf"] = origin_id
    new = await shim.store.create(make_scan_id(), spec, now())
    await _attach_event(shim, new)
    if body.abort_first or body.replace_scan:
        # After the new scan exists, so a failure never leaves the original aborted with no rescan.
        marks: dict[str, Any] = {}
        if body.abort_first:
            marks["deleted"] = True
        if body.replace_scan:
            marks["replacedBy"] = view.scan_id(new)
        await shim.store.update(origin_id, lambda _: Change(spec=marks, status={"lastUpdated": now()}))
    return ok(view.project(view.manifest(new), view.body_projection(body.manifest_projection)))


async def add_workers(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.AddWorkersBody)
    name = view.scan_id(scan_for(request))
    request_id = uuid.uuid4().hex

    def decide(scan: dict[str, Any]) -> Change:
        if view.is_deleted(scan):
            raise ApiError(422, "this scan has been deleted--cannot add workers")
        if view.workflow_id(scan) == NOT_YET_REQUESTED:
            raise ApiError(422, "a WMS workflow has not been assigned--cannot add workers")
        if view.has_final_result(scan):
            raise ApiError(422, "this scan has a final result--cannot add workers")
        existing = list(scan["spec"].get("workerRequests") or [])
        ask = {"id": request_id, "location": body.cluster_location, "nWorkers": body.n_workers}
        return Change(spec={"workerRequests": [*existing, ask]})

    await shim.store.update(name, decide)

    def answered(scan: dict[str, Any] | None) -> bool:
        return scan is None or any(o.get("id") == request_id for o in view.worker_outcomes(scan))

    scan = await shim.cache.wait_for(name, answered, shim.settings.add_workers_timeout)
    if scan is None or not answered(scan):
        raise ApiError(
            504,
            "the operator did not answer the add-workers request in time",
            f"Request {request_id} is recorded in spec.workerRequests; check `kubectl describe scan {name}`.",
        )
    outcome = next(o for o in view.worker_outcomes(scan) if o.get("id") == request_id)
    if outcome.get("state") != "Succeeded":
        raise ApiError(
            500,
            "failed to request additional workers on the WMS: "
            + str(outcome.get("reason") or "no reason recorded"),
        )
    return ok({"taskforce_uuid": outcome.get("taskforceUuid"), "n_workers": outcome.get("nWorkers")})


async def get_scan(request: web.Request) -> web.Response:
    scan = scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    return ok({"manifest": view.manifest(scan), "result": await result_of(request.app[SHIM], scan)})


async def delete_scan(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.DeleteBody)
    name = view.scan_id(scan_for(request))

    def decide(scan: dict[str, Any]) -> Change:
        if view.has_final_result(scan) and not body.delete_completed_scan:
            raise bad_request("Attempted to delete a completed scan (must use `delete_completed_scan=True`)")
        return Change(
            spec=None if view.is_deleted(scan) else {"deleted": True}, status={"lastUpdated": now()}
        )

    scan = await shim.store.update(name, decide)
    manifest = view.project(view.manifest(scan), view.body_projection(body.manifest_projection))
    return ok({"manifest": manifest, "result": await result_of(shim, scan)})


async def get_manifest(request: web.Request) -> web.Response:
    scan = scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    fields = view.pipe_projection(request.query.get("projection"))
    manifest = view.project(view.manifest(scan), fields)
    # The scanner (system role) reads its event through the deprecated field, as with the reference.
    if SYSTEM in request[IDENTITY].roles and (fields is None or "event_live_json_dict" in fields):
        event = await request.app[SHIM].event(scan["spec"]["sensorEventId"])
        if event is None:
            raise not_found("sensor event")
        manifest["event_live_json_dict"] = event
    return ok(manifest)


def _event_metadata_kube(em: models.EventMetadata) -> dict[str, Any]:
    return {
        "runId": em.run_id,
        "eventId": em.event_id,
        "eventType": em.event_type,
        "mjd": em.mjd,
        "isRealEvent": em.is_real_event,
    }


async def patch_manifest(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.PatchManifestBody)
    name = view.scan_id(scan_for(request))

    def decide(scan: dict[str, Any]) -> Change:
        status = scan.get("status") or {}
        change: dict[str, Any] = {}
        if body.progress:
            change["progress"] = replace_patch(status.get("progress"), body.progress.model_dump(mode="json"))
        if body.event_metadata:
            stored = view.event_metadata(status)
            if stored is None:
                change["eventMetadata"] = _event_metadata_kube(body.event_metadata)
            elif stored != body.event_metadata.model_dump():
                raise bad_request("Cannot change an existing event_metadata")
        if body.scan_metadata:
            stored_meta = status.get("scanMetadata")
            if not stored_meta:
                change["scanMetadata"] = body.scan_metadata
            elif stored_meta != body.scan_metadata:
                raise bad_request("Cannot change an existing scan_metadata")
        if change:
            change["lastUpdated"] = now()
        return Change(status=change or None)

    scan = await shim.store.update(name, decide)
    return ok(view.manifest(scan))


async def get_sensor_event(request: web.Request) -> web.Response:
    scan = scan_for(request)
    event = await request.app[SHIM].event(scan["spec"]["sensorEventId"])
    if event is None:
        raise not_found("sensor event")
    return ok({"sensor_event": event})


async def get_result(request: web.Request) -> web.Response:
    scan = scan_for(request, include_deleted=query_bool(request, "include_deleted"))
    return ok(await result_of(request.app[SHIM], scan))


async def put_result(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.PutResultBody)
    scan = shim.cache.get(request.match_info["scan_id"])
    if scan is None:
        raise bad_request("unknown scan", "A result can only be stored for an existing scan.")
    if not body.scan_result:
        return ok({})
    data = await encoded(body.scan_result, "scan result")
    await payloads.write_result(shim.api, shim.namespace, scan, data)
    # Recorded in status so the operator can finish the workflow once the result is final.
    record = {"result": {"isFinal": body.is_final, "updatedAt": now()}}
    await shim.store.update(view.scan_id(scan), lambda _: Change(status=record))
    return ok({"scan_id": view.scan_id(scan), "scan_result": body.scan_result, "is_final": body.is_final})


async def get_status(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    scan = scan_for(request)
    return ok(view.scan_status(scan, view.logs_url(scan, shim.settings.logs_url_template, shim.namespace)))


async def get_logs(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    scan = scan_for(request)
    return ok(
        {"scanner_server": {"url": view.logs_url(scan, shim.settings.logs_url_template, shim.namespace)}}
    )


async def get_workflow_id(request: web.Request) -> web.Response:
    return ok(view.workflow_id_view(scan_for(request)))


async def set_workflow_id(request: web.Request) -> web.Response:
    shim = request.app[SHIM]
    body = await parse_body(request, models.WorkflowIdBody)
    name = view.scan_id(scan_for(request))

    def decide(scan: dict[str, Any]) -> Change:
        if view.is_deleted(scan) or view.workflow_id(scan) != NOT_YET_REQUESTED:
            raise ApiError(
                404,
                "no scan whose workflow id can be set",
                "The workflow id is set once, and never on a deleted scan.",
            )
        return Change(status={"workflow": {"id": body.workflow_id, "address": body.wms_address}})

    return ok(view.manifest(await shim.store.update(name, decide)))


async def get_workforce(request: web.Request) -> web.Response:
    return ok(view.workforce(scan_for(request)))


async def get_taskforces(request: web.Request) -> web.Response:
    scan = scan_for(request)
    return ok({"taskforces": list((scan.get("status") or {}).get("taskforces") or [])})


# ------------------------------------------------------------------------------------------ table
U, S, US = frozenset({USER}), frozenset({SYSTEM}), frozenset({USER, SYSTEM})
SCAN_ID = "/scan/{scan_id}"

ROUTES: tuple[Route, ...] = (
    Route("GET", "/", root, "Service root.", U, models.Empty),
    Route("GET", "/openapi.json", openapi_json, "This API description (OpenAPI 3.1).", None, None),
    Route("GET", "/healthz", healthz, "Liveness and readiness (no auth).", None, models.Empty, errors=(503,)),
    Route(
        "POST",
        "/scans/find",
        find_scans,
        "Find manifests matching a MongoDB-style filter.",
        U,
        models.FindResponse,
        body=models.FindBody,
        errors=(400,),
    ),
    Route("GET", "/scans/backlog", backlog, "Scans waiting on the backlog.", U, models.BacklogResponse),
    Route(
        "POST",
        "/scan",
        launch_scan,
        "Start a new scan.",
        U,
        models.Manifest,
        body=models.ScanRequestBody,
        errors=(400, 413, 503),
    ),
    Route(
        "GET",
        "/scan-request/{scan_id}",
        get_scan_request,
        "The request that started a scan.",
        U,
        models.ScanRequestObj,
        errors=(404,),
    ),
    Route(
        "POST",
        SCAN_ID + "/actions/rescan",
        rescan,
        "Start a new scan from this scan's request.",
        US,
        models.Manifest,
        body=models.RescanBody,
        query=(NO_REDIRECT,),
        errors=(404, 503),
        redirect=True,
    ),
    Route(
        "POST",
        SCAN_ID + "/actions/add-workers",
        add_workers,
        "Add WMS workers to a running scan.",
        U,
        models.AddWorkersResponse,
        body=models.AddWorkersBody,
        query=(NO_REDIRECT,),
        errors=(400, 404, 422, 500, 503, 504),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID,
        get_scan,
        "Manifest and result.",
        US,
        models.ManifestAndResult,
        query=(NO_REDIRECT, INCLUDE_DELETED),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "DELETE",
        SCAN_ID,
        delete_scan,
        "Abort a scan and mark it deleted.",
        U,
        models.ManifestAndResult,
        body=models.DeleteBody,
        query=(NO_REDIRECT,),
        errors=(400, 404, 503),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID + "/manifest",
        get_manifest,
        "The manifest.",
        US,
        models.Manifest,
        query=(NO_REDIRECT, INCLUDE_DELETED, PROJECTION),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "PATCH",
        SCAN_ID + "/manifest",
        patch_manifest,
        "Update progress and set event/scan metadata.",
        S,
        models.Manifest,
        body=models.PatchManifestBody,
        errors=(400, 404, 503),
    ),
    Route(
        "GET",
        SCAN_ID + "/sensor-event",
        get_sensor_event,
        "The scan's sensor event.",
        US,
        models.SensorEventResponse,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID + "/result",
        get_result,
        "The stored result, or {}.",
        U,
        models.Result,
        query=(NO_REDIRECT, INCLUDE_DELETED),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "PUT",
        SCAN_ID + "/result",
        put_result,
        "Store a result.",
        S,
        models.Result,
        body=models.PutResultBody,
        errors=(400, 413, 503),
    ),
    Route(
        "GET",
        SCAN_ID + "/status",
        get_status,
        "Aggregated scan status.",
        US,
        models.StatusResponse,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID + "/logs",
        get_logs,
        "Log URLs.",
        U,
        models.LogsResponse,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID + "/wms/workflow-id",
        get_workflow_id,
        "The WMS workflow id.",
        US,
        models.WorkflowIdResponse,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "POST",
        SCAN_ID + "/wms/workflow-id",
        set_workflow_id,
        "Assign the WMS workflow id (once).",
        S,
        models.Manifest,
        body=models.WorkflowIdBody,
        errors=(400, 404, 503),
    ),
    Route(
        "GET",
        SCAN_ID + "/wms/workforce",
        get_workforce,
        "Workers of the scan's workflow.",
        US,
        models.Workforce,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
    Route(
        "GET",
        SCAN_ID + "/wms/taskforces",
        get_taskforces,
        "Batch submissions of the scan.",
        US,
        models.TaskforcesResponse,
        query=(NO_REDIRECT,),
        errors=(404,),
        redirect=True,
    ),
)
