"""GET /scan/{scan_id}/logs/scanner-server: the scanner server's log, as text.

Once the scanner's container ended, the operator keeps its log with the scan (`skyscan.scanner_log`:
head and tail, a marker where bytes were cut, a last line saying how it ended), in the cluster and then
in the archive: that copy is answered (gzip as stored when the client accepts it). Before, the log is
read live from the kubelet through the API server (`pods/log`), streamed as it comes; with
`follow=true` it goes on until the container ends. The Pod is the one the Scan's status names, and
only if its name is one the Job controller gives to this scan's Pods (`scanner_log.is_scanner_pod`):
nothing a request says chooses whose log is read. Reads are for people (users, viewers); a scanner's
own credential reads none.
"""

from __future__ import annotations

import asyncio
import gzip
from contextlib import aclosing

from aiohttp import web

from api_shim import view
from api_shim.errors import ApiError
from api_shim.plumbing import SHIM, Shim, query_bool, scan_for
from api_shim.settings import ShimSettings
from skyscan import names, scanner_log
from skyscan.io import kube
from skyscan.io.kube_errors import KubeError, NotFound, is_outage
from skyscan.scan_record import ScanRecord

TEXT = "text/plain; charset=utf-8"
STALLED_SECONDS = 60.0  # a write the client has not taken in after this long ends its stream
ANSWER_SECONDS = 10.0  # for the API server to start answering a live read
IDLE_SECONDS = 30.0  # between two chunks of a live read that does not follow
# What the kubelet sends instead of a log when the container was removed since the Pod was read.
CONTAINER_GONE = b"unable to retrieve container logs for "
HEADERS = {"Content-Type": TEXT, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class LogStreams:
    """The live reads open now (tasks), within the cap; closed when the shim stops."""

    def __init__(self, settings: ShimSettings) -> None:
        self.limit = settings.max_log_streams
        self.open: set[asyncio.Task[object]] = set()
        self.closing = False

    def admit(self) -> None:
        if self.closing:
            raise ApiError(503, "shutting down", "This shim is stopping; read the log again.")
        if len(self.open) >= self.limit:
            raise ApiError(
                503,
                "too many log streams",
                f"This shim reads at most {self.limit} scanner logs live at once; try again later.",
                {"Retry-After": "30"},
            )

    def close(self) -> None:
        self.closing = True
        for task in self.open:
            task.cancel()


LOG_STREAMS = web.AppKey("log_streams", LogStreams)


async def close_log_streams(app: web.Application) -> None:
    """on_shutdown: a followed log would otherwise hold the shutdown for its whole timeout."""
    app[LOG_STREAMS].close()


def no_log(message: str) -> ApiError:
    return ApiError(404, "scanner log not found", message)


async def scanner_server_log(request: web.Request) -> web.StreamResponse:
    shim = request.app[SHIM]
    follow = query_bool(request, "follow")
    scan = await scan_for(request)
    if (kept := await shim.scans.scanner_log(scan)) is not None:
        return await _kept(request, kept)
    scan_id, record = view.scan_id(scan), ScanRecord(scan)
    pod = record.scanner_pod
    if record.archived_at is not None or pod is None:
        raise no_log("The scan's scanner has not started, or its log was not kept.")
    if not scanner_log.is_scanner_pod(scan_id, pod):
        raise no_log("The scan's status names no Pod of its scanner Job.")
    return await _live(request, shim, scan_id, pod, follow=follow)


async def _kept(request: web.Request, data: bytes) -> web.Response:
    headers = {"Content-Type": TEXT, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        return web.Response(body=data, headers={**headers, "Content-Encoding": "gzip"})
    return web.Response(body=await asyncio.to_thread(gzip.decompress, data), headers=headers)


async def _live(
    request: web.Request, shim: Shim, scan_id: str, pod: str, *, follow: bool
) -> web.StreamResponse:
    streams = request.app[LOG_STREAMS]
    streams.admit()
    task = asyncio.current_task()
    assert task is not None
    streams.open.add(task)
    try:
        path = kube.core_path("pods", shim.namespace, pod, "log")
        params = {"container": names.container_name(scan_id), "follow": follow}
        idle = None if follow else IDLE_SECONDS
        async with aclosing(shim.api.chunks(path, params, answer=ANSWER_SECONDS, idle=idle)) as chunks:
            try:
                first = await anext(chunks, b"")
            except NotFound:  # the Pod went since the scan was read: its log may be kept by now
                return await _gone(request, shim, scan_id)
            except (KubeError, TimeoutError) as e:
                raise _unreadable(e) from None
            if first.startswith(CONTAINER_GONE):  # the kubelet's word, as a 200, for a removed container
                return await _gone(request, shim, scan_id)
            response = web.StreamResponse(headers=HEADERS)
            await response.prepare(request)
            try:
                async with asyncio.timeout(STALLED_SECONDS):
                    await response.write(first)
                async for chunk in chunks:
                    async with asyncio.timeout(STALLED_SECONDS):
                        await response.write(chunk)
            except (ConnectionError, KubeError, TimeoutError, OSError):  # either side went: the stream ends
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof()
            return response
    finally:
        streams.open.discard(task)


async def _gone(request: web.Request, shim: Shim, scan_id: str) -> web.Response:
    scan = shim.scans.live(scan_id) or await shim.scans.get(scan_id)
    kept = await shim.scans.scanner_log(scan) if scan is not None else None
    if kept is None:
        raise no_log("The scanner's Pod is gone and its log was not kept (yet: try again in a moment).")
    return await _kept(request, kept)


def _unreadable(e: Exception) -> ApiError:
    """The API server could not give the running scanner's log (its node cannot be reached, the
    container has not started): a 503 that says so, never a 500."""
    detail = f"the API server answered {e.status}" if isinstance(e, KubeError) else "no answer in time"
    if isinstance(e, KubeError) and not is_outage(e):
        detail += f": {e.message[:200]}"
    return ApiError(
        503,
        "scanner log unavailable",
        f"The scanner's log cannot be read now ({detail}).",
        {"Retry-After": "5"},
    )
