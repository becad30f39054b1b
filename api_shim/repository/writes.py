"""What the REST actions write, step by step, through `Scans`: a scan with its sensor event, a rescan,
a soft delete, worker requests, manifest updates, results and the workflow id.

Each sequence is ordered so that a failure leaves nothing behind that nothing refers to: a scan whose
event could not be stored is removed (`Scans.create`), and a rescan marks its original only once the
new scan exists. Refusals raise `ApiError`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Protocol

from api_shim import rest_models, view
from api_shim.errors import ApiError, bad_request
from api_shim.launch import Launch
from api_shim.repository.cache import ScanCache
from api_shim.repository.sharing import SharedRuns
from api_shim.repository.store import Change, Obj, ScanStore, now
from api_shim.repository.versions import wrote
from skyscan import manifest, model
from skyscan.io import payloads
from skyscan.scan_record import ScanRecord
from skyscan.state import NOT_YET_REQUESTED, workers_refusal


class Scans(Protocol):
    """What the writes ask of the repository that makes them (`scans.Scans.writes`)."""

    async def event_stored(self, sensor_event_id: str) -> bool: ...
    async def create(self, spec: Obj, event: bytes | None = None) -> Obj: ...
    async def mark(self, scan: Obj, spec: dict[str, Any]) -> Obj: ...
    async def write_result(self, scan: Obj, data: bytes) -> None: ...
    async def write_startup(self, scan: Obj, data: bytes) -> None: ...


async def encoded(payload: Any, what: str) -> bytes:
    try:
        return await payloads.encode_async(payload, what)
    except payloads.PayloadTooLarge as e:
        raise ApiError(413, f"{what} too large", str(e)) from None


def _completed() -> ApiError:
    return bad_request("Attempted to delete a completed scan (must use `delete_completed_scan=True`)")


def _deletion(scan: Obj) -> Change:
    """The soft delete of a scan that has no final result (`ScanStore.update` decides on each version)."""
    if view.has_final_result(scan):
        raise _completed()
    return Change() if view.is_deleted(scan) else Change(spec={"deleted": True})


class ScanWrites:
    """The shim's write sequences, over the scans repository."""

    def __init__(
        self, scans: Scans, store: ScanStore, cache: ScanCache, add_workers_timeout: float, *, archive: bool
    ) -> None:
        self.scans = scans
        self.store = store  # live Scans: the writes below refuse archived ones before they come here
        self.cache = cache
        self._archive = archive  # whether scans are archived (a live scan gone may be there)
        self._add_workers_timeout = add_workers_timeout
        self._deletions: SharedRuns[str, Obj] = SharedRuns()  # guarded soft deletes under way, by name

    async def launch(self, launch: Launch) -> Obj:
        """The Scan and its sensor event (`Scans.create`): a 413 or 400 for the event before anything
        is written, so an answered POST is a complete scan."""
        data = None
        if launch.event is not None:
            data = await encoded(launch.event, "sensor event")
            sensor_event_id = uuid.uuid4().hex
        else:
            sensor_event_id = launch.sensor_event_id or ""
            if not await self.scans.event_stored(sensor_event_id):
                raise bad_request(
                    "sensor event not found", f"No stored sensor event has id {sensor_event_id!r}."
                )
        return await self.scans.create({**launch.spec.to_kube(), "sensorEventId": sensor_event_id}, data)

    async def rescan(self, original: Obj, *, abort_first: bool, replace_scan: bool) -> Obj:
        """A new scan from the original's request; then, if asked, abort and/or replace the original."""
        origin_id = view.scan_id(original)
        new = await self.scans.create(model.rescan_spec(ScanRecord(original).spec, origin_id))
        if abort_first or replace_scan:
            # After the new scan exists, so a failure never leaves the original aborted with no rescan.
            marks: dict[str, Any] = {}
            if abort_first:
                marks["deleted"] = True
            if replace_scan:
                marks["replacedBy"] = view.scan_id(new)
            await self.scans.mark(original, marks)
        return new

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
                if e.status != 404 or not self._archive:
                    raise  # else archived meanwhile: marked in the archive, below
        elif ScanRecord(scan).archived_at is None:
            scan = self.cache.get(name) or scan
        if view.has_final_result(scan) and not delete_completed_scan:
            raise _completed()
        return await self.scans.mark(scan, {} if view.is_deleted(scan) else {"deleted": True})

    async def _delete_live(self, name: str) -> Obj:
        async def delete() -> Obj:
            return await self.scans.mark(await self.store.update(name, _deletion), {})

        scan = await self._deletions(name, delete)
        wrote(scan)  # each request's answer carries the version
        return scan

    async def add_workers(self, name: str, location: str, n_workers: int) -> model.WorkerRequestOutcome:
        """Ask the operator for workers through `spec.workerRequests`; wait for its recorded outcome."""
        request_id = uuid.uuid4().hex

        def decide(scan: Obj) -> Change:
            record = ScanRecord(scan)
            refusal = workers_refusal(
                deleted=record.deleted or record.deleting,
                has_final_result=record.has_final_result,
                workflow_id=record.workflow_id,
                deactivated=record.deactivated,
            )
            if refusal:
                raise ApiError(422, refusal)
            existing = record.worker_asks
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
        if outcome.state == "Refused":  # the state changed meanwhile (e.g. the workflow ended)
            raise ApiError(422, outcome.reason or "this scan takes no more workers")
        if outcome.state == "Rejected":  # the WMS refused the request itself, e.g. a cluster it does not know
            raise ApiError(400, outcome.reason or "the WMS refused the request")
        if outcome.state != "Succeeded":
            raise ApiError(
                500,
                "failed to request additional workers on the WMS: "
                + str(outcome.reason or "no reason recorded"),
            )
        return outcome

    async def update_manifest(self, name: str, body: rest_models.PatchManifestBody) -> Obj:
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
        return await self.store.replace_progress(name, body.progress.model_dump(mode="json"))

    async def store_result(self, scan: Obj, scan_result: dict[str, Any], is_final: bool) -> None:
        """Write the result payload, then record it in status."""
        data = await encoded(scan_result, "scan result")
        await self.scans.write_result(scan, data)
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
        await self.scans.write_startup(scan, data)

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
