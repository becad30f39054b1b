"""The shim's access log: one line a request at INFO (`SKYSCAN_LOG_LEVEL=WARNING` leaves it out).

A line holds the method, the route template (never the path asked for, nor its query string, which may
hold a presigned URL's signature), the status, the duration, the kind of principal that called
(`anonymous`, `user`, `system`, `scanner`; never a name or a token) and the scan a route names. Every
field is chosen at the source, so the record holds nothing secret and the formatters write it as it is,
with no redaction pass over the line: a method is a known one or `OTHER`, a route a template of the
route table, and the scan id, the only text a client chose, is escaped where it is written.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from api_shim.auth import PEOPLE, SYSTEM, USER, Identity
from api_shim.metrics import UNMATCHED, method_name, template
from api_shim.plumbing import IDENTITY
from skyscan import logs

LOGGER = "api_shim.access"


def principal(identity: Identity | None) -> str:
    """The kind of caller: none authenticated, a scanner's own credential, a person (`user`, a viewer
    too), or the system."""
    if identity is None:
        return "anonymous"
    if identity.scan_id is not None:
        return "scanner"
    return USER if identity.roles & PEOPLE else SYSTEM


def _matched(request: web.BaseRequest) -> web.UrlMappingMatchInfo | None:
    """The route a request matched; none for one refused before routing (a malformed request, whose
    `match_info` aiohttp asserts is unset)."""
    try:
        return request.match_info  # type: ignore[attr-defined,no-any-return]
    except (AttributeError, AssertionError):
        return None


def line(request: web.BaseRequest, status: int, seconds: float) -> tuple[str, dict[str, object]]:
    """The access line of a request answered with `status` after `seconds`: its message and fields."""
    match_info = _matched(request)
    route = template(match_info.route.resource) if match_info is not None else UNMATCHED
    method, who = method_name(request.method), principal(request.get(IDENTITY))
    # Whole microseconds and tenths of a millisecond: integer arithmetic, a third of the cost of
    # round(ms, 3) and a float's format (a line a request).
    us = int(seconds * 1_000_000 + 0.5)
    tenths = (us + 50) // 100
    fields: dict[str, object] = {
        "method": method, "route": route, "status": status, "duration_ms": us / 1000, "principal": who,
    }  # fmt: skip
    if match_info is not None and (scan_id := match_info.get("scan_id")):
        fields["scan_id"] = scan_id
    return f"{method} {route} {status} {tenths // 10}.{tenths % 10}ms {who}", fields


def record(request: web.BaseRequest, status: int, seconds: float) -> logs.CleanRecord:
    message, fields = line(request, status, seconds)
    return logs.CleanRecord(LOGGER, logging.INFO, message, **fields)


class AccessLogger(AbstractAccessLogger):
    """A connection's access logger: its lines straight to the batched writer when nothing else would
    see them (`logs.info_lines`), else as records through `logging`."""

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self.write = logs.info_lines(logger)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.write is not None:
            self.write(*line(request, response.status, time))
        else:
            self.logger.handle(record(request, response.status, time))  # no caller lookup, no `extra` checks

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def refused_requests_in_brief(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it could not parse as an error with a traceback whose message quotes the
    raw bytes (a folded Authorization header's token among them): it is the client's mistake, one line
    naming its kind."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError):
        record.msg, record.args = "refused a malformed HTTP request (%s %s)", (exc.code, type(exc).__name__)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True
