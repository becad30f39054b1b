"""Archiving: a finished scan, once its retention period has passed, moves to PostgreSQL and leaves the
cluster, so etcd and both processes hold the living only.

A move is idempotent and crash-safe by its order: read the Scan and its payloads (its scanner's kept
log among them); write them to the archive in one transaction (a newer copy replaces an older one);
post an `Archived` Event; delete the Scan only if it has not changed since it was read (uid and
resourceVersion preconditions). A crash before the commit leaves the scan live, due again after a
restart; a crash after it leaves both copies, and the next attempt stores the same (or a newer) copy
again and then deletes. The payload ConfigMaps go with the Scan through their ownerReferences (a
shared event stays until its last owner goes). Readers look in the cluster first and then in the
archive, so a scan is never missing.

Which scans are due is kept in `ArchiveQueue`: one (due time, key) entry per finished scan, fed by
watch events, so a tick pops the due ones and never looks at the others.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from skyscan import conditions as cond
from skyscan import logs, manifest, names
from skyscan.io import kube, payloads
from skyscan.io.kube_errors import Conflict, NotFound
from skyscan.scan_record import ScanRecord, compact
from skyscan_operator.endings import GITOPS_LABEL_PREFIXES
from skyscan_operator.kube_events import event_body, send_event
from skyscan_operator.settings import OperatorSettings

if TYPE_CHECKING:  # imported when first connected: asyncpg costs ~3 MiB of RSS, for nothing unarchived
    from skyscan.io.archive import Archive

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, scan id)
RETRY_SECONDS = 60.0  # after a move failed (archive or API server away)
WITHOUT_EVENT = ("EventMissing", "InvalidSpec")  # Failed reasons of scans archived without their event


def finished_at(record: ScanRecord) -> float:
    """When a terminal scan last changed: its latest condition transition, status write, or creation."""
    times = [cond.epoch(c.get("lastTransitionTime")) or 0.0 for c in record.conditions]
    return max([record.created_at, record.last_updated, *times])


def git_managed(obj: dict[str, Any]) -> bool:
    """Applied from Git by Argo CD or Flux (their tracking labels or annotations): such a Scan stays, as
    deleting it would only make them apply it again, and so run the scan again."""
    meta = obj["metadata"]
    keys = [*(meta.get("labels") or {}), *(meta.get("annotations") or {})]
    return any(k.startswith(GITOPS_LABEL_PREFIXES) for k in keys)


class ArchiveQueue:
    """Due times of finished scans; a rescheduled or forgotten key leaves a stale heap entry behind,
    skipped when popped."""

    def __init__(self) -> None:
        self._due: dict[Key, float] = {}
        self._heap: list[tuple[float, Key]] = []

    def __len__(self) -> int:
        return len(self._due)

    def schedule(self, key: Key, due: float) -> None:
        if self._due.get(key) != due:
            self._due[key] = due
            heapq.heappush(self._heap, (due, key))

    def forget(self, key: Key) -> None:
        self._due.pop(key, None)

    def pop_due(self, now: float, limit: int) -> list[Key]:
        due: list[Key] = []
        while self._heap and self._heap[0][0] <= now and len(due) < limit:
            at, key = heapq.heappop(self._heap)
            if self._due.get(key) == at:
                del self._due[key]
                due.append(key)
        return due


class Archiver:
    def __init__(self, api: kube.Kube, settings: OperatorSettings, clock: Callable[[], float]) -> None:
        assert settings.archive_dsn is not None
        self._api, self._settings, self._clock = api, settings, clock
        self._archive: Archive | None = None
        self.queue = ArchiveQueue()
        self.moved = 0
        self.failed = 0  # moves that failed, each retried (read by /metrics)

    def observe(self, key: Key, body: dict[str, Any]) -> None:
        """Fed every Scan version: a finished scan is due its retention period after it finished."""
        record = ScanRecord(body)
        if record.is_terminal and not git_managed(body):
            self.queue.schedule(key, finished_at(record) + self._settings.archive_retention_seconds)
        else:
            self.queue.forget(key)

    def forget(self, key: Key) -> None:
        self.queue.forget(key)

    async def close(self) -> None:
        if self._archive is not None:
            await self._archive.close()

    async def tick(self) -> None:
        """Move the scans now due, at most `archive_batch` of them."""
        now = self._clock()
        for key in self.queue.pop_due(now, self._settings.archive_batch):
            try:
                await self.move(key)
            except Exception as e:  # the archive or the API server away: the scan stays live, retried
                log.warning(
                    "archiving %s/%s failed (%r); retrying in %gs",
                    *key,
                    e,
                    RETRY_SECONDS,
                    extra=logs.about(key[1]),
                )
                self.queue.schedule(key, now + RETRY_SECONDS)
                self.failed += 1

    async def _connected(self) -> Archive:
        from skyscan.io.archive import Archive

        if self._archive is None:
            assert self._settings.archive_dsn is not None
            self._archive = await Archive.connect(self._settings.archive_dsn)
        return self._archive

    async def move(self, key: Key) -> None:
        namespace, name = key
        try:
            obj: dict[str, Any] = await self._api.request("GET", kube.scan_path(namespace, name))
        except NotFound:
            return
        record = ScanRecord(obj)
        if not record.is_terminal or git_managed(obj):
            return  # a watch event schedules it again once it ends
        due = finished_at(record) + self._settings.archive_retention_seconds
        if due > self._clock():
            self.queue.schedule(key, due)
            return
        event_id = str(record.spec.get("sensorEventId") or "")
        event = await payloads.stored(self._api, namespace, names.event_object_name(event_id))
        archive = await self._connected()
        if event is None:
            event = await archive.event(event_id)
        # A scan failed because its event was never stored, or refused before it looked for one (a Scan
        # made with kubectl, InvalidSpec), goes without it; any other scan whose event is gone stays
        # live, visibly (its event may yet be restored).
        failed = record.condition_true(cond.FAILED)
        never_stored = failed and cond.reason(record.conditions, cond.FAILED) in WITHOUT_EVENT
        if event is None and not never_stored:
            await self._post(obj, "Warning", "ArchiveSkipped", f"sensor event {event_id!r} is missing")
            return
        try:
            view = manifest.of(obj)
        except ValidationError:  # a spec the model cannot read (InvalidSpec): it stays live, visibly
            await self._post(
                obj, "Warning", "ArchiveSkipped", "its spec cannot be read (see its Failed condition)"
            )
            return
        result = (
            await payloads.stored(self._api, namespace, names.result_object_name(name))
            if record.has_result
            else None
        )
        scanner_log = await payloads.stored_log(self._api, namespace, name)
        now = self._clock()
        from skyscan.io.archive import ArchivedScan

        await archive.put(ArchivedScan(compact(obj), view, event, result, now, scanner_log))
        await self._post(
            obj, "Normal", "Archived", "moved to the archive; REST reads and finds still serve it"
        )
        unchanged = {k: obj["metadata"][k] for k in ("uid", "resourceVersion")}
        try:
            await self._api.request(
                "DELETE", kube.scan_path(namespace, name),
                body={"preconditions": unchanged, "propagationPolicy": "Background"},
            )  # fmt: skip
        except NotFound:
            return
        except Conflict:
            self.queue.schedule(key, now)  # changed since it was read: store the newer copy, then delete
            return
        self.moved += 1
        log.info("archived %s/%s", namespace, name, extra=logs.about(name))

    async def _post(self, scan: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Posted before the Scan goes (an Event about a deleted object is still listed), awaited so it
        exists when the move is done; a failure only logs."""
        await send_event(self._api, event_body(scan, type_, reason, message, self._clock()))
