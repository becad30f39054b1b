"""Request bodies: read once, held only while their request is handled, and only so many bytes at once.

A handler reads its body whole (up to `SKYSCAN_MAX_BODY_BYTES`), then parses and re-encodes it. Read
through aiohttp's `request.read()`, a body stayed cached on its request, which aiohttp keeps until the
connection's next request: thirty idle keep-alive connections that had each sent 31 MB held 930 MB,
past the chart's 1 GiB limit with the work on top. `body_of` reads it instead, and `BodyBudget.room`
lets it go when the handler is done and bounds the bytes of the bodies handled at once. A body
waiting for room is not read: aiohttp stops reading a connection once about 128 KiB of it is buffered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext

from aiohttp import web

from api_shim.errors import ApiError

NO_BODY: AbstractAsyncContextManager[None] = nullcontext()  # a request without one: nothing to hold


class BodyBudget:
    """Request bodies are handled while their sizes (each its Content-Length, or the largest accepted
    for a chunked one) add up to at most `total` bytes; one body always fits. A request waits for room
    at most `wait` seconds, then 503."""

    def __init__(self, total: int, largest: int, wait: float) -> None:
        self.total = total
        self.largest = largest
        self.wait = wait
        self.held = 0
        self.peak = 0  # the most held at once, for tests and curiosity
        self._room = asyncio.Condition()

    def size(self, request: web.BaseRequest) -> int:
        """What a request's body may take: 0 without one."""
        if not request.body_exists:
            return 0
        length = request.content_length
        return self.largest if length is None else min(length, self.largest)

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.total

    def room(self, request: web.Request) -> AbstractAsyncContextManager[None]:
        """Hold room for the request's body while the block runs; then let go of the body read. A
        request without a body (most: the GETs) gets a shared context that does nothing."""
        size = self.size(request)
        return self._held(request, size) if size else NO_BODY

    @asynccontextmanager
    async def _held(self, request: web.Request, size: int) -> AsyncIterator[None]:
        async with self._room:
            try:
                await asyncio.wait_for(self._room.wait_for(lambda: self._fits(size)), self.wait)
            except TimeoutError:
                raise ApiError(
                    503,
                    "too many request bodies",
                    f"The shim holds at most {self.total} bytes of request bodies at once and had no room "
                    f"for {size} within {self.wait:g} s; try again.",
                    {"Retry-After": "5"},
                ) from None
            self.held += size
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            request.pop(BODY, None)
            async with self._room:
                self.held -= size
                self._room.notify_all()


BODIES = web.AppKey("bodies", BodyBudget)
BODY = web.RequestKey("body", bytes)


async def body_of(request: web.Request) -> bytes:
    """The request's body, read once per request (413 beyond `SKYSCAN_MAX_BODY_BYTES`)."""
    if BODY in request:
        return request[BODY]
    largest = request.app[BODIES].largest
    if (request.content_length or 0) > largest:
        raise _too_large(largest)
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > largest:
            raise _too_large(largest)
        chunks.append(chunk)
    request[BODY] = body = b"".join(chunks)
    return body


def _too_large(largest: int) -> ApiError:
    return ApiError(413, "request body too large", f"A request body is at most {largest} bytes.")
