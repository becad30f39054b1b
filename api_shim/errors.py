"""Error bodies: `{error: <HTTP reason phrase>, reason: <specific text>, message: <explanation>}`.

Handlers raise `ApiError`; the handler aiohttp calls for each route (`api_shim.app.guard`) renders it
(`error_response`), unknown paths and wrong methods (`api_shim.app.unmatched`), the outages of the
archive and of the API server (503s that name which, never the driver's words) and anything
unexpected, so no response ever leaves without that shape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import asyncpg
from aiohttp import web

from skyscan import logs
from skyscan.io.archive import ArchiveUnavailable
from skyscan.io.kube_errors import KubeError, is_outage

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(
        self, status: int, reason: str, message: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.message = message or reason
        self.headers = headers


def bad_request(reason: str, message: str | None = None) -> ApiError:
    return ApiError(400, reason, message or f"The request was rejected: {reason}")


def not_found(what: str = "scan") -> ApiError:
    return ApiError(
        404, f"{what} not found", f"No {what} with this id (or it is deleted; see include_deleted)."
    )


def unavailable(detail: str) -> ApiError:
    return ApiError(503, "kubernetes API unavailable", f"The write could not be stored: {detail}")


# What the archive raises when PostgreSQL is away, slow (statement timeout) or cut the connection.
ARCHIVE_ERRORS = (
    ArchiveUnavailable,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


def archive_unavailable(e: BaseException) -> ApiError:
    log.warning("the archive did not answer: %r", e)  # the driver's words are for the log, not a client
    return ApiError(503, "archive unavailable", "The archive of finished scans did not answer; try again.")


def error_body(status: int, reason: str, message: str) -> dict[str, str]:
    return {"error": HTTPStatus(status).phrase, "reason": reason, "message": message}


def json_error(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, reason, message), status=status, headers=headers)


def _about(request: web.Request) -> dict[str, str]:
    scan_id = request.match_info.get("scan_id")
    return logs.about(scan_id) if scan_id else {}


def error_response(request: web.Request, e: Exception) -> web.Response:
    """The answer to what a handler raised, in the error body's shape. A redirection (an HTTP exception
    below 400) is raised again, for aiohttp to answer."""
    if isinstance(e, ApiError):
        return json_error(e.status, e.reason, e.message, e.headers)
    if isinstance(e, ARCHIVE_ERRORS):  # before OSError: an archive outage is no API server's
        error = archive_unavailable(e)
        return json_error(error.status, error.reason, error.message)
    if isinstance(e, web.HTTPException):
        if e.status < 400:
            raise e
        headers = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        phrase = HTTPStatus(e.status).phrase
        return json_error(e.status, phrase.lower(), e.text or phrase, headers)
    if isinstance(e, KubeError):
        if is_outage(e):
            return json_error(503, "kubernetes API unavailable", f"The API server answered {e.status}.")
        if e.quota_exceeded:
            return json_error(
                503,
                "quota exceeded",
                "The namespace's resource quota is used up: nothing was stored; try again later.",
            )
        log.exception(
            "unexpected API server answer on %s %s", request.method, request.path, extra=_about(request)
        )
        return json_error(500, "internal error", f"The API server answered {e.status}: {e.reason}.")
    if is_outage(e):  # no answer: the API server is the shim's only other peer
        log.warning("the API server did not answer on %s %s: %r", request.method, request.path, e)
        return json_error(503, "kubernetes API unavailable", "The API server did not answer; try again.")
    log.exception("unhandled error on %s %s", request.method, request.path, extra=_about(request))
    return json_error(500, "internal error", "An unexpected error occurred; see the shim's log.")
