"""Typed reads of a Scan object: the one module that knows the wire keys of its status.

`ScanRecord(scan)` wraps the JSON the API server returns (camelCase) without copying it, so reads stay
cheap on hot paths (every REST read, every reconcile). Scalars come straight from the JSON; the
structured parts (`workflow()`, `job()`, `backlog()`, `result()`, ...) are parsed into the models of
`skyscan.model`, which also generate the CRD, so the key names exist once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyscan import conditions as cond
from skyscan import model, names
from skyscan.state import NOT_YET_REQUESTED, scan_state

Obj = Mapping[str, Any]

# The status keys each writer owns; the operator writes only its own, the shim only the others.
OPERATOR_KEYS = tuple(str(f.alias) for f in model.OperatorStatus.model_fields.values())
ENDED_JOB_STATES = ("Succeeded", "Failed", "Deleted")


def resource_version(obj: Obj) -> int:
    """An object's resourceVersion as a number, to tell the newer of two copies (0 if unknown)."""
    try:
        return int(obj["metadata"].get("resourceVersion", 0))
    except (TypeError, ValueError):
        return 0


# The metadata a Scan's readers use; the rest (managedFields above all) is dropped from what is kept.
KEPT_METADATA = (
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "annotations", "labels", "finalizers",
)  # fmt: skip


