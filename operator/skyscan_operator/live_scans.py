"""The operator's store of live scans (`LiveScans`): an in-memory, watch-fed view of Scans, their Jobs
and Pods, and what the WMS poller saw.

The kopf event handlers feed it; the reconciler reads it. Indexes are kept up to date per event
(the backlog's line of waiting scans, which scans hold a live workflow) so that no periodic loop has
to look at every object. Only what live work needs is kept: a live scan's compact form, packed
(`skyscan.packing`: ~130 bytes for a waiting Scan, against ~1.6 KB as JSON text), small summaries of
Jobs and Pods; a terminal scan is forgotten once settled.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from skyscan import conditions as cond
from skyscan import names
from skyscan.model import BacklogStatus
from skyscan.packing import Packer
from skyscan.policy import Refusal
from skyscan.scan_record import ScanRecord, compact, resource_version
from skyscan.state import scan_state
from skyscan_operator import workforce
from skyscan_operator.backlog import WAITS, Candidate, Hold, Line, Place, holds
from skyscan_operator.endings import STUCK_REASONS
from skyscan_operator.observed import Admission, JobView, PodView, WorkflowView
from skyscan_operator.planner import ATTEMPT_FAILURES
from skyscan_operator.settings import OperatorSettings

Key = tuple[str, str]  # (namespace, scan id)
Child = Literal["Job", "Pod"]  # the kinds a scan makes that the operator watches


def key_of(body: dict[str, Any]) -> Key:
    """A scan's key, its strings interned: the store's indexes and what is queued share one copy of each
    name (and of the namespace), not one per watch event that brought it."""
    return sys.intern(body["metadata"]["namespace"]), sys.intern(body["metadata"]["name"])


def pod_view(body: dict[str, Any]) -> PodView:
    status = body.get("status") or {}  # raw: Pod
    reason, exit_code, message = status.get("reason"), None, None
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        waiting = state.get("waiting") or {}
        if terminated:
            reason = reason or terminated.get("reason")
            exit_code = terminated.get("exitCode", exit_code)
        elif waiting.get("reason") == "CrashLoopBackOff":
            reason = reason or "CrashLoopBackOff"
        elif waiting.get("reason") in STUCK_REASONS:
            reason, message = reason or waiting["reason"], waiting.get("message")
    for cs in status.get("initContainerStatuses") or []:  # the startup.json sidecar's
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            reason, message = reason or waiting["reason"], waiting.get("message")
    return PodView(
        name=body["metadata"]["name"],
        phase=status.get("phase"),
        reason=reason,
        exit_code=exit_code,
        started_at=cond.epoch(status.get("startTime")),
        message=message,
    )


def job_view(body: dict[str, Any]) -> JobView:
    conditions = (body.get("status") or {}).get("conditions") or []  # raw: Job (conditions as a Scan's)
    failed = cond.is_true(conditions, "Failed")
    return JobView(
        name=body["metadata"]["name"],
        created_at=body["metadata"].get("creationTimestamp"),
        complete=cond.is_true(conditions, "Complete"),
        failed=failed,
        reason=cond.reason(conditions, "Failed") if failed else None,
        deleting=bool(body["metadata"].get("deletionTimestamp")),
    )


def owner_uid(body: dict[str, Any]) -> str | None:
    return next(
        (o["uid"] for o in body["metadata"].get("ownerReferences") or [] if o.get("controller")), None
    )


def shown_hold(record: ScanRecord) -> Hold | None:
    """The hold a waiting scan's status shows (its Admitted=False condition), if any."""
    conditions = record.conditions
    reason = cond.reason(conditions, cond.ADMITTED)
    return Hold(reason, cond.message(conditions, cond.ADMITTED)) if reason else None


def shown_place(entry: BacklogStatus) -> Place | None:
    """The place a waiting scan's status shows (its backlog part), if any."""
    if entry.wait_reason is None:
        return None
    return Place(entry.wait_reason, entry.position, entry.estimated_start)


# Reports of the scanner (through the shim) that the operator never reads.
UNREAD_STATUS = ("eventMetadata", "scanMetadata")


