"""A watch-backed, in-memory copy of the Scans in one namespace.

A LIST (from the API server's watch cache; in pages when it pages), then a WATCH from its
resourceVersion (with bookmarks, so a reconnect resumes close to where it stopped); `410 Gone` (of the
watch, or of a page's continue token) means the history is compacted, so the cache lists again. Each
Scan is merged in as it is decoded, so during a relist readers still see every Scan; `synced` is set
once the last page is in. While the API server is unreachable the cache keeps what it has, retries with
a backoff (listing again once it answers) and says for how long it has been broken (`broken_for`): the
shim stops vouching for it after a bound. Broken is not quiet: a watch of Scans nobody changes brings
nothing, bookmarks included (kube-apiserver 1.33 sends one only when the Scans' resourceVersion moved),
so a stream quiet for WATCH_IDLE_SECONDS is watched anew, and only a list or watch that fails, or that
the API server does not answer within ANSWER_SECONDS (a hung server, a lost network), breaks the cache.
Writers call `observe(obj)` with the object a write returned, so a read that follows a write by
the same client sees it without waiting for the watch event. Reads never call the API server.

A Scan is held in its compact form (`skyscan.scan_record.compact`: no managedFields), packed
(`skyscan.packing`: ~150 bytes for a waiting Scan, against ~5.5 KiB as decoded dicts), and unpacked
on each read, a fresh object: the shim holds 10,000 live Scans in well under 150 MiB. `/scans/find`
matches over each Scan's manifest, built once per version of the Scan (on the first find after it
changed) and kept with it, its values pickled (the keys are the manifest's fields, in order: a quarter
less), so a find never rebuilds the manifests of unchanged Scans (unpickling one costs a fifth of
building it; finds read manifests in bulk, so they are not deflated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple

from api_shim.find.index import FindIndex
from api_shim.repository import listing
from skyscan import manifest
from skyscan.io import kube
from skyscan.io.kube_errors import Gone, KubeError
from skyscan.packing import Packer
from skyscan.scan_record import ScanRecord, compact, resource_version

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# The listing's resourceVersion: "0" is any version, answered from the API server's watch cache (whole,
# whatever the limit); "" is the latest, read from etcd in pages of PAGE_SIZE.
LIST_RESOURCE_VERSION = "0"
PAGE_SIZE = 500
MERGE_SLICE = 50  # Scans merged from a page between two turns of the event loop
# A quiet watch is normal, but a connection that died silently looks the same: after this long without
# a byte, watch anew, and a server that does not answer that is found out.
WATCH_IDLE_SECONDS = 30.0
ANSWER_SECONDS = 30.0  # to answer a watch (its headers), or to bring a listing's next bytes


class Held(NamedTuple):
    """One version of a cached Scan."""

    version: int  # its resourceVersion
    packed: bytes  # its compact form
    rescan_of: str | None  # its spec.rescanOf, to unindex it without unpacking
    replaced_by: str | None  # its spec.replacedBy, for the redirect check of a read without unpacking


class ScanCache:
    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        watch_timeout: int = 300,
        *,
        idle: float = WATCH_IDLE_SECONDS,
        answer: float = ANSWER_SECONDS,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._watch_timeout = watch_timeout
        self._idle, self._answer = idle, answer
        self._scans: dict[str, Held] = {}
        # The same dict, read-only: a read's redirect check is one lookup (held, and replaced or not).
        self.held: Mapping[str, Held] = self._scans
        self._packer = Packer()
        self._rescans: dict[str, set[str]] = {}  # spec.rescanOf -> the scans rescanning it
        self._deleted: dict[str, int] = {}  # name -> resourceVersion of its deletion (late writes lose)
        self._backlog: set[str] = set()  # scans with status.backlog (waiting for admission)
        self._documents: dict[
            str, tuple[Held, bytes]
        ] = {}  # name -> (a version of a Scan, its manifest's values)
        self._followers: dict[str, set[Callable[[], None]]] = {}  # name -> called when that Scan changes
        self._newcomers: set[Callable[[], None]] = set()  # called when a Scan not held before is taken
        self.find_index = FindIndex()  # run/event ids and classifiers -> scans, for selective finds
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0  # listings after the first, and when the watch last spoke: for /metrics
        self.last_event = time.monotonic()
        self._broken_since: float | None = None  # when the list or watch first failed, until a list works
        self._task: asyncio.Task[None] | None = None

    def broken_for(self) -> float:
        """Seconds since the watch of the API server broke (0: it works). A quiet but connected watch
        is not broken: only a list or watch that failed or went unanswered counts (the API server
        refused, reset, timed out or sent an error), and the next successful list ends it."""
        return 0.0 if self._broken_since is None else time.monotonic() - self._broken_since

    # ------------------------------------------------------------------------------ reading
    def get(self, name: str) -> Obj | None:
        held = self._scans.get(name)
        return None if held is None else self._unpack(held)

    def __iter__(self) -> Iterator[Obj]:
        return map(self._unpack, list(self._scans.values()))

    def version(self, name: str) -> int | None:
        """The resourceVersion of the Scan held as `name`, without unpacking it (None: none is held)."""
        held = self._scans.get(name)
        return None if held is None else held.version

    def replaced_by(self, name: str) -> str | None:
        """The scan that replaced the held Scan `name`, without unpacking it (None: none, or not held)."""
        held = self._scans.get(name)
        return None if held is None else held.replaced_by

    def __contains__(self, name: object) -> bool:
        return name in self._scans

    def __len__(self) -> int:
        return len(self._scans)

    def rescan_ids(self, name: str) -> list[str]:
        """Every scan whose rescanOf chain leads to `name`, in id (= creation) order."""
        found: set[str] = set()
        todo = [name]
        while todo:
            for child in self._rescans.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return sorted(found)

    def find_documents(self, names: Collection[str] | None = None) -> Iterator[tuple[int, Obj]]:
        """(version, manifest) of every cached Scan (or of those of `names` cached), as `/scans/find`
        matches them: each built once per version of its Scan and kept until the Scan changes. A
        snapshot: Scans changing while it is read are seen as they were when it began."""
        documents = self._documents
        scans = self._scans
        helds = list(scans.items()) if names is None else [(n, scans[n]) for n in names if n in scans]
        for name, held in helds:
            kept = documents.get(name)
            if kept is not None and kept[0] is held:
                yield held.version, dict(zip(manifest.MANIFEST_FIELDS, pickle.loads(kept[1]), strict=True))
                continue
            document = manifest.of(self._unpack(held))
            if scans.get(name) is held:  # its values only: the keys are MANIFEST_FIELDS, in order
                documents[name] = (held, pickle.dumps(tuple(document.values()), pickle.HIGHEST_PROTOCOL))
            yield held.version, document

    def backlog(self) -> list[Obj]:
        return [self._unpack(self._scans[name]) for name in self._backlog]

    def _unpack(self, held: Held) -> Obj:
        scan: Obj = self._packer.unpack(held.packed)
        return scan

    async def wait_for(self, name: str, probe: Callable[[Obj | None], bool], timeout: float) -> Obj | None:
        """Wait until `probe(current object)` holds; return the object, or None on timeout."""
        deadline = time.monotonic() + timeout
        while not probe(scan := self.get(name)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return scan

    # ------------------------------------------------------------------------------ following
    def follow(self, name: str, wake: Callable[[], None]) -> None:
        """Call `wake()` each time Scan `name` is taken in anew or dropped, until `unfollow`. A lookup
        per event: Scans nobody follows cost nothing more."""
        self._followers.setdefault(name, set()).add(wake)

    def unfollow(self, name: str, wake: Callable[[], None]) -> None:
        followers = self._followers.get(name, set())
        followers.discard(wake)
        if not followers:
            self._followers.pop(name, None)

    def _wake(self, name: str) -> None:
        for wake in tuple(self._followers.get(name, ())):
            wake()

    def follow_new(self, wake: Callable[[], None]) -> None:
        """Call `wake()` each time a Scan the cache did not hold is taken in, until `unfollow_new`."""
        self._newcomers.add(wake)

    def unfollow_new(self, wake: Callable[[], None]) -> None:
        self._newcomers.discard(wake)

    # ------------------------------------------------------------------------------ writing
    def observe(self, obj: Obj) -> None:
        """Take a newer version of one Scan (from a write or a watch event)."""
        if self._take(obj):
            self._notify()

    def forget(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        self._deleted[name] = resource_version(obj)
        self._unindex(name, self._scans.pop(name, None))
        self._wake(name)
        self._notify()

    def _take(self, obj: Obj) -> bool:
        """Hold `obj` (compacted) unless a newer version is held or its deletion was seen."""
        name = obj["metadata"]["name"]
        version = resource_version(obj)
        old = self._scans.get(name)
        if old is not None and old.version > version:
            return False
        if version <= self._deleted.get(name, -1):
            return False
        scan = compact(obj)
        record = ScanRecord(scan)
        self._unindex(name, old, replaced=True)
        self._scans[name] = Held(version, self._packer.pack(scan), record.rescan_of, record.replaced_by)
        self.find_index.put(name, scan)
        if record.rescan_of:
            self._rescans.setdefault(record.rescan_of, set()).add(name)
        if record.in_backlog:
            self._backlog.add(name)
        self._wake(name)
        if old is None:
            for wake in tuple(self._newcomers):
                wake()
        return True

    def _unindex(self, name: str, held: Held | None, *, replaced: bool = False) -> None:
        if held is None:
            return
        self._backlog.discard(name)
        self._documents.pop(name, None)
        if not replaced:  # `FindIndex.put` replaces a version in place (the scan keeps its place in order)
            self.find_index.discard(name)
        if held.rescan_of:
            self._rescans.get(held.rescan_of, set()).discard(name)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------------------ syncing
    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scan-cache")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _relist(self) -> None:
        """List every Scan, merging each in as it is decoded (a version older than the one held loses),
        then drop the Scans the listing no longer has. The listing asks for `resourceVersion=0`: the API
        server answers from its watch cache, at a third of the cost of reading etcd (whole, whatever the
        `limit`: `listing.items` decodes it a Scan at a time); pages are followed when it does page."""
        listed: set[str] = set()
        token: str | None = None
        while True:
            rest: Obj = {}
            for i, obj in enumerate(listing.items(await self._page(token), rest), start=1):
                listed.add(obj["metadata"]["name"])
                self._take(obj)
                if i % MERGE_SLICE == 0:
                    await asyncio.sleep(0)
            self._notify()
            token = rest["metadata"].get("continue")
            if not token:
                break
        version = resource_version(rest)  # every page is of the first page's snapshot
        for name, held in list(self._scans.items()):
            if name not in listed and held.version <= version:  # deleted while nobody watched
                self._unindex(name, self._scans.pop(name))
                self._wake(name)
        self._deleted = {name: v for name, v in self._deleted.items() if v > version}
        self.resource_version = rest["metadata"]["resourceVersion"]
        self.last_event = time.monotonic()
        self._broken_since = None
        self.synced.set()
        self._notify()

    async def _page(self, token: str | None) -> str:
        """One page of the listing, as text."""
        params: dict[str, Any] = {"limit": PAGE_SIZE, "continue": token}
        if LIST_RESOURCE_VERSION and not token:
            params["resourceVersion"] = LIST_RESOURCE_VERSION
        path = kube.scan_path(self._namespace)  # Gone: the continue token expired, list from the start
        body = await self._api.read("GET", path, params=params, idle=self._answer)
        return body.decode()

    async def _run(self) -> None:
        backoff = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                await self._watch()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Gone:
                need_list = True
                self.relists += 1
            except kube.WatchIdle:  # quiet, or silently cut off: a new watch tells which
                log.debug("scan watch idle for %.0fs; watching again", self._idle)
            except Exception as e:  # API server away: keep serving for a while (`broken_for`), retry
                log.warning("scan watch interrupted (%r); retrying in %.1fs", e, backoff)
                if self._broken_since is None:
                    self._broken_since = time.monotonic()
                need_list = True  # a list that works is what proves the API server back
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _watch(self) -> None:
        params: kube.Params = {
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self._watch_timeout,
        }
        path = kube.scan_path(self._namespace)
        async for event in self._api.watch(path, params, answer=self._answer, idle=self._idle):
            self._apply(event)

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if kind is None or not isinstance(obj, dict):  # a bare Status: the API server is restarting
            raise KubeError(int(event.get("code") or 0), str(event.get("message") or "not a watch event"))
        if kind == "ERROR":  # 410 is a Gone: the watch's history was compacted, relist
            raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
        self.resource_version = obj["metadata"]["resourceVersion"]
        self.last_event = time.monotonic()  # bookmarks too: the watch is alive
        if kind == "DELETED":
            self.forget(obj)
        elif kind in ("ADDED", "MODIFIED"):
            self.observe(obj)
        if kind != "DELETED":  # a bookmark, or a version already held from a write: the watch moved on
            self._notify()  # for readers waiting for a version (`freshness`)
