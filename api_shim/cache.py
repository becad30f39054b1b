"""A watch-backed, in-memory copy of the Scans in one namespace.

One LIST, then a WATCH from its resourceVersion (with bookmarks, so a reconnect resumes close to
where it stopped); `410 Gone` means the history is compacted, so the cache relists. While the API
server is unreachable the cache keeps serving what it has and retries with a backoff.
Writers call `observe(obj)` with the object a write returned, so a read that follows a write by
the same client sees it without waiting for the watch event. Reads never call the API server.
`/scans/find` matches over each Scan's manifest, built once per version of the Scan (on the first find
after it changed) and kept with it, so a find never rebuilds the manifests of unchanged Scans.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from skyscan import kube, manifest, model
from skyscan.status import ScanRecord, resource_version

log = logging.getLogger(__name__)

Obj = dict[str, Any]
SCAN = kube.SCAN_RESOURCE


class Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class ScanCache:
    def __init__(self, api: client.ApiClient, namespace: str, watch_timeout: int = 300) -> None:
        self._objs = client.CustomObjectsApi(api)
        self._namespace = namespace
        self._watch_timeout = watch_timeout
        self._scans: dict[str, Obj] = {}
        self._rescans: dict[str, set[str]] = {}  # spec.rescanOf -> the scans rescanning it
        self._deleted: dict[str, int] = {}  # name -> resourceVersion of its deletion (late writes lose)
        self._backlog: set[str] = set()  # scans with status.backlog (waiting for admission)
        self._documents: dict[str, tuple[Obj, Obj]] = {}  # name -> (that version of the Scan, its manifest)
        self._changed = asyncio.Event()
        self.synced = asyncio.Event()
        self.resource_version = ""
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------ reading
    def get(self, name: str) -> Obj | None:
        return self._scans.get(name)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._scans.values()))

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

    def find_documents(self) -> Iterator[Obj]:
        """The manifest of every cached Scan, as `/scans/find` matches them: each built once per version
        of its Scan and shared by every find until the Scan changes (never modify one). A snapshot:
        Scans changing while it is read are seen as they were when it began."""
        documents = self._documents
        for obj in list(self._scans.values()):
            name = obj["metadata"]["name"]
            held = documents.get(name)
            if held is not None and held[0] is obj:
                yield held[1]
                continue
            document = manifest.of(obj)
            if self._scans.get(name) is obj:
                documents[name] = (obj, document)
            yield document

    def backlog(self) -> list[Obj]:
        return [self._scans[name] for name in self._backlog]

    async def wait_for(self, name: str, probe: Callable[[Obj | None], bool], timeout: float) -> Obj | None:
        """Wait until `probe(current object)` holds; return the object, or None on timeout."""
        deadline = time.monotonic() + timeout
        while not probe(self._scans.get(name)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self._scans.get(name)

    # ------------------------------------------------------------------------------ writing
    def observe(self, obj: Obj) -> None:
        """Take a newer version of one Scan (from a write or a watch event)."""
        name = obj["metadata"]["name"]
        old = self._scans.get(name)
        if old is not None and resource_version(old) > resource_version(obj):
            return
        if resource_version(obj) <= self._deleted.get(name, -1):
            return
        self._unindex(old)
        self._scans[name] = obj
        record = ScanRecord(obj)
        if record.rescan_of:
            self._rescans.setdefault(record.rescan_of, set()).add(name)
        if record.in_backlog:
            self._backlog.add(name)
        self._notify()

    def forget(self, obj: Obj) -> None:
        self._deleted[obj["metadata"]["name"]] = resource_version(obj)
        self._unindex(self._scans.pop(obj["metadata"]["name"], None))
        self._notify()

    def _unindex(self, obj: Obj | None) -> None:
        if obj is None:
            return
        name = obj["metadata"]["name"]
        self._backlog.discard(name)
        self._documents.pop(name, None)
        parent = ScanRecord(obj).rescan_of
        if parent:
            self._rescans.get(parent, set()).discard(name)

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
        listed = await self._objs.list_namespaced_custom_object(**SCAN, namespace=self._namespace)
        self._scans = {}
        self._rescans = {}
        self._deleted = {}
        self._backlog = set()
        self._documents = {}
        for obj in listed["items"]:
            obj.setdefault("apiVersion", model.API_VERSION)
            obj.setdefault("kind", model.KIND)
            self.observe(obj)
        self.resource_version = listed["metadata"]["resourceVersion"]
        self.synced.set()
        self._notify()

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
            except Exception as e:  # API server away: keep serving, retry
                log.warning("scan watch interrupted (%r); retrying in %.1fs", e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _watch(self) -> None:
        response = await self._objs.list_namespaced_custom_object(
            **SCAN,
            namespace=self._namespace,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout,
            _preload_content=False,
            _request_timeout=self._watch_timeout + 30,
        )
        buffer = b""
        try:
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._apply(json.loads(line))
        finally:
            response.release()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if kind is None or not isinstance(obj, dict):  # a bare Status: the API server is restarting
            raise ApiException(status=event.get("code"), reason=event.get("message") or "not a watch event")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message"))
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        self.resource_version = obj["metadata"]["resourceVersion"]
        if kind == "DELETED":
            self.forget(obj)
        elif kind in ("ADDED", "MODIFIED"):
            self.observe(obj)
