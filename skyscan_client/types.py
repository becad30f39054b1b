"""The interface's response shapes that the client and the command read by name.

Manifests, progress and results are open objects that grow with the scanner; they stay `dict`s.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

Json = dict[str, Any]


class ErrorBody(TypedDict):
    error: str
    reason: str
    message: str


class LogUrl(TypedDict):
    url: str | None


class Logs(TypedDict):
    scanner_server: LogUrl


class Status(TypedDict):
    scan_state: str
    is_deleted: bool
    wms_deactivated: str | None
    scan_complete: bool
    scanner_server_logs: LogUrl
    wms_workforce: Json
    backlog: NotRequired[Json | None]  # where a waiting scan stands (newer services)


class Result(TypedDict, total=False):
    """`{}` until the scanner has sent one."""

    scan_id: str
    scan_result: Json
    is_final: bool


class ManifestAndResult(TypedDict):
    manifest: Json
    result: Result


class AddedWorkers(TypedDict):
    taskforce_uuid: str
    n_workers: int


class WorkflowId(TypedDict):
    workflow_id: str | None
    requested_wms_workflow: bool
    eligible_for_wms: bool
    wms_address: str | None
