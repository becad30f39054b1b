"""In-memory, watch-fed view of Scans, their Jobs and Pods, and what the WMS poller saw.

The kopf event handlers feed it; the reconciler reads it. Indexes are kept up to date per event
(which scans wait in the backlog, which hold a live workflow) so that no periodic loop has to look
at every object, and only small summaries of Jobs and Pods are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from skyscan import conditions as cond
from skyscan import names
from skyscan.status import ScanRecord, resource_version
from skyscan_operator.planner import Admission, JobView, PodView, WorkflowView

Key = tuple[str, str]  # (namespace, scan id)


def key_of(body: dict[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def pod_view(body: dict[str, Any]) -> PodView:
    status = body.get("status") or {}
    reason, exit_code = status.get("reason"), None
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
        waiting = state.get("waiting") or {}
        if terminated:
            reason = reason or terminated.get("reason")
            exit_code = terminated.get("exitCode", exit_code)
        elif waiting.get("reason") == "CrashLoopBackOff":
            reason = reason or "CrashLoopBackOff"
    return PodView(
        name=body["metadata"]["name"],
        phase=status.get("phase"),
        reason=reason,
        exit_code=exit_code,
        started_at=cond.epoch(status.get("startTime")),
    )


def job_view(body: dict[str, Any]) -> JobView:
    conditions = (body.get("status") or {}).get("conditions") or []  # a Job's, of the same convention
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


@dataclass
class Store:
    scans: dict[Key, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[Key, tuple[str | None, JobView]] = field(default_factory=dict)  # (owner uid, view)
    pods: dict[Key, dict[str, PodView]] = field(default_factory=dict)
    workflows: dict[str, WorkflowView] = field(default_factory=dict)  # by workflow id, from the poller
    admissions: dict[Key, Admission] = field(default_factory=dict)  # the backlog's latest decisions
    waiting: set[Key] = field(default_factory=set)  # in the backlog, not in a start attempt
    running: set[Key] = field(default_factory=set)  # started and unfinished (concurrency cap)
    live_workflows: dict[str, Key] = field(default_factory=dict)  # workflow id -> scan
    outage_at: float = 0.0  # when the operator last failed to reach the WMS or the API server
    events: dict[Key, tuple[bool, float]] = field(default_factory=dict)  # sensor event stored?, looked at

    # --- scans ---
    def put_scan(self, body: dict[str, Any]) -> bool:
        """Store a newer version; False if `body` is older than what we hold (our own patch won)."""
        key = key_of(body)
        held = self.scans.get(key)
        if held is not None and resource_version(held) > resource_version(body):
            return False
        body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "managedFields"}}
        self.scans[key] = body
        self._index(key, body)
        return True

    def drop_scan(self, key: Key) -> None:
        self.scans.pop(key, None)
        self.events.pop(key, None)
        self.admissions.pop(key, None)
        self.waiting.discard(key)
        self.running.discard(key)
        for wf_id in [w for w, k in self.live_workflows.items() if k == key]:
            del self.live_workflows[wf_id]
            self.workflows.pop(wf_id, None)

    def _index(self, key: Key, body: dict[str, Any]) -> None:
        scan = ScanRecord(body)
        waiting = (
            scan.in_backlog
            and not scan.deleted
            and not scan.condition_true(cond.ADMITTED)
            and not scan.condition_true(cond.FAILED)
        )
        (self.waiting.add if waiting else self.waiting.discard)(key)
        (self.running.add if scan.is_running else self.running.discard)(key)
        wf_id = scan.workflow_id
        live = bool(wf_id) and not scan.deactivated and not scan.is_terminal
        for old in [w for w, k in self.live_workflows.items() if k == key and w != wf_id]:
            del self.live_workflows[old]
        if live and wf_id:
            self.live_workflows[str(wf_id)] = key
        elif wf_id:  # ended: its status keeps the last workforce, the poller forgets it
            self.live_workflows.pop(wf_id, None)
            self.workflows.pop(wf_id, None)

    def event_stored(self, key: Key, missing_since: float) -> bool | None:
        """Whether the scan's sensor event was seen stored; a miss counts only if looked at after
        `missing_since` (else None: look again)."""
        seen = self.events.get(key)
        if seen is None or (not seen[0] and seen[1] < missing_since):
            return None
        return seen[0]

    def lineage_recent(self, key: Key, since: float) -> int:
        """Scans sharing this scan's root request (through `spec.rescanOf`) created after `since`."""
        namespace = key[0]

        def root(name: str) -> str:
            seen = {name}
            while (body := self.scans.get((namespace, name))) and (parent := ScanRecord(body).rescan_of):
                if parent in seen:
                    break
                seen.add(parent)
                name = parent
            return name

        mine = root(key[1])
        return sum(
            1
            for (ns, name), body in self.scans.items()
            if ns == namespace
            and (cond.epoch(body["metadata"].get("creationTimestamp")) or 0) >= since
            and root(name) == mine
        )

    # --- children ---
    def put_job(self, body: dict[str, Any], deleted: bool) -> Key | None:
        scan_id = names.scan_id_of(body)
        if not scan_id:
            return None
        key = (body["metadata"]["namespace"], scan_id)
        if deleted:
            held = self.jobs.get(key)
            if held and held[1].name == body["metadata"]["name"]:
                del self.jobs[key]
        else:
            self.jobs[key] = (owner_uid(body), job_view(body))
        return key

    def put_pod(self, body: dict[str, Any], deleted: bool) -> Key | None:
        scan_id = names.scan_id_of(body)
        if not scan_id:
            return None
        key = (body["metadata"]["namespace"], scan_id)
        pods = self.pods.setdefault(key, {})
        if deleted:
            pods.pop(body["metadata"]["name"], None)
            if not pods:
                del self.pods[key]
        else:
            pods[body["metadata"]["name"]] = pod_view(body)
        return key

    def job_of(self, key: Key, uid: str) -> JobView | None:
        held = self.jobs.get(key)
        return held[1] if held and held[0] == uid else None

    def pods_of(self, key: Key) -> tuple[PodView, ...]:
        return tuple((self.pods.get(key) or {}).values())

    def waiting_scans(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        for key in self.waiting:
            if key in self.scans:
                yield key, self.scans[key]
