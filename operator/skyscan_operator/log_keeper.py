"""Scanner logs that outlive their Pods: when a scanner container ends (its final result, a failure,
the kernel's OOM killer, an eviction, a deletion), its log is read through the API server and kept
beside its Scan, a payload like the result (`payloads.create_log`: ConfigMap `skyscan-log-<scan>`,
gzip, owned by the Scan), so it stays after the Job's TTL removes the Pod and moves into the archive
with the scan. What is kept is the head and tail (`skyscan.scanner_log`).

Fed every scanner Pod watch event (`observe`); `ended` (pure) tells a Pod whose scanner container
has ended. A Pod's log is kept once: the object is created, never replaced, so a second writer (this
operator started again, which sees every ended Pod again when it lists them) finds it there and stops;
one that died before creating it left nothing, and the next one's list brings the Pod back. A scanner
Job runs one Pod (`backoffLimit: 0`, `restartPolicy: Never`), so one log per scan.

A log the kubelet no longer has (the Pod gone before the log was read: deleted outright, or the
operator away for longer than the Job's TTL) is lost, with a Warning Event `ScannerLogLost` on the Scan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skyscan import logs, names, scanner_log
from skyscan.io import kube, payloads
from skyscan.io.kube_errors import KubeError, NotFound, is_outage
from skyscan_operator.kube_events import EventPoster
from skyscan_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
WORKERS = 2  # logs read at once
TRIES = 3  # reads of one log (an outage, a read cut short) before it is given up
RETRY_SECONDS = 5.0

PodKey = tuple[str, str]  # (namespace, Pod name)


@dataclass(frozen=True)
class Ended:
    """A scanner container that has ended, as its Pod shows it."""

    namespace: str
    scan_id: str
    pod: str
    container: str
    terminated: Mapping[str, Any]  # the container's `state.terminated`


def ended(pod: Mapping[str, Any]) -> Ended | None:
    """The Pod's scanner container if it has ended (pure)."""
    meta = pod["metadata"]
    scan_id = (meta.get("labels") or {}).get(names.SCAN_ID_LABEL)
    if not scan_id:
        return None
    container = names.container_name(scan_id)
    for status in (pod.get("status") or {}).get("containerStatuses") or []:  # raw: Pod
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == container and terminated:
            return Ended(meta["namespace"], scan_id, meta["name"], container, dict(terminated))
    return None


class LogKeeper:
    def __init__(
        self,
        api: kube.Kube,
        settings: OperatorSettings,
        events: EventPoster | None,
        clock: Callable[[], float],
    ) -> None:
        self._api, self._settings, self._events, self._clock = api, settings, events, clock
        self._queue: asyncio.Queue[PodKey] = asyncio.Queue()
        self._pending: dict[PodKey, tuple[Ended, bool]] = {}  # and whether the Pod is gone already
        self._done: set[PodKey] = set()  # kept (or given up) while the Pod exists
        self._tasks: list[asyncio.Task[None]] = []
        self.kept = 0

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"log-keeper-{i}") for i in range(WORKERS)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def observe(self, pod: dict[str, Any], *, deleted: bool) -> None:
        """A scanner Pod's watch event. A Pod deleted before its ended container was seen is still tried
        (its log is most likely gone: then its Scan says so), and forgotten afterwards."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        seen = key in self._done or key in self._pending
        if deleted:
            self._done.discard(key)  # a Pod of the same name later is another one
            if key in self._pending:  # forgotten once it is kept
                self._pending[key] = (self._pending[key][0], True)
        if seen:
            return
        if found := ended(pod):
            self._pending[key] = (found, deleted)
            self._queue.put_nowait(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            found, gone = self._pending[key]
            try:
                await self._keep_with_retries(found)
            except asyncio.CancelledError:
                raise
            except Exception:  # never the worker's end
                log.exception("keeping the log of %s failed", found.pod, extra=logs.about(found.scan_id))
            finally:
                del self._pending[key]
                if not gone:
                    self._done.add(key)

    async def _keep_with_retries(self, found: Ended) -> None:
        for attempt in range(1, TRIES + 1):
            try:
                await self.keep(found)
                return
            except asyncio.CancelledError:
                raise
            except NotFound:
                return await self._lost(found, "its Pod or container was gone before its log was read")
            except Exception as e:
                if attempt == TRIES or not (is_outage(e) or isinstance(e, (TimeoutError, OSError))):
                    return await self._lost(found, f"reading it failed: {e}")
                log.warning(
                    "keeping the log of %s failed (%r); trying again",
                    found.pod,
                    e,
                    extra=logs.about(found.scan_id),
                )
                await asyncio.sleep(RETRY_SECONDS)

    async def keep(self, found: Ended) -> bool:
        """Keep `found`'s log unless it is kept already; False then (or when its Scan is gone)."""
        ns, scan_id = found.namespace, found.scan_id
        if await payloads.log_metadata(self._api, ns, scan_id) is not None:
            return False
        try:
            scan = await self._api.request("GET", kube.scan_path(ns, scan_id))
        except NotFound:
            return False  # its Scan is gone, and everything it owned with it
        s = self._settings
        kept = scanner_log.HeadTail(s.scanner_log_end_bytes, s.scanner_log_end_bytes)
        path = kube.core_path("pods", ns, found.pod, "log")
        async with asyncio.timeout(s.scanner_log_read_seconds):
            async for chunk in self._api.chunks(path, {"container": found.container}, answer=30, idle=30):
                kept.feed(chunk)
        data, kept = await asyncio.to_thread(
            scanner_log.compressed, kept, scanner_log.ending(found.terminated), payloads.MAX_COMPRESSED_BYTES
        )
        annotations = {
            payloads.LOG_POD_ANNOTATION: found.pod,
            payloads.LOG_BYTES_ANNOTATION: str(kept.total),
            payloads.LOG_CUT_ANNOTATION: str(kept.cut),
        }
        created = await payloads.create_log(self._api, ns, scan, data, annotations)
        if created:
            self.kept += 1
            log.info(
                "kept the log of %s (%d bytes, %d cut)",
                found.pod,
                kept.total,
                kept.cut,
                extra=logs.about(scan_id),
            )
        return created

    async def _lost(self, found: Ended, why: str) -> None:
        log.warning("the log of %s is lost: %s", found.pod, why, extra=logs.about(found.scan_id))
        if self._events is None:
            return
        try:
            scan = await self._api.request("GET", kube.scan_path(found.namespace, found.scan_id))
        except KubeError:
            return
        self._events.post(
            scan, "Warning", "ScannerLogLost", f"the log of {found.pod} is lost: {why}"[:500], self._clock()
        )