def kept(body: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads of a Scan: its compact form less the scanner's reports, of which only
    the progress rate stays (the REST state, which the operator writes, is computed from it)."""
    obj = compact(body)
    if status := ScanRecord(obj).status:
        status = {k: v for k, v in status.items() if k not in UNREAD_STATUS}
        if progress := status.get("progress"):
            status["progress"] = {
                "processing_stats": {"rate": (progress.get("processing_stats") or {}).get("rate")}
            }
        obj["status"] = status  # raw: the compact copy being made
    return obj


def sorted_keys(obj: Any) -> Any:
    """`obj` with every dict's keys in order, as the API server sends a Scan's."""
    if isinstance(obj, dict):
        return {k: sorted_keys(obj[k]) for k in sorted(obj)}
    return [sorted_keys(v) for v in obj] if isinstance(obj, list) else obj


def waiting_status(settings: OperatorSettings, now: float) -> dict[str, Any]:
    """The status of a scan waiting in the backlog, as the operator writes it: what most of a large
    backlog shows. The store deflates each scan against it too (`Packer(also=...)`), so scans packed
    after a first one that had no status yet take ~180 bytes, not ~400 (measured on 200 bench Scans)."""
    hold = holds(settings)["LowPriorityInterval"]
    conditions = cond.put([], cond.ADMITTED, False, hold.reason, hold.message, now, 1)
    conditions = cond.summarized(conditions, deleting=False, released=True, now=now, at=1)
    backlog: dict[str, Any] = {"attempts": 0, "enteredAt": now, "interruptions": 0, "pendingSince": 0}
    backlog["waitReason"] = "Priority"  # as every scan beyond the first in a large backlog
    state = scan_state(has_final_result=False, workflow_id=None, progress=None, deactivated=None)
    status = {"backlog": backlog, "conditions": conditions, "observedGeneration": 1, "state": state,
              "transitions": [{"at": now, "seq": 1, "state": state}]}  # fmt: skip
    return sorted_keys(status)  # type: ignore[no-any-return]


@dataclass
class LiveScans:
    """Live scans only: a scan that is terminal and settled is forgotten (`settle`) until its next
    watch event; what `lineage_recent` needs of it stays for the replacement window."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    clock: Callable[[], float] = time.time
    jobs: dict[Key, tuple[str | None, JobView]] = field(default_factory=dict)  # (owner uid, view)
    pods: dict[Key, dict[str, PodView]] = field(default_factory=dict)
    workflows: dict[str, WorkflowView] = field(default_factory=dict)  # by workflow id, from the poller
    admissions: dict[Key, Admission] = field(default_factory=dict)  # the backlog's latest decisions
    waiting: set[Key] = field(default_factory=set)  # in the backlog, not in a start attempt
    running: set[Key] = field(default_factory=set)  # started and unfinished (concurrency cap)
    live_workflows: dict[str, Key] = field(default_factory=dict)  # workflow id -> scan
    # Deactivated workflows the poller reads once more (`workforce.wants_final_read`), -> scan; and
    # those it has read so, until their scan settles (one read each, whatever the WMS answers).
    final_reads: dict[str, Key] = field(default_factory=dict)
    _read_after_end: set[str] = field(default_factory=set)
    outage_at: float = 0.0  # when the operator last failed to reach the WMS or the API server
    events: dict[Key, tuple[bool, float]] = field(default_factory=dict)  # sensor event stored?, looked at
    deleted_jobs: dict[Key, str] = field(default_factory=dict)  # the last Job of a scan seen deleted
    # The request policy's verdict on a scan not yet started: (uid, generation it was for, refusal).
    verdicts: dict[Key, tuple[str, int | None, Refusal | None]] = field(default_factory=dict)
    _scans: dict[Key, tuple[int, bytes]] = field(default_factory=dict)  # resourceVersion, `kept` packed
    _workflow_of: dict[Key, str] = field(default_factory=dict)  # the inverse of `live_workflows`
    _lineage: dict[Key, tuple[str | None, float]] = field(default_factory=dict)  # rescanOf, created
    line: Line = field(init=False)
    _usual_holds: dict[Hold, Hold] = field(init=False)  # what most waiting scans show, held once
    _usual_places: dict[Place, Place] = field(init=False)  # the same of places without a position
    granted: set[Key] = field(default_factory=set)  # admitted by the backlog, not yet reconciled
    _packer: Packer = field(init=False)

    def __post_init__(self) -> None:
        self._packer = Packer(also=waiting_status(self.settings, self.clock()))
        self.line = Line(self.settings)
        self._usual_holds = {hold: hold for hold in holds(self.settings).values()}
        self._usual_places = {Place(wait): Place(wait) for wait in WAITS}

    # --- scans ---
    def __contains__(self, key: Key) -> bool:
        return key in self._scans

    def __len__(self) -> int:
        return len(self._scans)

    def scan(self, key: Key) -> dict[str, Any] | None:
        held = self._scans.get(key)
        return self._packer.unpack(held[1]) if held else None

    def version(self, key: Key) -> int | None:
        held = self._scans.get(key)
        return held[0] if held else None

    def put_scan(self, body: dict[str, Any]) -> bool:
        """Store a newer version; False if `body` is older than what we hold (our own patch won)."""
        key, version = key_of(body), resource_version(body)
        held = self._scans.get(key)
        if held is not None and held[0] > version:
            return False
        self._scans[key] = (version, self._packer.pack(kept(body)))
        self._index(key, ScanRecord(body))
        return True

    def drop_scan(self, key: Key) -> None:
        """The Scan is gone from the cluster."""
        self.settle(key)
        self._lineage.pop(key, None)

    def settle(self, key: Key) -> None:
        """Forget a scan with nothing left to do (its next watch event brings it back)."""
        self._scans.pop(key, None)
        self.events.pop(key, None)
        self.deleted_jobs.pop(key, None)
        self.verdicts.pop(key, None)
        self.admissions.pop(key, None)
        self.granted.discard(key)
        self.waiting.discard(key)
        self.running.discard(key)
        self.line.remove(key)
        self._forget_workflow(key)

    def _forget_workflow(self, key: Key) -> None:
        if wf_id := self._workflow_of.pop(key, None):
            self.live_workflows.pop(wf_id, None)
            self.workflows.pop(wf_id, None)
            self.final_reads.pop(wf_id, None)
            self._read_after_end.discard(wf_id)

    def _index(self, key: Key, scan: ScanRecord) -> None:
        waiting = (
            scan.in_backlog
            and not scan.deleted
            and not scan.condition_true(cond.ADMITTED)
            and not scan.condition_true(cond.FAILED)
        )
        (self.waiting.add if waiting else self.waiting.discard)(key)
        (self.running.add if scan.is_running else self.running.discard)(key)
        self._index_workflow(key, scan)
        self._index_line(key, scan)
        created = cond.epoch(scan.obj["metadata"].get("creationTimestamp")) or 0.0
        if created >= self.clock() - self.settings.replacement_window_seconds:
            self._lineage[key] = (scan.rescan_of, created)

    def _index_workflow(self, key: Key, scan: ScanRecord) -> None:
        wf_id = scan.workflow_id
        if self._workflow_of.get(key) != wf_id:
            self._forget_workflow(key)
        if not wf_id:
            return
        self._workflow_of[key] = wf_id
        if not scan.deactivated and not scan.is_terminal:
            self.live_workflows[wf_id] = key
            return
        # Ended: no longer polled, but read once more if what its status shows predates the end (what
        # the poller saw is kept until the scan settles, so a reconcile never misses the last read).
        self.live_workflows.pop(wf_id, None)
        if (
            scan.deactivated
            and wf_id not in self._read_after_end
            and workforce.wants_final_read(scan.taskforces)
        ):
            self.final_reads[wf_id] = key

    def read_after_end(self, wf_id: str, taskforces: tuple[dict[str, Any], ...]) -> Key | None:
        """The poller read an ended workflow's taskforces once more: the scan to reconcile with them,
        or to settle (None: it settled meanwhile). A WMS that no longer lists them leaves its status as
        it is."""
        key = self.final_reads.pop(wf_id, None)
        if key is not None:
            self._read_after_end.add(wf_id)
            if taskforces:
                self.workflows[wf_id] = WorkflowView(None, taskforces)
        return key

    def awaits_final_read(self, key: Key) -> bool:
        """The scan's ended workflow is still to be read once more (it does not settle before)."""
        return self._workflow_of.get(key) in self.final_reads

    def _index_line(self, key: Key, scan: ScanRecord) -> None:
        """A waiting scan is in the backlog's line once its sensor event is seen stored and unless
        its attempts are used up (the planner fails it) or it was just admitted."""
        try:
            entry = scan.backlog() if key in self.waiting and key not in self.granted else None
        except ValidationError:  # a malformed (hand-edited) backlog entry is never admitted
            entry = None
        exhausted = entry is not None and (
            entry.attempts >= self.settings.max_start_attempts
            and cond.reason(scan.conditions, cond.ADMITTED) in ATTEMPT_FAILURES
        )
        if entry is None or exhausted or not self.event_stored(key):
            self.line.remove(key)
            return
        shown, place = shown_hold(scan), shown_place(entry)
        candidate = Candidate(
            key=key,
            priority=scan.priority,
            entered_at=entry.entered_at,
            pending_since=entry.pending_since,
            attempts=entry.attempts,
            interruptions=entry.interruptions,
            shown=self._usual_holds.get(shown, shown) if shown else None,
            place=self._usual_places.get(place, place) if place else None,
        )
        self.line.put(candidate, self.clock())

    def refresh(self, key: Key) -> None:
        """After a reconcile: the scan's place in the line follows what it learnt (its sensor event
        seen, its admission used), and the next tick looks at its hold again. An admitted scan counts
        as running until here, so no tick admits another in its place while its start is written."""
        self.granted.discard(key)
        held = self._scans.get(key)
        if held is not None:
            self.line.remove(key)
            self._index_line(key, ScanRecord(self._packer.unpack(held[1])))

    def admit(self, key: Key) -> None:
        self.admissions[key] = Admission(True)
        self.granted.add(key)

    def hold(self, key: Key, hold: Hold | None, place: Place | None = None) -> None:
        """Tell a waiting scan its hold, its place, or both; what an earlier tick told it and it has
        not written yet stays unless replaced."""
        held = self.admissions.get(key) or Admission(False)
        reason, message = (hold.reason, hold.message) if hold else (held.reason, held.message)
        self.admissions[key] = Admission(False, reason, message, place or held.place)

    def take_admission(self, key: Key) -> Admission | None:
        return self.admissions.pop(key, None)

    def saw_event(self, namespace: str, name: str, stored: bool, at: float) -> None:
        """Whether the scan's sensor event was found stored, looked at `at`."""
        self.events[sys.intern(namespace), sys.intern(name)] = (stored, at)

    def event_stored(self, key: Key) -> bool:
        """Whether the scan's sensor event was seen stored."""
        seen = self.events.get(key)
        return seen is not None and seen[0]

    def lineage_recent(self, key: Key, since: float) -> int:
        """Scans sharing this scan's root request (through `spec.rescanOf`) created after `since`;
        scans created longer than the replacement window ago are not known."""
        namespace = key[0]

        def root(name: str) -> str:
            seen = {name}
            while (known := self._lineage.get((namespace, name))) and (parent := known[0]):
                if parent in seen:
                    break
                seen.add(parent)
                name = parent
            return name

        mine = root(key[1])
        return sum(
            1
            for (ns, name), (_, created) in self._lineage.items()
            if ns == namespace and created >= since and root(name) == mine
        )

    def forget_lineage(self, before: float) -> None:
        """Drop what `lineage_recent` knows of scans created before `before`."""
        for key in [k for k, (_, created) in self._lineage.items() if created < before]:
            del self._lineage[key]

    # --- children ---
    def put_child(self, kind: Child, body: dict[str, Any], deleted: bool) -> Key | None:
        """A watch event of a scan's Job or Pod; the scan's key (None: an object of no scan)."""
        scan_id = names.scan_id_of(body)
        if not scan_id:
            return None
        key, name = (body["metadata"]["namespace"], scan_id), body["metadata"]["name"]
        if kind == "Job":
            self._put_job(key, name, body, deleted)
        else:
            self._put_pod(key, name, body, deleted)
        return key

    def _put_job(self, key: Key, name: str, body: dict[str, Any], deleted: bool) -> None:
        if deleted:
            held = self.jobs.get(key)
            if held and held[1].name == name:
                del self.jobs[key]
            self.deleted_jobs[key] = name
        else:
            self.jobs[key] = (owner_uid(body), job_view(body))
            self.deleted_jobs.pop(key, None)

    def _put_pod(self, key: Key, name: str, body: dict[str, Any], deleted: bool) -> None:
        pods = self.pods.setdefault(key, {})
        if deleted:
            pods.pop(name, None)
            if not pods:
                del self.pods[key]
        else:
            pods[name] = pod_view(body)

    def job_of(self, key: Key, uid: str) -> JobView | None:
        held = self.jobs.get(key)
        return held[1] if held and held[0] == uid else None

    def pods_of(self, key: Key) -> tuple[PodView, ...]:
        return tuple((self.pods.get(key) or {}).values())
