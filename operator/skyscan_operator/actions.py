"""What a plan asks to be done (the planner decides them, `skyscan_operator.executor` carries them
out): one frozen type per action, on the WMS or on Kubernetes objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class CheckEvent:
    """Look whether the scan's sensor event is stored; adopt it if the scan is not among its owners."""

    sensor_event_id: str


@dataclass(frozen=True)
class RequestWorkflow:
    body: dict[str, Any]


@dataclass(frozen=True)
class RecoverWorkflow:
    """Look the workflow up by its marker (a restart lost the request's answer); if there is none,
    request it (`create_if_missing`) or forget the intent."""

    body: dict[str, Any]
    marker: str
    create_if_missing: bool


@dataclass(frozen=True)
class ProvisionQueues:
    workflow_id: str


@dataclass(frozen=True)
class CreateJob:
    job: dict[str, Any]


@dataclass(frozen=True)
class DeleteJob:
    name: str


@dataclass(frozen=True)
class IssueScannerCredential:
    """The scanner's own token, bound to a per-scan Secret: created before the Job that reads it."""

    lifetime_seconds: int


@dataclass(frozen=True)
class RevokeScannerCredential:
    """Delete the per-scan Secret: the token bound to it stops validating."""

    secret: str


@dataclass(frozen=True)
class Deactivate:
    workflow_id: str
    how: Literal["abort", "finished"]


@dataclass(frozen=True)
class AddWorkers:
    """Ask the WMS for workers at `location`, the WMS's name (aliased as at launch) of `asked`."""

    request_id: str
    workflow_id: str
    location: str
    n_workers: int
    asked: str


@dataclass(frozen=True)
class SetFinalizer:
    present: bool


@dataclass(frozen=True)
class Replace:
    """Create the replacement scan (idempotent by name), then mark the original: the one spec write
    the operator makes, a merge patch of exactly `deleted` and `replacedBy`."""

    new_id: str
    body: dict[str, Any]


Action = (
    RequestWorkflow | RecoverWorkflow | ProvisionQueues | CreateJob | DeleteJob | Deactivate | AddWorkers
    | SetFinalizer | Replace | IssueScannerCredential | RevokeScannerCredential | CheckEvent
)  # fmt: skip