def compact(obj: Obj) -> dict[str, Any]:
    """The parts of a Scan object its readers need: what a cache keeps and the archive stores."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion", model.API_VERSION),
        "kind": obj.get("kind", model.KIND),
        "metadata": {k: meta[k] for k in KEPT_METADATA if k in meta},
        "spec": obj.get("spec") or {},
        **({"status": obj["status"]} if obj.get("status") else {}),
    }


def holds_workflow(workflow: model.WorkflowStatus) -> bool:
    """A live workflow, or one that may exist (requested, answer not recorded)."""
    if workflow.id:
        return not workflow.deactivated
    return bool(workflow.requested_at)


class ScanRecord:
    """Reads of one Scan object (metadata, spec flags the views need, and status)."""

    __slots__ = ("_st", "obj", "spec")

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.spec: dict[str, Any] = obj.get("spec") or {}  # as stored (camelCase); `scan_spec()` is its model
        self._st: Obj = obj.get("status") or {}

    @property
    def status(self) -> Obj:
        """The stored status (camelCase), for code that copies it whole; read keys through the properties."""
        return self._st

    # --- metadata and spec
    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def created_at(self) -> float:
        """Creation time in Unix seconds: the shim's sub-second annotation, else the API server's."""
        meta = self.obj["metadata"]
        stamp = (meta.get("annotations") or {}).get(names.TIMESTAMP_ANNOTATION)
        if stamp:
            try:
                return float(stamp)
            except ValueError:
                pass
        return cond.epoch(meta.get("creationTimestamp")) or 0.0

    @property
    def deleted(self) -> bool:
        return bool(self.spec.get("deleted"))

    @property
    def deleting(self) -> bool:
        """Hard-deleted (`deletionTimestamp` set): held by a finalizer until the operator lets go."""
        return bool(self.obj["metadata"].get("deletionTimestamp"))

    @property
    def sensor_event_id(self) -> str:
        return str(self.spec["sensorEventId"])

    @property
    def rescan_of(self) -> str | None:
        parent = self.spec.get("rescanOf")
        return str(parent) if parent else None

    @property
    def replaced_by(self) -> str | None:
        new = self.spec.get("replacedBy")
        return str(new) if new else None

    @property
    def priority(self) -> int:
        return int(self.spec.get("priority", 0))

    @property
    def classifiers(self) -> dict[str, Any]:
        return dict(self.spec.get("classifiers") or {})

    @property
    def worker_asks(self) -> list[dict[str, Any]]:
        """The worker requests asked through REST (`spec.workerRequests`), in order."""
        return list(self.spec.get("workerRequests") or [])

    def scan_spec(self) -> model.ScanSpec:
        """The spec's model; the request policies were checked when it was admitted (`model.STORED`)."""
        return model.ScanSpec.model_validate(self.spec, context=model.STORED)

    # --- operator keys
    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self._st.get("conditions") or [])

    def condition_true(self, type_: str) -> bool:
        return cond.is_true(self._st.get("conditions") or [], type_)

    @property
    def in_backlog(self) -> bool:
        return bool(self._st.get("backlog"))

    def backlog(self) -> model.BacklogStatus | None:
        raw = self._st.get("backlog")
        return model.BacklogStatus.model_validate(raw) if raw else None

    def workflow(self) -> model.WorkflowStatus:
        return model.WorkflowStatus.model_validate(self._st.get("workflow") or {})

    @property
    def workflow_id(self) -> str | None:
        return (self._st.get("workflow") or {}).get("id")

    @property
    def wms_address(self) -> str | None:
        return (self._st.get("workflow") or {}).get("address")

    @property
    def deactivated(self) -> str | None:
        """ABORTED or FINISHED once the WMS workflow is deactivated."""
        return (self._st.get("workflow") or {}).get("deactivated")

    def job(self) -> model.JobStatus | None:
        raw = self._st.get("job")
        return model.JobStatus.model_validate(raw) if raw else None

    @property
    def job_state(self) -> str | None:
        return (self._st.get("job") or {}).get("state")

    @property
    def scanner_pod(self) -> str | None:
        """The scanner's Pod the operator last saw (`status.job.pod`): whose log is read while it runs."""
        return (self._st.get("job") or {}).get("pod")

    def workforce(self) -> model.Workforce | None:
        raw = self._st.get("workforce")
        return model.Workforce.model_validate(raw) if raw is not None else None

    @property
    def taskforces(self) -> list[dict[str, Any]]:
        return list(self._st.get("taskforces") or [])

    def transitions(self) -> list[model.Transition]:
        return [model.Transition.model_validate(t) for t in self._st.get("transitions") or []]

    def worker_requests(self) -> list[model.WorkerRequestOutcome]:
        return [model.WorkerRequestOutcome.model_validate(o) for o in self._st.get("workerRequests") or []]

    def scanner_credential(self) -> model.ScannerCredential | None:
        raw = self._st.get("scannerCredential")
        return model.ScannerCredential.model_validate(raw) if raw else None

    @property
    def holds_scanner_credential(self) -> bool:
        """A scanner token was issued and its Secret not yet deleted."""
        raw = self._st.get("scannerCredential") or {}
        return bool(raw) and not raw.get("revoked")

    @property
    def scanner_may_act(self) -> bool:
        """Whether this scan's scanner credential is honoured: issued, not revoked, the scan not deleted
        and its Job not ended (a token outliving these is refused even before its Secret is gone)."""
        return self.holds_scanner_credential and not self.deleted and self.job_state not in ENDED_JOB_STATES

    def operator_keys(self) -> dict[str, Any]:
        """The operator's part of the status as stored (for computing its next merge patch)."""
        return {k: self._st.get(k) for k in OPERATOR_KEYS}

    # --- shim keys
    @property
    def progress(self) -> dict[str, Any] | None:
        return self._st.get("progress") or None

    def event_metadata(self) -> model.EventMetadataStatus | None:
        raw = self._st.get("eventMetadata")
        return model.EventMetadataStatus.model_validate(raw) if raw else None

    @property
    def scan_metadata(self) -> dict[str, Any] | None:
        return self._st.get("scanMetadata")

    def result(self) -> model.ResultStatus | None:
        raw = self._st.get("result")
        return model.ResultStatus.model_validate(raw) if raw else None

    @property
    def has_result(self) -> bool:
        return bool(self._st.get("result"))

    @property
    def has_final_result(self) -> bool:
        return (self._st.get("result") or {}).get("isFinal") is True

    @property
    def last_updated(self) -> float:
        return float(self._st.get("lastUpdated") or 0.0)

    @property
    def archived_at(self) -> float | None:
        """When the scan moved to the archive (Unix seconds); None for a live scan. Only copies read
        back from the archive carry it: the API server never stores it."""
        stamp = self._st.get("archivedAt")
        return float(stamp) if stamp is not None else None

    # --- derived
    @property
    def rest_workflow_id(self) -> str:
        """The manifest's `wms_workflow_id`: the sentinel until the operator records a workflow."""
        return self.workflow_id or NOT_YET_REQUESTED

    @property
    def scan_state(self) -> str:
        return scan_state(
            has_final_result=self.has_final_result,
            workflow_id=self.workflow_id,
            progress=self.progress,
            deactivated=self.deactivated,
            failed=self.condition_true(cond.FAILED),
        )

    @property
    def is_terminal(self) -> bool:
        """Nothing left to do: no live workflow, and the scan is deleted, failed or finished."""
        if holds_workflow(self.workflow()) or self.holds_scanner_credential:
            return False
        if self.deleted:
            return self.job_state in (None, *ENDED_JOB_STATES)
        return self.condition_true(cond.FAILED) or bool(self.deactivated)

    @property
    def is_running(self) -> bool:
        """Started and unfinished, for the concurrency cap: in a start attempt, or its Job not ended."""
        if self.deleted or self.condition_true(cond.FAILED):
            return False
        if self.condition_true(cond.ADMITTED) and self.in_backlog:
            return True
        return bool(self._st.get("job")) and self.job_state not in ENDED_JOB_STATES
