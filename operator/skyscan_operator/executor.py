"""Carrying out a `Plan` (`Executor.execute`): its events posted, its actions each in turn, dispatched by
type to `kube_actions` or `wms_actions` (`ACTIONS`), their outcomes recorded in the draft of the
operator's status keys (`execution.Execution`), which is written once a pass (and before an action
that must find its intent recorded).

Every side effect is idempotent: the Job and Secrets have deterministic names and are server-side
applied, once their owner is checked; a WMS workflow id is written to status the moment the WMS
returns it; a lost answer is recovered by looking the workflow up by its marker. A failure is
recorded by one of `kube_refused`/`wms_refused`, which end the pass through `stop`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from skyscan.io.kube import Kube
from skyscan.io.kube_errors import NotFound
from skyscan.patch import merge_patch
from skyscan.scan_record import ScanRecord
from skyscan_operator import metrics
from skyscan_operator.actions import (
    Action,
    ProvisionQueues,
    RecoverWorkflow,
    Replace,
    RequestWorkflow,
    SetFinalizer,
)
from skyscan_operator.draft import Event, Plan
from skyscan_operator.execution import Execution, Handler, Stop, sooner, write_status
from skyscan_operator.kube_actions import KUBE_ACTIONS
from skyscan_operator.kube_events import EventPoster
from skyscan_operator.live_scans import LiveScans
from skyscan_operator.observed import ScanView
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.wms_actions import WMS_ACTIONS
from skyscan_operator.wms_client import WMSClient

# Every action type, and what carries it out.
ACTIONS: dict[type, Handler] = {**KUBE_ACTIONS, **WMS_ACTIONS}
# Actions that must find the plan's status written before they act: the intent markers that make
# a workflow request or a replacement happen once (and the finalizer guarding the workflow).
MARKED = (SetFinalizer, RequestWorkflow, RecoverWorkflow, Replace)
# Actions after whose success the scan is planned again at once, from the unwritten draft (their
# outcome is an object that exists or not, found again by the next pass if this one is lost).
CARRIED = (ProvisionQueues,)
CARRY_LIMIT = 3  # plans in one pass

Replan = Callable[[ScanView], Plan]


class Executor:
    """What carries out plans: the API server, the WMS, the operator's store of live scans and its
    Events."""

    def __init__(
        self,
        api: Kube,
        wms: WMSClient | None,
        store: LiveScans,
        events: EventPoster,
        settings: OperatorSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.wms, self.store, self.events, self.settings, self.clock = wms, store, events, settings, clock

    async def refuse_unreadable(self, body: dict[str, Any], plan: tuple[dict[str, Any], list[Event]]) -> None:
        """Write the status `endings.refuse_unreadable` planned for a Scan it cannot read, and post its
        events (a Scan gone meanwhile needs neither)."""
        wanted, events = plan
        meta = body["metadata"]
        if not merge_patch(ScanRecord(body).operator_keys(), wanted):
            return
        try:
            await write_status(self.api, self.store, meta["namespace"], meta["name"], wanted)
        except NotFound:
            return
        for event in events:
            self.events.post(body, event.type, event.reason, event.message, self.clock())

    async def execute(
        self, scan: ScanView, body: dict[str, Any], plan: Plan, replan: Replan | None = None
    ) -> float | None:
        """Returns seconds until the scan wants another pass (None: only when something changes).
        `replan` plans the scan again (from its unwritten draft) after a CARRIED action succeeded."""
        run = Execution(self, scan, body, plan)
        for carry in range(CARRY_LIMIT):
            try:
                wake, carried = await one_pass(run, plan)
            except Stop as stop:
                return None if run.gone or stop.retry_after is None else sooner(run.wake, stop.retry_after)
            except Exception:
                with contextlib.suppress(Exception):  # what was recorded before the failure is kept
                    await run.flush()
                raise
            if not carried or replan is None or carry == CARRY_LIMIT - 1:
                break
            plan = replan(run.preview())
            run = Execution(self, scan, body, plan, written=run.written, body_now=run.body)
        try:
            await run.flush()
        except Stop:
            return None
        return wake


async def one_pass(run: Execution, plan: Plan) -> tuple[float | None, bool]:
    """Post the plan's events and carry out its actions; (wake, whether a CARRIED action succeeded)."""
    for e in plan.events:
        run.event(e.reason, e.message, warning=e.type == "Warning")
        if e.reason == "StartTimedOut":  # the planner's failure of a start attempt
            metrics.START_FAILURES.labels(e.reason).inc()
    if any(isinstance(a, MARKED) for a in plan.actions):
        await run.flush()
    carried = False
    for action in plan.actions:
        again = await carry_out(run, action)
        run.wake = sooner(run.wake, again)
        carried = carried or (isinstance(action, CARRIED) and again == 0.0)
    return run.wake, carried


async def carry_out(run: Execution, action: Action) -> float | None:
    """One action, by its type's entry in `ACTIONS`; seconds until the scan wants another pass."""
    return await ACTIONS[type(action)](run, action)
