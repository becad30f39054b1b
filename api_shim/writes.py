"""What the REST actions write, step by step: a scan with its sensor event, a rescan, a soft delete,
worker requests, manifest updates, results and the workflow id.

Each sequence is ordered so that a failure leaves nothing behind that nothing refers to: a scan whose
event could not be stored is removed (a new event is created already owned by its scan), a scan whose
event vanished is undone, and a rescan marks its original only once the new scan exists. Refusals
raise `ApiError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

from api_shim import models, view
from api_shim.errors import ApiError, bad_request, not_found
from api_shim.freshness import wrote
from api_shim.launch import Launch
from api_shim.sharing import SharedRuns
from api_shim.store import Change, Obj, ScanStore, now
from skyscan import kube, manifest, model, payloads
from skyscan.archive import Archive
from skyscan.state import NOT_YET_REQUESTED
from skyscan.status import ScanRecord


def make_scan_id() -> str:
    return model.new_scan_id(time.time(), uuid.uuid4().hex)


async def encoded(payload: Any, what: str) -> bytes:
    try:
        return await payloads.encode_async(payload, what)
    except payloads.PayloadTooLarge as e:
        raise ApiError(413, f"{what} too large", str(e)) from None


def _touched() -> dict[str, Any]:
    """The status patch that marks a manifest change."""
    return model.ScanStatus(last_updated=now()).to_patch()


def marked(scan: Obj, spec: dict[str, Any], at: float) -> Obj:
    """An archived scan with `spec` merged in and its manifest change recorded (pure)."""
    status = {**(scan.get("status") or {}), **model.ScanStatus(last_updated=at).to_patch()}
    return {**scan, "spec": {**scan["spec"], **spec}, "status": status}


def _completed() -> ApiError:
    return bad_request("Attempted to delete a completed scan (must use `delete_completed_scan=True`)")


def _deletion(scan: Obj) -> Change:
    """The soft delete of a scan that has no final result (`ScanStore.update` decides on each version)."""
    if view.has_final_result(scan):
        raise _completed()
    return Change() if view.is_deleted(scan) else Change(spec={"deleted": True})


class ScanWrites:
    """The shim's write sequences, over the Scan store and the payload objects."""

    def __init__(
        self,
        api: kube.Kube,
        store: ScanStore,
        add_workers_timeout: float,
        archive: Archive | None = None,
    ) -> None:
        self.api = api
        self.store = store
        self.archive = archive
        self.cache = store.cache
        self.namespace = store.namespace
        self._add_workers_timeout = add_workers_timeout
        self._deletions: SharedRuns[str, Obj] = SharedRuns()  # guarded soft deletes under way, by name

    async def launch(self, launch: Launch) -> Obj:
        """Two sequential writes: the Scan, then its sensor event already owned by it (a new event is
        created with the Scan as its owner; a reused one gets the Scan as one more owner by a patch).
        A failure in between removes the Scan; a crash in between leaves a Scan without its event, which
        the operator does not start and fails (`EventMissing`) after a grace period. So no event is
        ever stored without an owner, and an answered POST is a complete scan."""
        data = None
        if launch.event is not None:
            data = await encoded(launch.event, "sensor event")  # a 413 before anything is written
            sensor_event_id = uuid.uuid4().hex
        else:
            sensor_event_id = launch.sensor_event_id or ""
            if not await payloads.event_exists(self.api, self.namespace, sensor_event_id) and (
                self.archive is None or await self.archive.event(sensor_event_id) is None
            ):  # an archived event is stored again for this scan by `_attach_event`
                raise bad_request(
                    "sensor event not found", f"No stored sensor event has id {sensor_event_id!r}."
                )
        spec = {**launch.spec.to_kube(), "sensorEventId": sensor_event_id}
        scan = await self.store.create(make_scan_id(), spec, now())
        if data is None:
            await self._attach_event(scan)
            return scan
        try:
            await payloads.create_event(self.api, self.namespace, sensor_event_id, data, owners=[scan])
        except Exception:
            with contextlib.suppress(Exception):  # should this fail too, the operator fails the scan
                await self.store.delete(view.scan_id(scan))
            self.cache.forget(scan)
            raise
        return scan

    async def rescan(self, original: Obj, *, abort_first: bool, replace_scan: bool) -> Obj:
        """A new scan from the original's request; then, if asked, abort and/or replace the original."""
        origin_id = view.scan_id(original)
        new = await self.store.create(make_scan_id(), model.rescan_spec(original["spec"], origin_id), now())
        await self._attach_event(new)
        if abort_first or replace_scan:
            # After the new scan exists, so a failure never leaves the original aborted with no rescan.
            marks: dict[str, Any] = {}
            if abort_first:
                marks["deleted"] = True
            if replace_scan:
                marks["replacedBy"] = view.scan_id(new)
            await self._mark(original, marks)
        return new

    async def _attach_event(self, scan: Obj) -> None:
        """Make the new scan an owner of its event; if the event is gone from the cluster, store it again
        from the archive (an event whose every scan is archived lives only there); failing that, undo
        the scan."""
        try:
            await payloads.add_event_owner(self.api, self.namespace, scan["spec"]["sensorEventId"], scan)
            return
        except kube.ApiError as e:
            if e.status != 404:
                raise
        try:
            if not await self._restore_event(scan):
                raise bad_request("sensor event not found", "The sensor event was deleted meanwhile.")
        except Exception:
            with contextlib.suppress(Exception):  # should this fail too, the operator fails the scan
                await self.store.delete(view.scan_id(scan))
            self.cache.forget(scan)
            raise

    async def _restore_event(self, scan: Obj) -> bool:
        """Store the archived event again, owned by `scan`; False when the archive does not have it."""
        sensor_event_id = scan["spec"]["sensorEventId"]
        data = None if self.archive is None else await self.archive.event(sensor_event_id)
        if data is None:
            return False
        try:
            await payloads.create_event(self.api, self.namespace, sensor_event_id, data, owners=[scan])
        except kube.ApiError as e:
            if e.status != 409:
                raise
            # Stored meanwhile by a concurrent rescan: join its owners.
            await payloads.add_event_owner(self.api, self.namespace, sensor_event_id, scan)
        return True

    async def delete(self, scan: Obj, *, delete_completed_scan: bool) -> Obj:
        """Mark the scan deleted (the operator aborts a live one); a completed scan only when told to.

        Unless told to delete a completed scan, the check and the flag go together, guarded by
        resourceVersion: a final result stored meanwhile (through any shim replica) is never deleted
        over; concurrent ones of one scan through this replica share one. The flag alone (when told),
        and lastUpdated, are set with no precondition (no one else writes them, and their values do not
        depend on the stored ones), so those never conflict.
        """
        name = view.scan_id(scan)
        if ScanRecord(scan).archived_at is None and not delete_completed_scan:
            try:
                return await self._delete_live(name)
            except ApiError as e:
                if e.status != 404 or self.archive is None:
                    raise  # else archived meanwhile: marked in the archive, below
        elif ScanRecord(scan).archived_at is None:
            scan = self.cache.get(name) or scan
        if view.has_final_result(scan) and not delete_completed_scan:
            raise _completed()
        return await self._mark(scan, {} if view.is_deleted(scan) else {"deleted": True})

    async def _delete_live(self, name: str) -> Obj:
        async def delete() -> Obj:
            return await self._mark(await self.store.update(name, _deletion), {})

        scan = await self._deletions(name, delete)
        wrote(scan)  # each request's answer carries the version
        return scan

    async def _mark(self, scan: Obj, spec: dict[str, Any]) -> Obj:
        """Merge `spec` into the scan and record the manifest change, live or archived. A live Scan
        archived meanwhile (404) is marked in the archive: the operator deletes a Scan only under a
        resourceVersion precondition, so a mark that reached the live Scan is in its archived copy.
        An archived copy is changed under a row lock, so concurrent marks never undo each other."""
        name = view.scan_id(scan)
        if ScanRecord(scan).archived_at is None:
            try:
                return await self.store.merge(name, Change(spec=spec or None, status=_touched()))
            except ApiError as e:
                if e.status != 404 or self.archive is None:
                    raise
        assert self.archive is not None  # an archived scan comes from the archive
        updated = await self.archive.update(self.namespace, name, lambda stored: marked(stored, spec, now()))
        if updated is None:
            raise not_found()
        return updated

    async def add_workers(self, name: str, location: str, n_workers: int) -> model.WorkerRequestOutcome:
        """Ask the operator for workers through `spec.workerRequests`; wait for its recorded outcome."""
        request_id = uuid.uuid4().hex

        def decide(scan: Obj) -> Change:
            if view.is_deleted(scan):
                raise ApiError(422, "this scan has been deleted--cannot add workers")
            if view.workflow_id(scan) == NOT_YET_REQUESTED:
                raise ApiError(422, "a WMS workflow has not been assigned--cannot add workers")
            if view.has_final_result(scan):
                raise ApiError(422, "this scan has a final result--cannot add workers")
            existing = list(scan["spec"].get("workerRequests") or [])
            ask = model.WorkerRequest(id=request_id, location=location, n_workers=n_workers)
            return Change(spec={"workerRequests": [*existing, ask.to_kube()]})

        await self.store.update(name, decide)

        def answered(scan: Obj | None) -> bool:
            return scan is None or any(o.id == request_id for o in view.worker_outcomes(scan))

        scan = await self.cache.wait_for(name, answered, self._add_workers_timeout)
        if scan is None or not answered(scan):
            raise ApiError(
                504,
                "the operator did not answer the add-workers request in time",
                f"Request {request_id} is recorded in spec.workerRequests; "
                f"check `kubectl describe scan {name}`.",
            )
        outcome = next(o for o in view.worker_outcomes(scan) if o.id == request_id)
        if outcome.state != "Succeeded":
            raise ApiError(
                500,
                "failed to request additional workers on the WMS: "
                + str(outcome.reason or "no reason recorded"),
            )
        return outcome

    async def update_manifest(self, name: str, body: models.PatchManifestBody) -> Obj:
        """Set event and scan metadata once (the same value again is fine), then replace the progress.

        Setting once is a check-then-write, so it is guarded by resourceVersion (and skipped when the
        stored value is already equal, as with every report after the first). The progress is the
        scanner's alone and replaces the stored one whole: it needs no precondition, so concurrent
        reports never conflict.
        """

        def decide(scan: Obj) -> Change:
            record = ScanRecord(scan)
            change: dict[str, Any] = {}
            if body.event_metadata:
                stored = manifest.event_metadata(scan)
                if stored is None:
                    change["event_metadata"] = body.event_metadata.model_dump()
                elif stored != body.event_metadata.model_dump():
                    raise bad_request("Cannot change an existing event_metadata")
            if body.scan_metadata:
                stored_meta = record.scan_metadata
                if not stored_meta:
                    change["scan_metadata"] = body.scan_metadata
                elif stored_meta != body.scan_metadata:
                    raise bad_request("Cannot change an existing scan_metadata")
            if not change:
                return Change()
            status = model.ScanStatus.model_validate({**change, "last_updated": now()})
            return Change(status=status.to_patch())

        scan = await self.store.update(name, decide)
        if not body.progress:
            return scan
        # Always written (even unchanged), so lastUpdated moves with every progress report.
        progress = model.ScanStatus(progress=body.progress.model_dump(mode="json"), last_updated=now())
        return await self.store.replace_status(name, progress.to_patch())

    async def store_result(self, scan: Obj, scan_result: dict[str, Any], is_final: bool) -> None:
        """Write the result payload, then record it in status."""
        data = await encoded(scan_result, "scan result")
        await payloads.write_result(self.api, self.namespace, scan, data)
        # Recorded in status so the operator can finish the workflow once the result is final.
        record = model.ScanStatus(result=model.ResultStatus(is_final=is_final, updated_at=now())).to_patch()
        await self.store.merge(view.scan_id(scan), Change(status=record))

    async def store_startup(self, scan: Obj, raw: bytes) -> None:
        """Store the scanner's startup.json byte for byte (compressed): it must be a JSON object."""

        def check() -> bytes:
            try:
                parsed = json.loads(raw)
            except ValueError as e:
                raise bad_request("startup.json is not valid JSON", str(e)) from None
            if not isinstance(parsed, dict):
                raise bad_request("startup.json must be a JSON object")
            try:
                return payloads.compress(raw, "startup.json")
            except payloads.PayloadTooLarge as e:
                raise ApiError(413, "startup.json too large", str(e)) from None

        data = await asyncio.to_thread(check)
        await payloads.write_startup(self.api, self.namespace, scan, data)

    async def set_workflow_id(self, name: str, workflow_id: str, wms_address: str) -> Obj:
        """Record the WMS workflow, once, and never on a deleted scan."""

        def decide(scan: Obj) -> Change:
            if view.is_deleted(scan) or view.workflow_id(scan) != NOT_YET_REQUESTED:
                raise ApiError(
                    404,
                    "no scan whose workflow id can be set",
                    "The workflow id is set once, and never on a deleted scan.",
                )
            workflow = model.WorkflowStatus(id=workflow_id, address=wms_address)
            return Change(status=model.ScanStatus(workflow=workflow).to_patch())

        return await self.store.update(name, decide)
