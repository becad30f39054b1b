"""A plan: the draft of the operator's status keys (typed, updated as the planner's steps decide and
as the executor's actions succeed), the actions to take and the events to post.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from skyscan import conditions as cond
from skyscan import model
from skyscan.scan_record import ENDED_JOB_STATES, OPERATOR_KEYS, ScanRecord, holds_workflow
from skyscan.state import scan_state
from skyscan_operator.actions import Action


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]  # the operator's status keys, wire form
    draft: Draft  # the same keys, typed, for the executor to update as actions succeed
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None

    def wake(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))


# The operator's keys a draft writes: all but the two each pass sets beside it (Execution.wanted).
DRAFT_KEYS = tuple(k for k in OPERATOR_KEYS if k not in ("observedGeneration", "state", "transitions"))
MAX_TRANSITIONS = 32  # kept on a Scan: a real scan passes through fewer states


@dataclass
class Draft:
    """The operator's status keys being rebuilt, typed; `wire()` gives them as the status stores them."""

    conditions: list[dict[str, Any]]
    backlog: model.BacklogStatus | None
    workflow: model.WorkflowStatus
    job: model.JobStatus | None
    workforce: model.Workforce | None
    taskforces: list[dict[str, Any]] | None
    worker_requests: list[model.WorkerRequestOutcome] | None
    credential: model.ScannerCredential | None
    transitions: list[model.Transition]
    now: float
    generation: int | None
    deleting: bool = False  # hard-deleted (deletionTimestamp set)

    @classmethod
    def of(cls, record: ScanRecord, now: float, generation: int | None, deleting: bool = False) -> Draft:
        return cls(
            conditions=record.conditions,
            backlog=record.backlog(),
            workflow=record.workflow(),
            job=record.job(),
            workforce=record.workforce(),
            taskforces=record.taskforces or None,
            worker_requests=record.worker_requests() or None,
            credential=record.scanner_credential(),
            transitions=record.transitions(),
            now=now,
            generation=generation,
            deleting=deleting,
        )

    def wire(self) -> dict[str, Any]:
        """The operator's keys except observedGeneration and state, in wire form; the summary
        conditions (Ready, Reconciling, Stalled) are first brought in line with the rest, so every
        status write, the planner's or the executor's after an action, keeps them consistent."""
        self.conditions = cond.summarized(
            self.conditions, deleting=self.deleting, released=self.released, now=self.now, at=self.generation
        )
        keys = model.OperatorStatus(
            conditions=self.conditions,  # type: ignore[arg-type]  # validated into Condition
            backlog=self.backlog,
            workflow=self.workflow if self.workflow != model.WorkflowStatus() else None,
            job=self.job,
            workforce=self.workforce,
            taskforces=self.taskforces,
            worker_requests=self.worker_requests or None,
            scanner_credential=self.credential,
        ).to_kube()
        return {k: keys.get(k) for k in DRAFT_KEYS}

    @property
    def released(self) -> bool:
        """No workflow held and no Job running: what a deletion's abort waits for."""
        ended = self.job is None or self.job.state in ENDED_JOB_STATES
        return ended and not holds_workflow(self.workflow)

    def state(self, record: ScanRecord) -> str:
        """The REST state of the scan with these keys (actions change it, e.g. a deactivation)."""
        return scan_state(
            has_final_result=record.has_final_result,
            workflow_id=self.workflow.id,
            progress=record.progress,
            deactivated=self.workflow.deactivated,
            failed=self.true(cond.FAILED),
        )

    def stated(self, record: ScanRecord) -> dict[str, Any]:
        """`state` and `transitions`, the state recorded as a transition when it is not the last one
        (once: the draft keeps it, however often its keys are asked for)."""
        state = self.state(record)
        if not self.transitions or self.transitions[-1].state != state:
            seq = self.transitions[-1].seq + 1 if self.transitions else 1
            entered = model.Transition(seq=seq, state=state, at=self.now)
            self.transitions = [*self.transitions, entered][-MAX_TRANSITIONS:]
        return {"state": state, "transitions": [t.to_kube() for t in self.transitions]}

    def set(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.conditions = cond.put(self.conditions, type_, status, reason, message, self.now, self.generation)

    def true(self, type_: str) -> bool:
        return cond.is_true(self.conditions, type_)

    def reason(self, type_: str) -> str | None:
        return cond.reason(self.conditions, type_)

    def message(self, type_: str) -> str:
        return cond.message(self.conditions, type_)
