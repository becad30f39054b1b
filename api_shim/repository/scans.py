"""Where a scan is, and how it is read and changed there: the one place that knows the watch-backed cache,
the API server (`ScanStore`, read-your-writes through `Freshness`), the encoded forms kept per version,
the finds over both stores, and the archive.

A live scan is a Scan object with ConfigMaps for its payloads; a finished one is moved to the archive
(`skyscan.io.archive`) by the operator, which commits the archived copy before it deletes the Scan. Every
read and mark here follows that order: a scan archived between two reads is found in the second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from api_shim.errors import ARCHIVE_ERRORS, ApiError, archive_unavailable, bad_request, not_found
from api_shim.find import search
from api_shim.repository import table, versions
from api_shim.repository.cache import ScanCache
from api_shim.repository.encoded import EncodedForms, Form, Kept
from api_shim.repository.freshness import Freshness
from api_shim.repository.store import Change, Obj, ScanStore, now
from api_shim.repository.writes import ScanWrites
from api_shim.wire_names import Names
from skyscan import model
from skyscan.io import kube, payloads
from skyscan.io.archive import Archive
from skyscan.io.kube_errors import Conflict, NotFound
from skyscan.names import is_object_name
from skyscan.scan_record import ScanRecord

INLINE_DECODE_BYTES = 64 * 1024  # a larger archived payload is unpacked in a thread
EVENTS_KEPT = 16  # sensor events are immutable, and a scan's followers and rescans read one repeatedly


def archived(scan: Obj) -> bool:
    return ScanRecord(scan).archived_at is not None


def marked(scan: Obj, spec: dict[str, Any], at: float) -> Obj:
    """An archived scan with `spec` merged in and its manifest change recorded (pure)."""
    record = ScanRecord(scan)
    status = {**record.status, **model.ScanStatus(last_updated=at).to_patch()}
    return {**scan, "spec": {**record.spec, **spec}, "status": status}


async def unpacked(data: bytes) -> Any:
    """An archived payload (gzip JSON, as `skyscan.io.payloads` stores it), parsed."""

    def unpack() -> Any:
        return json.loads(gzip.decompress(data))

    return unpack() if len(data) <= INLINE_DECODE_BYTES else await asyncio.to_thread(unpack)


def new_scan_id() -> str:
    return model.new_scan_id(time.time(), uuid.uuid4().hex)


@dataclass(frozen=True)
class WatchFigures:
    """How the live copy fares, for /metrics."""

    cached: int  # Scans held
    relists: int  # listings after the first
    idle_seconds: float  # since the watch last brought an event or a bookmark
    broken_seconds: float  # the list and watch have been failing (0: they work)


class Scans:
    def __init__(
        self, api: kube.Kube, namespace: str, cache: ScanCache, timeout: float, archive: Archive | None = None
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._cache = cache
        self._store = ScanStore(api, namespace, cache, timeout)  # live Scans, written in the API server
        self._freshness = Freshness(cache, self._store.read)
        self._encoded = EncodedForms(cache)  # REST forms of live scans, encoded once per version
        self._archive = archive  # None: live-only
        self._finds = search.Finds(cache, archive, namespace, self._encoded)  # finds over both
        self._events: OrderedDict[str, Any] = OrderedDict()

    @classmethod
    async def connect(
        cls, api: kube.Kube, namespace: str, *, watch_timeout: int, timeout: float, archive: Archive | None
    ) -> Scans:
        """The scans of `namespace`, once the live copy has listed them all (60 s at most)."""
        cache = ScanCache(api, namespace, watch_timeout)
        await cache.start()
        await asyncio.wait_for(cache.synced.wait(), timeout=60)
        return cls(api, namespace, cache, timeout, archive)

    async def close(self) -> None:
        await self._cache.stop()
        if self._archive is not None:
            await self._archive.close()

    # --- the live copy ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """Whether the live copy has listed every Scan once."""
        return self._cache.synced.is_set()

    def broken_for(self) -> float:
        """Seconds the live copy's watch of the API server has been broken (0: it works)."""
        return self._cache.broken_for()

    def watch_figures(self) -> WatchFigures:
        cache = self._cache
        return WatchFigures(
            len(cache), cache.relists, time.monotonic() - cache.last_event, cache.broken_for()
        )

    def is_live(self, scan_id: str) -> bool:
        """Whether the scan is a Scan in the cluster (as the live copy holds it), not archived or unknown."""
        return scan_id in self._cache

    def live(self, scan_id: str) -> Obj | None:
        """The live Scan as the live copy holds it now (no API server or archive read)."""
        return self._cache.get(scan_id)

    def live_and_current(self, scan_id: str) -> bool:
        """Whether the scan is live and not replaced: the most common read, known by one lookup."""
        held = self._cache.held.get(scan_id)
        return held is not None and held.replaced_by is None

    def replaced_by(self, scan_id: str) -> str | None:
        """The scan that replaced a live one (None: not replaced, or not live)."""
        return self._cache.replaced_by(scan_id)

    def follow(self, scan_id: str, wake: Callable[[], None]) -> None:
        """Call `wake` whenever the live copy of the scan changes or goes, until `unfollow`."""
        self._cache.follow(scan_id, wake)

    def unfollow(self, scan_id: str, wake: Callable[[], None]) -> None:
        self._cache.unfollow(scan_id, wake)

    def follow_new(self, wake: Callable[[], None]) -> None:
        """Call `wake` whenever a scan the live copy did not hold arrives, until `unfollow_new`."""
        self._cache.follow_new(wake)

    def unfollow_new(self, wake: Callable[[], None]) -> None:
        self._cache.unfollow_new(wake)

    def backlog(self) -> list[Obj]:
        """The live scans waiting for admission."""
        return self._cache.backlog()

    async def reach(self, request: web.Request) -> None:
        """Wait until the live copy holds the version the request asks for (`Skyscan-Min-Version`)."""
        await self._freshness.reach(request)

    @staticmethod
    def asks_version(request: web.Request) -> bool:
        return versions.MIN_VERSION_HEADER in request.headers

    @staticmethod
    @contextmanager
    def noting_writes() -> Iterator[versions.Written]:
        """The highest Scan version written while in the block (answered as `Skyscan-Version`)."""
        written, token = versions.noting()
        try:
            yield written
        finally:
            versions.noted(token)

    @staticmethod
    def is_archived(scan: Obj) -> bool:
        return archived(scan)

    def writes(self, add_workers_timeout: float) -> ScanWrites:
        """The write sequences over these scans."""
        return ScanWrites(
            self, self._store, self._cache, add_workers_timeout, archive=self._archive is not None
        )

    # --- encoded forms and finds -----------------------------------------------------------------

    def kept(self, scan_id: str, form: Form) -> Kept | None:
        """The form of the live scan's current version, if it is kept encoded."""
        return self._encoded.get(scan_id, form)

    def keep(self, scan: Obj, form: Form, body: bytes) -> None:
        """Keep `body` as `form` of `scan`, when `scan` is the live copy's current version."""
        self._encoded.put(scan, form, body)

    def asked_before(self, body: bytes) -> search.Asked | None:
        """A find of these body bytes parsed before, if it was kept."""
        return self._finds.asked_before(body)

    def ask(self, body: bytes, doc: dict[str, Any], fields: Collection[str]) -> search.Asked:
        """The find of filter `doc` projected to `fields` (400 when invalid), kept by its body's bytes."""
        return self._finds.ask(body, doc, fields)

    async def find(self, asked: search.Asked, names: Names) -> list[bytes]:
        """The answer to a find over the live scans and the archive, in `names`: the parts of its body."""
        return await self._finds.answer(asked, names)

    async def table(self, ask: table.TableAsk) -> table.TablePage:
        """A page of the dashboard's table: scans newest first below `ask.before`, archived ones too
        when asked and kept."""
        return await table.page(self._cache, self._archive, self._namespace, ask)

    # --- reads -----------------------------------------------------------------------------------

    async def get(self, scan_id: str) -> Obj | None:
        """The scan, live or archived: the cache first (then, for a scan created a moment ago through
        another replica, the API server: `Freshness.missing`), then the archive."""
        if not is_object_name(scan_id):  # a NUL, a newline, a capital: no object has such a name
            return None
        scan = self._cache.get(scan_id) or await self._freshness.missing(scan_id)
        if scan is None and self._archive is not None:
            try:
                scan = await self._archive.get(self._namespace, scan_id)
            except ARCHIVE_ERRORS as e:  # an ApiError: a stream that follows the scan reads it too
                raise archive_unavailable(e) from None
        return scan

    async def rescan_ids(self, scan_id: str) -> list[str]:
        """Every scan whose rescanOf chain leads to `scan_id`, in either store, in id (= creation)
        order. Live descendants come transitively from the cache; the archive answers one generation
        per query, so each round follows the archived children found by the previous one."""
        found: set[str] = set()
        frontier = [scan_id]
        while frontier:
            live = {child for parent in frontier for child in self._cache.rescan_ids(parent)}
            gone: set[str] = set()
            if self._archive is not None:
                gone = set(await self._archive.rescans_of(self._namespace, [*frontier, *sorted(live)]))
            frontier = sorted(gone - found - live)
            found |= live | gone
        return sorted(found)

    async def event(self, scan: Obj) -> Any | None:
        """A scan's sensor event: from its ConfigMap, or from the archive (first, for an archived scan;
        else only when the ConfigMap is gone, as it is once every scan using it is archived)."""
        sensor_event_id = ScanRecord(scan).sensor_event_id
        if sensor_event_id in self._events:
            self._events.move_to_end(sensor_event_id)
            return self._events[sensor_event_id]
        payload = None
        if archived(scan):
            payload = await self._archived_event(sensor_event_id)
        if payload is None:
            payload = await payloads.read_event(self._api, self._namespace, sensor_event_id)
        if payload is None and not archived(scan):
            payload = await self._archived_event(sensor_event_id)
        if payload is not None:
            self._events[sensor_event_id] = payload
            while len(self._events) > EVENTS_KEPT:
                self._events.popitem(last=False)
        return payload

    async def _archived_event(self, sensor_event_id: str) -> Any | None:
        data = None if self._archive is None else await self._archive.event(sensor_event_id)
        return None if data is None else await unpacked(data)

    async def event_stored(self, sensor_event_id: str) -> bool:
        """Is this sensor event stored, in the cluster or in the archive?"""
        return await payloads.event_exists(self._api, self._namespace, sensor_event_id) or (
            self._archive is not None and await self._archive.event(sensor_event_id) is not None
        )

    async def result(self, scan: Obj) -> dict[str, Any]:
        """The REST result of a scan: its stored payload, or {} when there is none."""
        record = ScanRecord(scan)
        if not record.has_result:
            return {}
        payload = None
        if not archived(scan):
            payload = await payloads.read_result(self._api, self._namespace, record.name)
        if payload is None and self._archive is not None:  # archived, maybe since the scan was read
            data = await self._archive.result(self._namespace, record.name)
            payload = None if data is None else await unpacked(data)
        if payload is None:
            return {}
        return {"scan_id": record.name, "scan_result": payload, "is_final": record.has_final_result}

    async def scanner_log(self, scan: Obj) -> bytes | None:
        """The scanner's kept log (gzip of its text) in the cluster, else in the archive; None when none
        was kept (its scanner runs, or never ran)."""
        name = ScanRecord(scan).name
        data = None if archived(scan) else await payloads.stored_log(self._api, self._namespace, name)
        if data is None and self._archive is not None:  # archived, maybe since the scan was read
            data = await self._archive.scanner_log(self._namespace, name)
        return data

    async def startup(self, scan_id: str) -> bytes | None:
        """A live scan's startup.json as the scanner stored it (None until then)."""
        return await payloads.read_startup(self._api, self._namespace, scan_id)

    # --- writes ----------------------------------------------------------------------------------

    async def create(self, spec: Obj, event: bytes | None = None) -> Obj:
        """A new Scan and its sensor event: `event` stored anew beside it, else the stored one it names
        (from the archive if the cluster no longer has it), which the Scan joins the owners of.

        A new event is written at the same time as the Scan (a POST waits for one write, not two), so
        it cannot name the Scan's uid yet: it names the scan it was stored for, and the operator makes
        that Scan its owner when it first looks for the event. If either write fails, the other is
        undone. A crash in between leaves a Scan without its event, which the operator fails
        (`EventMissing`) after a grace period, or an event no Scan names, which its janitor deletes."""
        name = new_scan_id()
        if event is None:
            scan = await self._store.create(name, spec, now())
            try:
                await self._attach_event(scan, spec["sensorEventId"])
            except Exception:
                await self._undo(scan)
                raise
            return scan
        event_id = spec["sensorEventId"]
        made, stored = await asyncio.gather(
            self._store.create(name, spec, now()),
            payloads.create_event(self._api, self._namespace, event_id, event, stored_for=name),
            return_exceptions=True,
        )
        if isinstance(made, BaseException):
            if not isinstance(stored, BaseException):
                await self._undo(None, event_id)
            raise made
        if isinstance(stored, BaseException):
            await self._undo(made)
            raise stored
        return made

    async def _undo(self, scan: Obj | None, event_id: str | None = None) -> None:
        """Remove what a launch cut short wrote. Should a removal fail too, the operator fails the Scan
        and its janitor deletes the event, which no Scan names."""
        if scan is not None:
            with contextlib.suppress(Exception):
                await self._store.delete(ScanRecord(scan).name)
            self._cache.forget(scan)
        if event_id is not None:
            with contextlib.suppress(Exception):
                await payloads.delete_event(self._api, self._namespace, event_id)

    async def _attach_event(self, scan: Obj, sensor_event_id: str) -> None:
        """Make the new scan an owner of its event; if the event is gone from the cluster (an event whose
        every scan is archived lives only there), store it again from the archive."""
        try:
            await payloads.add_event_owner(self._api, self._namespace, sensor_event_id, scan)
            return
        except NotFound:
            pass
        data = None if self._archive is None else await self._archive.event(sensor_event_id)
        if data is None:
            raise bad_request("sensor event not found", "The sensor event was deleted meanwhile.")
        try:
            await payloads.create_event(self._api, self._namespace, sensor_event_id, data, owners=[scan])
        except Conflict:
            # Stored meanwhile by a concurrent rescan: join its owners.
            await payloads.add_event_owner(self._api, self._namespace, sensor_event_id, scan)

    async def write_result(self, scan: Obj, data: bytes) -> None:
        await payloads.write_result(self._api, self._namespace, scan, data)

    async def write_startup(self, scan: Obj, data: bytes) -> None:
        await payloads.write_startup(self._api, self._namespace, scan, data)

    async def mark(self, scan: Obj, spec: dict[str, Any]) -> Obj:
        """Merge `spec` into the scan and record the manifest change, live or archived. A live Scan
        archived meanwhile (404) is marked in the archive: the operator deletes a Scan only under a
        resourceVersion precondition, so a mark that reached the live Scan is in its archived copy.
        An archived copy is changed under a row lock, so concurrent marks never undo each other."""
        record = ScanRecord(scan)
        if record.archived_at is None:
            touched = model.ScanStatus(last_updated=now()).to_patch()
            try:
                return await self._store.merge(record.name, Change(spec=spec or None, status=touched))
            except ApiError as e:  # the store's REST 404: archived meanwhile
                if e.status != 404 or self._archive is None:
                    raise
        assert self._archive is not None  # an archived scan comes from the archive
        updated = await self._archive.update(
            self._namespace, record.name, lambda stored: marked(stored, spec, now())
        )
        if updated is None:
            raise not_found()
        return updated
