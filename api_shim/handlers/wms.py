"""A scan's WMS side: its workflow id, workforce, taskforces, and requests for more workers."""

from __future__ import annotations

from aiohttp import web

from api_shim import rest_models, view
from api_shim.launch import n_workers_too_many, unknown_cluster
from api_shim.plumbing import SHIM, live_scan_for, ok, ok_spoken, parse_body, served
from skyscan import manifest
from skyscan.scan_record import ScanRecord


async def add_workers(request: web.Request) -> web.Response:
    body = await parse_body(request, rest_models.AddWorkersBody)
    settings = request.app[SHIM].settings
    if unknown := unknown_cluster(body.cluster_location, settings.known_clusters):
        raise unknown  # as launch refuses it; the operator asks the WMS by the launch's alias
    if too_many := n_workers_too_many("n_workers", body.n_workers, settings.max_n_workers):
        raise too_many
    name = view.scan_id(await live_scan_for(request))
    outcome = await request.app[SHIM].writes.add_workers(name, body.cluster_location, body.n_workers)
    return ok({"taskforce_uuid": outcome.taskforce_uuid, "n_workers": outcome.n_workers})


async def get_workflow_id(request: web.Request) -> web.Response:
    return await served(request, ("workflow-id",), view.workflow_id_view)


async def set_workflow_id(request: web.Request) -> web.Response:
    body = await parse_body(request, rest_models.WorkflowIdBody)
    name = view.scan_id(await live_scan_for(request))
    scan = await request.app[SHIM].writes.set_workflow_id(name, body.workflow_id, body.wms_address)
    return ok_spoken(request, manifest.of(scan))


async def get_workforce(request: web.Request) -> web.Response:
    return await served(request, ("workforce",), view.workforce)


async def get_taskforces(request: web.Request) -> web.Response:
    return await served(request, ("taskforces",), lambda scan: {"taskforces": ScanRecord(scan).taskforces})
