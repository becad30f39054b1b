"""GET /scan/{scan_id}/events: a scan's changes as Server-Sent Events, straight from the watch cache.

Every stream of one scan shares a `Channel`, that scan's one follower in the cache: a change of the
Scan marks the channel's message stale and wakes its streams, and each stream then sends the latest
state, rendered once per version for all of them. A stream that falls behind skips the versions it
missed: it never queues a backlog (its socket's buffers hold at most what it could not write yet, and a
client that reads nothing for `STALLED_SECONDS` loses its stream). No stream reads the API server.

Each message is `id: <resourceVersion>`, `event: scan`, `data: <one JSON line>`; after the one showing
an end (a final result, or a failed, aborted or deleted scan that has nothing left to do) comes
`event: end` and the stream closes. A scan that leaves the cluster is read once more from the archive.
A stream that closes without `end` (the shim stops, a client stalled) is to be followed anew.

GET /scans/events: one stream for a page of scans (the dashboard's table). It follows the scans the
query names (`scan_id`, up to `MAX_ROWS`) and sends each one's row (`event: scan`, `view.table_row`)
as it changes, at most one message per scan per `ROWS_EVERY` seconds (a burst of changes sends the
latest), `event: gone` when one leaves the cluster, and `event: new` (`{"count": n}`) when scans
arrive, for the page to read its first rows again. It never ends by itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from api_shim import view
from api_shim.errors import ApiError, bad_request
from api_shim.metrics import METRICS
from api_shim.plumbing import FOUND, SHIM, Shim, scan_for
from api_shim.repository import Scans
from api_shim.settings import ShimSettings
from skyscan import manifest
from skyscan.scan_record import ScanRecord, resource_version

KEEPALIVE = b": keepalive\n\n"
END = b"event: end\ndata: {}\n\n"
STALLED_SECONDS = 60.0  # a write the client has not taken in after this long ends its stream
MAX_ROWS = 200  # scans one /scans/events stream follows
ROWS_EVERY = 0.5  # seconds between a rows stream's messages: a busy scan costs its viewers 2 a second
HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # a proxy (nginx, its ingress) must pass each message on at once
}


@dataclass(frozen=True)
class Message:
    version: int  # the Scan's resourceVersion
    data: bytes  # the whole message, as sent
    final: bool  # the scan has ended: `end` follows


def ended(scan: dict[str, Any]) -> bool:
    """A final result, or nothing left to happen (failed, aborted, deleted, archived)."""
    record = ScanRecord(scan)
    return record.has_final_result or record.is_terminal or record.archived_at is not None


def message(scan: dict[str, Any], logs_url: str | None) -> Message:
    record = ScanRecord(scan)
    body = {
        "scan_id": record.name,
        "status": view.scan_status(scan, logs_url),
        "progress": manifest.progress(scan),
        "result": {"is_final": record.has_final_result} if record.has_result else None,
    }
    version = resource_version(scan)
    return Message(version, _sse("scan", body, version), ended(scan))


def _sse(event: str, body: Any, version: int | None = None) -> bytes:
    """One Server-Sent Event: its id (a Scan's version) when it has one, its kind, its one JSON line."""
    head = "" if version is None else f"id: {version}\n"
    return f"{head}event: {event}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def _logs_url(shim: Shim, scan: dict[str, Any]) -> str | None:
    return view.logs_url(scan, shim.settings.logs_url_template, shim.namespace)


class Channel:
    """One followed scan: its latest message and the event its streams wait on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.streams = 0
        self.changed = asyncio.Event()
        self._message: Message | None = None  # None: stale, rendered again when next asked for

    def wake(self) -> None:
        """The cache took a new version of the Scan, or dropped it."""
        self._message = None
        self.changed.set()
        self.changed = asyncio.Event()

    def latest(self, shim: Shim) -> Message | None:
        """The Scan's message as the cache holds it now; None once the cache no longer has it."""
        if self._message is None:
            scan = shim.scans.live(self.name)
            if scan is None:
                return None
            self._message = message(scan, _logs_url(shim, scan))
        return self._message


class EventStreams:
    """The app's open streams, by followed scan, within the cap."""

    def __init__(self, settings: ShimSettings) -> None:
        self.limit = settings.max_event_streams
        self.keepalive = settings.event_keepalive_seconds
        self.open = 0
        self.closing = False
        self._channels: dict[str, Channel] = {}
        self.tables: set[Rows] = set()  # the open /scans/events streams' changes

    @contextmanager
    def channel(self, scans: Scans, name: str) -> Iterator[Channel]:
        """Scan `name`'s channel, followed in the cache while any stream uses it."""
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = Channel(name)
            scans.follow(name, channel.wake)
        channel.streams += 1
        try:
            yield channel
        finally:
            channel.streams -= 1
            if not channel.streams:
                del self._channels[name]
                scans.unfollow(name, channel.wake)

    def close(self) -> None:
        """The shim is stopping: every stream closes now (no `end`: its clients follow anew)."""
        self.closing = True
        for channel in self._channels.values():
            channel.wake()
        for rows in self.tables:
            rows.changed.set()


STREAMS = web.AppKey("event_streams", EventStreams)


async def close_streams(app: web.Application) -> None:
    """on_shutdown: streams would otherwise hold the shutdown for its whole timeout."""
    app[STREAMS].close()


async def _followed(request: web.Request) -> tuple[str, Message | None]:
    """The scan the path names and, if it is archived (not in the cache), its one message: what a
    stream keeps for its life, not the scan (a few KiB each; a live one is read from the cache)."""
    shim = request.app[SHIM]
    scan = await scan_for(request)
    request.pop(FOUND, None)
    name = view.scan_id(scan)
    return name, None if shim.scans.is_live(name) else message(scan, _logs_url(shim, scan))


def _admit(streams: EventStreams) -> None:
    if streams.closing:
        raise ApiError(503, "shutting down", "This shim is stopping; follow again.")
    if streams.open >= streams.limit:
        raise ApiError(
            503,
            "too many event streams",
            f"This shim serves at most {streams.limit} event streams at once; poll GET /scan/{{id}}/status.",
            {"Retry-After": "30"},
        )


@contextmanager
def _open(request: web.Request) -> Iterator[web.StreamResponse]:
    """A stream's response, counted while open; a client that left or stopped reading ends it."""
    streams, gauge = request.app[STREAMS], request.app[METRICS].event_streams
    response = web.StreamResponse(headers=HEADERS)
    streams.open += 1
    gauge.inc()
    try:
        yield response
    except ConnectionError:  # the client left
        pass
    except TimeoutError:  # the client stopped reading: its connection goes, unflushed
        if request.transport is not None:
            request.transport.abort()
    finally:
        streams.open -= 1
        gauge.dec()


async def _send(response: web.StreamResponse, data: bytes) -> None:
    async with asyncio.timeout(STALLED_SECONDS):
        await response.write(data)


async def scan_events(request: web.Request) -> web.StreamResponse:
    shim, streams = request.app[SHIM], request.app[STREAMS]
    name, archived = await _followed(request)
    _admit(streams)
    with _open(request) as response, streams.channel(shim.scans, name) as channel:
        await response.prepare(request)
        await _follow(response, channel, shim, streams, archived)
    return response


async def _follow(
    response: web.StreamResponse,
    channel: Channel,
    shim: Shim,
    streams: EventStreams,
    archived: Message | None,
) -> None:
    """Send the current state, then each change, until the scan ends (`end`) or the shim stops."""

    async def send(data: bytes) -> None:
        await _send(response, data)

    sent = -1
    changed = channel.changed  # taken with the state it follows: a change while sending is not missed
    latest = channel.latest(shim) or archived
    while True:
        if latest is None:  # it left the cluster: archived (its last state is there) or deleted
            try:
                gone = await shim.scans.get(channel.name)
            except ApiError:  # the archive does not answer: no `end`, the client follows anew
                return
            if gone is None:
                break
            latest = message(gone, _logs_url(shim, gone))
        if latest.version != sent:
            await send(latest.data)
            sent = latest.version
        if latest.final:
            break
        try:
            async with asyncio.timeout(streams.keepalive):
                await changed.wait()
        except TimeoutError:
            await send(KEEPALIVE)
        if streams.closing:
            return
        changed = channel.changed
        latest = channel.latest(shim)
    await send(END)


class Rows:
    """What changed, for one rows stream, since it last sent: the followed scans that did, and how many
    scans arrived."""

    def __init__(self, names: list[str], opening: set[str]) -> None:
        self.changed = asyncio.Event()
        self.dirty = opening  # the rows the stream opens with (the page has the others')
        self.arrived = 0
        self.wakes = {name: self._waker(name) for name in names}

    def _waker(self, name: str) -> Callable[[], None]:
        def wake() -> None:
            self.dirty.add(name)
            self.changed.set()

        return wake

    def new(self) -> None:
        self.arrived += 1
        self.changed.set()

    def take(self) -> tuple[set[str], int]:
        taken = self.dirty, self.arrived
        self.dirty, self.arrived = set(), 0
        self.changed.clear()
        return taken


@contextmanager
def _watching(scans: Scans, streams: EventStreams, rows: Rows) -> Iterator[Rows]:
    for name, wake in rows.wakes.items():
        scans.follow(name, wake)
    scans.follow_new(rows.new)
    streams.tables.add(rows)
    try:
        yield rows
    finally:
        streams.tables.discard(rows)
        scans.unfollow_new(rows.new)
        for name, wake in rows.wakes.items():
            scans.unfollow(name, wake)


def _names(request: web.Request) -> list[str]:
    names = list(dict.fromkeys(request.query.getall("scan_id", [])))
    if len(names) > MAX_ROWS:
        raise bad_request(f"scan_id: at most {MAX_ROWS} scans per stream", "Follow fewer scans.")
    if any(not 0 < len(name) <= 253 for name in names):
        raise bad_request("scan_id: a scan id has 1 to 253 characters", "Name each scan by its id.")
    return names


async def scans_events(request: web.Request) -> web.StreamResponse:
    shim, streams = request.app[SHIM], request.app[STREAMS]
    names = _names(request)
    rows = Rows(names, {name for name in names if shim.scans.is_live(name)})  # archived: the page has theirs
    _admit(streams)
    with _open(request) as response, _watching(shim.scans, streams, rows):
        await response.prepare(request)
        while not streams.closing:
            changed, arrived = rows.take()
            for name in sorted(changed):
                scan = shim.scans.live(name)
                await _send(
                    response,
                    _sse("gone", {"scan_id": name}) if scan is None else _sse("scan", view.table_row(scan)),
                )
            if arrived:
                await _send(response, _sse("new", {"count": arrived}))
            await asyncio.sleep(ROWS_EVERY)  # the pace of a busy table: changes meanwhile wait to be sent
            try:
                async with asyncio.timeout(streams.keepalive):
                    await rows.changed.wait()
            except TimeoutError:
                await _send(response, KEEPALIVE)
    return response
