"""The operator's engine: watch events in, one reconcile per scan at a time, two periodic loops.

- kopf event handlers call `on_scan` / `on_child` (a Job or a Pod), which update the store (`LiveScans`)
  and queue the scan concerned.
- Workers take scans off the `WorkQueue`, build `Observed` from the store, run the pure planner
  and execute the plan (`Executor`).
- The backlog loop admits from the head of the backlog's line (kept in the store per event) and
  queues the scans admitted and those whose hold changed; a tick with nothing to do does no work.
- The WMS poller asks the WMS about every live workflow in two batched queries per interval and
  queues the scans whose workflow changed.
- The payload janitor lists payload ConfigMaps (metadata only) per interval and deletes those left
  without an owner, or lets the Scans naming them adopt them (`janitor`).
- A terminal scan is reconciled on its events and then forgotten (`LiveScans.settle`): the operator's
  memory follows live work, not history.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from skyscan import conditions as cond
from skyscan import logs, model, policy
from skyscan.io import kube, payloads
from skyscan.io.kube_errors import Conflict, NotFound, is_outage
from skyscan.scan_record import ENDED_JOB_STATES, ScanRecord
from skyscan.tags import TagCatalog
from skyscan_operator import endings, janitor, metrics, planner
from skyscan_operator.archiver import Archiver
from skyscan_operator.draft import Plan
from skyscan_operator.executor import Executor
from skyscan_operator.kube_events import EventPoster
from skyscan_operator.live_scans import Child, Key, LiveScans, key_of
from skyscan_operator.log_keeper import LogKeeper
from skyscan_operator.observed import Observed, ScanView, WorkflowView
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.webhooks import Webhooks
from skyscan_operator.wms_client import WMSClient, WMSError, WMSUnavailable
from skyscan_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
JANITOR_BUDGET = 200  # payload changes per namespace and sweep
# How long a Job recorded in a scan's status may stay unseen by the Job watch (which can lag behind
# the Scan watch, e.g. right after the Job's creation or the operator's start) before it counts as gone.
JOB_WATCH_GRACE = 10.0
# A workflow absent from this many successful batched polls in a row is lost (one absence may be a
# WMS answering from a replica that has not caught up).
LOST_AFTER_POLLS = 2
# A failing batched poll is tried again after a delay that doubles per failure in a row, up to this
# (never less than the poll interval): an outage is not hammered.
POLL_BACKOFF_MAX_SECONDS = 30.0


class Controller:
    def __init__(self, settings: OperatorSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings, self.clock = settings, clock
        self.store = LiveScans(settings, clock)
        self.queue: WorkQueue[Key] = WorkQueue()
        self.last_low_priority_admission: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._api: kube.Kube | None = None
        self.wms: WMSClient | None = None
        self.events: EventPoster | None = None
        self.executor: Executor | None = None
        self.archiver: Archiver | None = None  # with an archive DSN
        self.log_keeper: LogKeeper | None = None
        self.webhooks: Webhooks | None = None
        self.catalog = TagCatalog(settings.tag_catalog_dir, settings.tags)
        self._invalid: set[tuple[Key, str]] = set()
        self.wms_poll_error: str | None = None  # why the last batched WMS poll failed, if it did
        self.poll_failures = 0  # batched WMS polls failed in a row
        self._poll_resume_at = 0.0  # no batched poll before this (backing off after failures)
        # workflow id -> (successful polls in a row it was absent from, when it was first missed)
        self._absent: dict[str, tuple[int, float]] = {}
        self.started_at = 0.0
        self.metrics: metrics.MetricsServer | None = None

    async def start(self) -> None:
        s = self.settings
        self.started_at = self.clock()
        self._api = await kube.connect(s.kubeconfig)
        if s.wms_base_url:
            self.wms = WMSClient(
                s.wms_base_url,
                timeout=s.wms_timeout_seconds,
                retries=s.wms_retries,
                backoff=s.wms_backoff_seconds,
                oidc_issuer=s.wms_oidc_issuer,
                client_id=s.wms_client_id,
                client_secret=s.wms_client_secret,
            )
        self.events = EventPoster(self._api)
        self.events.start()
        self.webhooks = Webhooks(self._api, s, self.clock)
        self.executor = Executor(self._api, self.wms, self.store, self.events, s, self.clock)
        self.log_keeper = LogKeeper(self._api, s, self.events, self.clock)
        self.log_keeper.start()
        if s.archive_dsn:
            self.archiver = Archiver(self._api, s, self.clock)
        for i in range(s.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"skyscan-worker-{i}"))
        self._tasks.append(
            asyncio.create_task(self._every(s.backlog_tick_seconds, self.backlog_tick), name="backlog")
        )
        if self.wms:
            self._tasks.append(
                asyncio.create_task(
                    self._every(s.wms_poll_interval_seconds, self.poll_wms), name="wms-poller"
                )
            )
        self._tasks.append(
            asyncio.create_task(self._every(s.janitor_interval_seconds, self.sweep_payloads), name="janitor")
        )
        if self.archiver:
            archiving = self._every(s.archive_interval_seconds, self.archiver.tick)
            self._tasks.append(asyncio.create_task(archiving, name="archiver"))
        if s.metrics_port:
            self.metrics = metrics.MetricsServer(
                metrics.StoreCollector(self.store, self.queue, self.archiver, self.clock)
            )
            await self.metrics.start(s.metrics_host, s.metrics_port)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.log_keeper:
            await self.log_keeper.stop()
        if self.metrics:
            await self.metrics.stop()
        if self.webhooks:
            await self.webhooks.stop()
        if self.events:
            await self.events.stop()
        if self.wms:
            await self.wms.aclose()
        if self.archiver:
            await self.archiver.close()
        if self._api:
            await self._api.close()

    # --- fed by the kopf event handlers ---
    def on_scan(self, event_type: str | None, body: dict[str, Any]) -> None:
        if self.webhooks:
            try:
                self.webhooks.on_scan(event_type, body)
            except Exception:  # webhooks never keep a scan from being reconciled
                log.exception("webhooks: the event of %s/%s was not offered", *key_of(body))
        key = key_of(body)
        if event_type == "DELETED":
            self.store.drop_scan(key)
            self.queue.forget(key)
            if self.archiver:
                self.archiver.forget(key)
            return
        if self.archiver:
            self.archiver.observe(key, body)
        if self.store.put_scan(body):
            self.queue.add(key)

    def on_subscription(self, event_type: str | None, body: dict[str, Any]) -> None:
        if self.webhooks:
            self.webhooks.on_subscription(event_type, body)

    def on_child(self, kind: Child, event_type: str | None, body: dict[str, Any]) -> None:
        if kind == "Pod" and self.log_keeper:
            self.log_keeper.observe(body, deleted=event_type == "DELETED")
        if key := self.store.put_child(kind, body, deleted=event_type == "DELETED"):
            self.queue.add(key)

    # --- reconciling ---
    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                wake = await self.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("reconciling %s/%s failed; retrying", *key, extra=logs.about(key[1]))
                if is_outage(e):  # start attempts do not time out meanwhile
                    self.store.outage_at = self.clock()
                wake = 5.0
            finally:
                self.queue.done(key)
            if wake is not None:
                self.queue.add_after(key, wake)

    async def refusal(self, key: Key, scan: ScanView) -> policy.Refusal | None:
        """The request policy's verdict on the spec of a scan whose Job does not exist yet (see
        `endings.refuse_invalid`): worked out once per generation of its spec, with the tag catalog as
        it is then, and kept in the store until the scan starts or settles. A started, deleted or
        failed scan is not looked at."""
        record = scan.record
        started = record.job() is not None
        if started or scan.spec.deleted or scan.deleting or record.condition_true(cond.FAILED):
            self.store.verdicts.pop(key, None)
            return None
        held = self.store.verdicts.get(key)
        if held is not None and held[:2] == (scan.uid, scan.generation):
            return held[2]
        verdict = policy.refusal(scan.raw_spec, self.settings.request_policy(await self.catalog.tags()))
        self.store.verdicts[key] = (scan.uid, scan.generation, verdict)
        return verdict

    def observe(
        self, key: Key, scan: ScanView, now: float, refusal: policy.Refusal | None = None
    ) -> Observed:
        store = self.store
        workflow_id = scan.record.workflow_id
        pods = store.pods_of(key)
        workflow = store.workflows.get(workflow_id) if workflow_id else None
        transient = any(p.transient_failure for p in pods) or bool(workflow and workflow.lost)
        return Observed(
            job=store.job_of(key, scan.uid),
            pods=pods,
            workflow=workflow,
            wms_poll_error=self.wms_poll_error if workflow_id else None,
            healthy_since=max(self.started_at, store.outage_at),
            event=planner.event_seen(store.events.get(key), scan.created_at, now),
            admission=store.take_admission(key),
            lineage_recent=(
                store.lineage_recent(key, now - self.settings.replacement_window_seconds) if transient else 0
            ),
            fresh_id=model.new_scan_id(now, uuid.uuid4().hex),
            # The operator names the replacement in the spec only once it is created; it may have ended
            # or been archived since, and is never created again.
            replacement_exists=bool(scan.spec.replaced_by),
            refusal=refusal,
        )

    async def reconcile(self, key: Key) -> float | None:
        started = time.monotonic()
        try:
            return await self._reconcile(key)
        finally:
            self.store.refresh(key)
            metrics.RECONCILE_DURATION.observe(time.monotonic() - started)

    async def _reconcile(self, key: Key) -> float | None:
        version, body = self.store.version(key), self.store.scan(key)
        if body is None or self.executor is None:
            return None
        try:
            scan = ScanView.from_body(body)
        except ValidationError as e:
            await self._refuse_unreadable(key, body, e)
            if self.store.version(key) == version and settled(ScanRecord(body)):
                self.store.settle(key)
            return None
        now = self.clock()
        if self._job_not_seen_yet(key, scan, now):
            return 1.0  # planning now would take the Job for deleted
        refusal = await self.refusal(key, scan)

        def replan(view: ScanView) -> Plan:
            return planner.plan(view, self.observe(key, view, now, refusal), now, self.settings)

        try:
            wake = await self.executor.execute(scan, body, replan(scan), replan)
        except NotFound:
            return None
        if (
            wake is None
            and self.store.version(key) == version
            and settled(scan.record)
            and not self.store.awaits_final_read(key)
        ):
            self.store.settle(key)
        return wake

    def _job_not_seen_yet(self, key: Key, scan: ScanView, now: float) -> bool:
        """The status records a live Job that the Job watch has shown neither present nor deleted."""
        job = scan.record.job()
        if job is None or job.state in ENDED_JOB_STATES or self.store.job_of(key, scan.uid):
            return False
        if self.store.deleted_jobs.get(key) == job.name:
            return False
        since = max(cond.epoch(job.created_at) or 0.0, self.started_at)
        return now - since < JOB_WATCH_GRACE

    async def _refuse_unreadable(self, key: Key, body: dict[str, Any], e: ValidationError) -> None:
        """A Scan whose spec cannot be read even leniently: Failed/InvalidSpec if it has not started
        (`endings.refuse_unreadable`), else reported invalid (an Event per version) and left alone."""
        refusal = policy.invalid(e)
        refused = endings.refuse_unreadable(body, refusal, self.clock())
        if refused is not None and self.executor is not None:
            await self.executor.refuse_unreadable(body, refused)
            return
        if ScanRecord(body).condition_true(cond.FAILED):
            return  # it said why when it failed
        rv = body["metadata"].get("resourceVersion", "")
        if (key, rv) not in self._invalid and self.events:
            self._invalid.add((key, rv))
            self.events.post(body, "Warning", "InvalidSpec", str(refusal)[:500], self.clock())

    # --- periodic loops ---
    async def _every(self, seconds: float, tick: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(seconds)  # first after a full interval: the initial listing is in by then
            try:
                result = tick()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed", getattr(tick, "__name__", tick))

    def backlog_tick(self) -> None:
        store = self.store
        decision = store.line.tick(
            running=len(store.running) + len(store.granted),
            now=self.clock(),
            last_low_priority_admission=self.last_low_priority_admission,
        )
        self.last_low_priority_admission = decision.low_priority_admitted_at
        for key in decision.admit:
            store.admit(key)
            self.queue.add(key)
        metrics.ADMISSIONS.inc(len(decision.admit))
        for key in decision.hold.keys() | decision.place.keys():
            hold, place = decision.hold.get(key), decision.place.get(key)
            if hold and hold.reason == "RetryDelay":  # the failed attempt's reason stays visible meanwhile
                hold = None
            if hold or place:
                store.hold(key, hold, place)
                self.queue.add(key)

    async def sweep_payloads(self) -> None:
        """Delete payloads left without an owner past the grace period, or let the Scans naming them
        adopt them; at most `JANITOR_BUDGET` changes per namespace and sweep."""
        if self._api is None:
            return
        self.store.forget_lineage(self.clock() - self.settings.replacement_window_seconds)
        grace = self.settings.payload_grace_seconds
        for namespace in self.settings.namespaces:
            budget = JANITOR_BUDGET
            refs: dict[janitor.Ref, list[dict[str, Any]]] | None = None
            async for page in payloads.list_payload_metadata(self._api, namespace):
                ownerless = janitor.ownerless(page, now=self.clock(), grace=grace)
                if not ownerless:
                    continue
                if refs is None:  # rare: only now are the Scans naming payloads looked up
                    refs = await self._payload_refs(namespace)
                now = self.clock()
                changes = janitor.sweep(namespace, ownerless, refs, now=now, grace=grace, budget=budget)
                for change in changes:
                    await self._clean(namespace, change)
                budget -= len(changes)
                if budget <= 0:
                    break

    async def _payload_refs(self, namespace: str) -> dict[janitor.Ref, list[dict[str, Any]]]:
        assert self._api is not None
        refs: dict[janitor.Ref, list[dict[str, Any]]] = {}
        # Pages of 100, as kopf lists them (handlers.startup): a page of 500 Scans is ~15 MiB at once.
        async for page in kube.list_scans(self._api, namespace, page_size=100):
            for ref, owners in janitor.referenced(page).items():
                refs.setdefault(ref, []).extend(owners)
        return refs

    async def _clean(self, namespace: str, change: janitor.Delete | janitor.Adopt) -> None:
        assert self._api is not None
        try:
            if isinstance(change, janitor.Delete):
                await payloads.delete_payload(self._api, namespace, change.name, change.resource_version)
                log.info("janitor: deleted %s/%s, which had no owner", namespace, change.name)
            else:
                owners, version = list(change.owners), change.resource_version
                await payloads.add_owners(self._api, namespace, change.name, owners, version)
                log.info("janitor: %s/%s adopted by the Scans naming it", namespace, change.name)
        except (NotFound, Conflict):  # gone, or changed since it was listed: the next sweep looks again
            pass

    def _set_poll_error(self, error: str | None) -> None:
        """Scans with a live workflow show whether the WMS can be polled; they are requeued only
        when that flips, so an outage costs one status write per scan, not one per interval."""
        if (error is None) != (self.wms_poll_error is None):
            for key in set(self.store.live_workflows.values()):
                self.queue.add(key)
        self.wms_poll_error = error

    async def poll_wms(self) -> None:
        """Two queries for every live workflow: their deactivation and their taskforces. A workflow
        the WMS no longer lists is marked lost (the planner retries or ends its scan). The taskforces
        of workflows deactivated since are read in the same query, once (`LiveScans.final_reads`)."""
        store = self.store
        if self.wms is None or not (store.live_workflows or store.final_reads):
            return
        if self.clock() < self._poll_resume_at:
            return
        ids = sorted(store.live_workflows)
        ended = sorted(store.final_reads.keys() - store.live_workflows.keys())
        try:
            workflows = await self.wms.query_workflows(ids) if ids else []
            taskforces = await self.wms.query_taskforces([*ids, *ended])
        except WMSError as e:
            self.poll_failures += 1
            self._poll_resume_at = self.clock() + poll_backoff(
                self.poll_failures, self.settings.wms_poll_interval_seconds
            )
            log.warning("WMS poll failed (%d in a row): %s", self.poll_failures, e)
            if isinstance(e, WMSUnavailable):
                self.store.outage_at = self.clock()
            self._set_poll_error(str(e))
            return
        self.poll_failures, self._poll_resume_at = 0, 0.0
        self._set_poll_error(None)
        by_workflow: dict[str, list[dict[str, Any]]] = {}
        for tf in taskforces:
            by_workflow.setdefault(tf["workflow_id"], []).append(tf)
        for wf_id in ended:
            if key := store.read_after_end(wf_id, tuple(by_workflow.get(wf_id, ()))):
                self.queue.add(key)
        deactivated = {w["workflow_id"]: w.get("deactivated") for w in workflows}
        self._absent = absences(self._absent, ids, set(deactivated), self.clock())
        for wf_id in ids:
            misses, since = self._absent.get(wf_id, (0, 0.0))
            lost = misses >= LOST_AFTER_POLLS
            if lost and not (self.store.workflows.get(wf_id) or WorkflowView(None)).lost:
                log.warning("WMS workflow %s is lost: the WMS no longer lists it", wf_id)
            view = WorkflowView(
                deactivated.get(wf_id),
                tuple(by_workflow.get(wf_id, ())),
                lost=lost,
                lost_since=since if lost else 0.0,
            )
            if self.store.workflows.get(wf_id) != view:
                self.store.workflows[wf_id] = view
                if key := self.store.live_workflows.get(wf_id):
                    self.queue.add(key)


def absences(
    before: dict[str, tuple[int, float]], polled: list[str], listed: set[str], now: float
) -> dict[str, tuple[int, float]]:
    """For each polled workflow the WMS did not list: how many successful polls in a row it was
    absent from, and since when (pure)."""
    return {
        wf: (before.get(wf, (0, now))[0] + 1, before.get(wf, (0, now))[1])
        for wf in polled
        if wf not in listed
    }


def poll_backoff(failures: int, interval: float) -> float:
    """How long after the `failures`-th failed poll in a row the next one waits, beyond its interval."""
    cap = max(interval, POLL_BACKOFF_MAX_SECONDS)
    return min(interval * 2.0 ** (failures - 1), cap) - interval


def settled(record: ScanRecord) -> bool:
    """Nothing left to do for the scan until it changes: terminal, and its Job (if any) ended."""
    return record.is_terminal and record.job_state in (None, *ENDED_JOB_STATES)
