"""The Scan versions a request wrote, answered as `Skyscan-Version` (read-your-writes across replicas,
`freshness`). The store notes each version it writes; the handler aiohttp calls for each route
(`api_shim.app.guard`) answers the highest."""

from __future__ import annotations

import contextvars
from typing import Any

from aiohttp import web

from api_shim.errors import bad_request
from skyscan.scan_record import resource_version

WRITTEN_HEADER = "Skyscan-Version"
MIN_VERSION_HEADER = "Skyscan-Min-Version"


class Written:
    """The highest Scan resourceVersion one request wrote (0: none)."""

    version = 0

    def answer(self, response: web.StreamResponse) -> None:
        """Answer a write with the version it wrote (`Skyscan-Version`)."""
        if self.version and not response.prepared:
            response.headers[WRITTEN_HEADER] = str(self.version)


_written: contextvars.ContextVar[Written | None] = contextvars.ContextVar("skyscan_written", default=None)


def wrote(obj: dict[str, Any]) -> None:
    """Note a Scan version the current request wrote (the store calls it after each write)."""
    written = _written.get()
    if written is not None:
        written.version = max(written.version, resource_version(obj))


def noting() -> tuple[Written, contextvars.Token[Written | None]]:
    """Note the versions the current request writes from now on (`wrote`), until `noted(token)`."""
    written = Written()
    return written, _written.set(written)


def noted(token: contextvars.Token[Written | None]) -> None:
    _written.reset(token)


def min_version(request: web.Request) -> int | None:
    raw = request.headers.get(MIN_VERSION_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"'{MIN_VERSION_HEADER}': must be a resourceVersion (a whole number)") from None
