"""What the handlers observe of a scan and around it, as the planner reads it: the Scan (`ScanView`),
its Job and Pods (summaries of the watch caches), its WMS workflow (the batched poller's answer), the
backlog's decision and the other looks of a pass (`Observed`). Plain frozen values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skyscan import conditions as cond
from skyscan import model, policy
from skyscan.scan_record import ScanRecord
from skyscan_operator.backlog import Place

TRANSIENT_REASONS = frozenset({"OOMKilled", "Evicted", "DeadlineExceeded", "StartError", "CrashLoopBackOff"})
TRANSIENT_EXIT_CODES = frozenset({137, 143})


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str | None
    reason: str | None = None  # pod-level reason, else a container's terminated/waiting reason
    exit_code: int | None = None
    started_at: float | None = None
    message: str | None = None  # the kubelet's, of a container that cannot start

    @property
    def transient_failure(self) -> bool:
        return self.reason in TRANSIENT_REASONS or self.exit_code in TRANSIENT_EXIT_CODES


@dataclass(frozen=True)
class JobView:
    name: str
    created_at: str | None
    complete: bool = False
    failed: bool = False
    reason: str | None = None
    deleting: bool = False


@dataclass(frozen=True)
class WorkflowView:
    deactivated: str | None
    taskforces: tuple[dict[str, Any], ...] = ()
    # The WMS answers but no longer knows the workflow (absent from its batched answers in a row, as
    # after a WMS restarted without its data): no worker will come for it. Since when it was missed.
    lost: bool = False
    lost_since: float = 0.0


@dataclass(frozen=True)
class Admission:
    """The backlog's decision on this tick: admitted, or held with a reason (none: the one shown
    stays) and a place to write (none: the one shown stays)."""

    granted: bool
    reason: str = ""
    message: str = ""
    place: Place | None = None


@dataclass(frozen=True)
class Observed:
    job: JobView | None = None
    pods: tuple[PodView, ...] = ()
    workflow: WorkflowView | None = None
    admission: Admission | None = None
    lineage_recent: int = 0  # scans of this lineage created within the replacement window
    fresh_id: str = ""  # an unused scan id, in case a replacement must be chosen
    replacement_exists: bool = False
    wms_poll_error: str | None = None  # the last batched WMS poll failed (for scans with a workflow)
    # Since when the operator has run and seen no WMS or API-server outage: a start attempt's timeout
    # runs from here at the earliest (time lost to an outage, or to the operator's absence, is not the
    # scan's failure).
    healthy_since: float = 0.0
    # The scan's sensor event: True stored (and owned by the scan), False missing at the last look,
    # None not looked at yet (or long enough ago to look again).
    event: bool | None = None
    # The first rule REST holds a request to that the scan's spec breaks (`skyscan.policy`), looked at
    # while its Job does not exist; None: it breaks none, or it was not looked at (a started scan).
    refusal: policy.Refusal | None = None


@dataclass(frozen=True)
class ScanView:
    name: str
    namespace: str
    uid: str
    generation: int | None
    created_at: float
    deleting: bool
    finalizers: tuple[str, ...]
    labels: dict[str, str]
    spec: model.ScanSpec
    raw_spec: dict[str, Any]
    record: ScanRecord
    resource_version: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ScanView:
        meta, record = body["metadata"], ScanRecord(body)
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            generation=meta.get("generation"),
            created_at=cond.epoch(meta.get("creationTimestamp")) or 0.0,
            deleting=record.deleting,
            finalizers=tuple(meta.get("finalizers") or ()),
            labels=dict(meta.get("labels") or {}),
            # Leniently (`model.STORED`): the request policy is `endings.refuse_invalid`'s.
            spec=record.scan_spec(),
            raw_spec=record.spec,
            record=record,
            resource_version=meta.get("resourceVersion", ""),
        )
