"""Which operator replica acts: the decisions over the operator's Lease (coordination.k8s.io/v1), pure.

Only the replica holding the Lease acts; the others stand by and read it every renew interval. A
standby takes the Lease when nobody holds it (none yet, or released on a clean shutdown) or when its
record has not changed for the Lease's duration, timed on the standby's own clock from the moment it
first saw that record: no two machines' clocks are ever compared (client-go's rule too). The holder
renews every renew interval and must have stopped acting `renew_deadline` after its last successful
renewal began, which is before any standby may count the record as expired.

`leader` does the reading and writing; every write carries the resourceVersion it was decided from,
so of two replicas racing for the Lease the API server lets exactly one win (the other gets 409).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class Timing:
    duration: int  # seconds; the Lease's leaseDurationSeconds, an integer in the API
    renew_interval: float

    @property
    def renew_deadline(self) -> float:
        """How long after its last renewal began the holder may still act: a renewal interval short of
        the duration, the margin for the holder's own stop."""
        return self.duration - self.renew_interval


@dataclass(frozen=True)
class Seen:
    """A Lease as a replica last read it, and since when (its own clock) that record has not changed."""

    version: str
    holder: str  # "" when nobody holds it
    duration: float
    since: float


def holder_of(lease: dict[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def seen(lease: dict[str, Any] | None, before: Seen | None, now: float) -> Seen | None:
    """What a read of the Lease (None: there is none) tells, given the previous read."""
    if lease is None:
        return None
    version = str(lease["metadata"]["resourceVersion"])
    since = before.since if before is not None and before.version == version else now
    duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or 0)
    return Seen(version, holder_of(lease), duration, since)


class Move(enum.Enum):
    CREATE = "create"  # there is no Lease yet
    TAKE = "take"  # nobody holds it, its holder let it expire, or it is ours from this replica's last run
    WAIT = "wait"  # another replica holds it


def decide(lease: Seen | None, identity: str, now: float) -> Move:
    """A standby's move after reading the Lease at `now`. Our own identity in it means this replica
    held it before its process restarted (a Pod's name survives a container restart): nobody else
    can be acting on it, so it is taken back at once."""
    if lease is None:
        return Move.CREATE
    if lease.holder in ("", identity) or now - lease.since >= lease.duration:
        return Move.TAKE
    return Move.WAIT


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def held(
    lease: dict[str, Any] | None, name: str, namespace: str, identity: str, timing: Timing, now: datetime
) -> dict[str, Any]:
    """The Lease held by `identity` as of `now` (UTC), from the one read (None: a new Lease). A renewal
    keeps the acquire time; a change of holder counts a transition. Everything else of the read object
    stays, its resourceVersion included: the write fails if the Lease changed since."""
    stamp = micro_time(now)
    if lease is None:
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"acquireTime": stamp, "leaseTransitions": 0},
        }
    else:
        body = copy.deepcopy(lease)
        if holder_of(lease) != identity:
            body.setdefault("spec", {})["acquireTime"] = stamp
            body["spec"]["leaseTransitions"] = int(body["spec"].get("leaseTransitions") or 0) + 1
    spec = body.setdefault("spec", {})
    spec.update(holderIdentity=identity, leaseDurationSeconds=timing.duration, renewTime=stamp)
    spec["acquireTime"] = spec.get("acquireTime") or stamp
    return body


def released(lease: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The Lease let go on a clean shutdown: no holder, so a standby takes it on its next read."""
    body = copy.deepcopy(lease)
    spec = body.setdefault("spec", {})
    spec.pop("holderIdentity", None)
    spec.pop("acquireTime", None)
    spec["renewTime"] = micro_time(now)
    return body
