"""Scan events delivered to subscribers' webhooks: at least once, in order per subscription, signed.

The events are the scans' transitions: each time the operator writes a scan's state, it records it in
the Scan's `status.transitions` when it differs from the last one recorded (`Draft.stated`), so an event
is on record, in the Scan, before anything tries to deliver it. Every Scan watch event passes through
`on_scan`, which does nothing unless the scan's last transition is new; a new one is offered to the
subscriptions that may want that scan (an index by scan id). Each subscription's `Courier`, the one
writer of its status:

1. queues the transitions it wants that it has not delivered (`status.announced`: each scan's last
   transition done) and that were recorded after the subscription was made, in the order recorded;
2. delivers the queue's head, signed: a CloudEvent over HTTP POST, no redirect followed, the answer's
   size and time bounded, the receiver's address checked where the connection is made;
3. a 2xx takes the head off; a failure is tried again after a delay that doubles per attempt
   (`BACKOFF_*`), until the event is `webhook_retry_seconds` old, when it is given up. The head blocks
   what follows it: a subscription's events arrive in the order they were recorded.

Its status (the scans done, the last delivery, the tallies) is written at once after a failure or a
give-up, and `DONE_WRITE_DELAY` after a delivery (with the ones that follow): one write per subscription
per delivery would be more than an API server takes at a thousand subscriptions. An operator that dies
meanwhile, or its standby taking over, finds the same transitions on the Scans and delivers again what
the status does not show done, with the same ids (`subscription.event_id`). A transition is kept on
its Scan (the last `MAX_TRANSITIONS`) while the Scan is in the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import functools
import ipaddress
import logging
import math
import pickle
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from skyscan import conditions as cond
from skyscan import manifest
from skyscan import subscription as sub
from skyscan.io import kube
from skyscan.io.kube_errors import NotFound, is_outage
from skyscan.io.kube_errors import Refused as ApiRefused
from skyscan.scan_record import ScanRecord
from skyscan_operator import metrics
from skyscan_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 300.0  # seconds between attempts at one event: doubling, capped
JSON_PATCH = "application/json-patch+json"
ANSWER_BYTES = 64 << 10  # of a receiver's answer, read at most (then the connection is dropped)
WRITE_RETRY_SECONDS = 5.0  # a status write that failed is tried again after this
# Deliveries are written to the status this long after the first of them, together: not one write each.
# An operator that dies meanwhile delivers them again (same ids).
DONE_WRITE_DELAY = 15.0
# Subscriptions' status writes, all couriers together, one at a time and at most this many a second: a
# thousand at once would hold the API server from the Scans' writes, which record the transitions, and
# from the watch events that bring them here. A write waiting its turn delays no delivery.
STATUS_WRITES_PER_SECOND = 50.0
SECRETS_KEPT_SECONDS = 30.0  # the webhook Secret is read again after this (a secret rotated is seen)
Key = tuple[str, str]  # (namespace, name)


class Refused(Exception):
    """A destination the deployment does not allow (its host, or the address it resolved to)."""


class CheckedResolver(AbstractResolver):
    """Names resolved as usual, then each address checked (`Destinations.address_refusal`): the
    connection is made only to an address that passed, so a name that resolves to a private or
    metadata address, now or after a change of its records, is refused where it is used."""

    def __init__(self, destinations: sub.Destinations) -> None:
        self.destinations = destinations
        self._resolver = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        allowed = [r for r in found if self.destinations.address_refusal(r["host"]) is None]
        if not allowed:
            raise Refused(
                self.destinations.address_refusal(found[0]["host"]) if found else f"{host} has no address"
            )
        return allowed

    async def close(self) -> None:
        await self._resolver.close()


def event_data(scan: dict[str, Any], record: ScanRecord) -> dict[str, Any]:
    """What a CloudEvent carries but the state it announces: the scan's status and its manifest's key
    fields (the scan id alone for a spec the operator failed as InvalidSpec: it has no manifest)."""
    try:
        found = manifest.of(scan)
    except ValueError:
        return {"scan_id": record.name}
    return {
        "scan_id": record.name,
        "is_deleted": record.deleted,
        "wms_deactivated": record.deactivated,
        "scan_complete": record.has_final_result,
        "manifest": {
            **{k: found[k] for k in ("timestamp", "priority", "classifiers", "event_metadata")},
            "progress": {
                "summary": (found["progress"] or {}).get("summary", "")
            },  # its words, not its tallies
        },
    }


class Entered(NamedTuple):
    """One of a scan's transitions (`status.transitions`)."""

    seq: int
    state: str
    at: float


@dataclass
class Seen:
    """A scan as the subscriptions match it: its classifiers and its transitions. Kept for every scan,
    so held packed (`pack`): as objects, 10,000 scans held ~9 MiB, with no subscription at all."""

    classifiers: dict[str, Any]
    transitions: tuple[Entered, ...]

    def pack(self) -> bytes:
        return pickle.dumps((self.classifiers, tuple(map(tuple, self.transitions))), pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def unpack(packed: bytes) -> Seen:
        classifiers, transitions = pickle.loads(packed)
        return Seen(classifiers, tuple(Entered(*t) for t in transitions))


@dataclass
class Courier:
    """One subscription: its spec and status (the operator is the only writer of the status), the
    events queued for it, and the task that delivers them."""

    key: Key
    uid: str
    generation: int | None  # of the spec held
    created: float  # Unix seconds: transitions recorded before are not news
    spec: sub.SubscriptionSpec
    status: sub.SubscriptionStatus
    queue: list[sub.PendingEvent] = field(default_factory=list)  # in the order recorded
    queued: dict[str, int] = field(default_factory=dict)  # a scan's last transition in the queue
    forgotten: set[str] = field(default_factory=set)  # scans gone from the cluster: no longer announced
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    last_sent: float = 0.0
    written: bool = False  # its status written since it was first seen (kubectl shows it taken up)
    unwritten_since: float | None = None  # the first delivery its status does not show yet
    writing: asyncio.Task[None] | None = None  # its deliveries being written, beside new ones
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one status write at a time, the latest

    def writing_now(self) -> bool:
        return self.writing is not None and not self.writing.done()

    def tasks(self) -> list[asyncio.Task[None]]:
        return [t for t in (self.task, self.writing) if t is not None]

    def offer(self, scan_id: str, seen: Seen, data: Callable[[], dict[str, Any]] | None = None) -> None:
        """Queue the scan's transitions it wants and has not delivered; `data` gives the events' data
        from the Scan at hand (else it is read when the event is delivered)."""
        if not sub.wants_scan(self.spec, scan_id, seen.classifiers):
            return
        after = max(self.status.announced.get(scan_id, 0), self.queued.get(scan_id, 0))
        for t in seen.transitions:
            if t.seq <= after or t.at < self.created:
                continue
            if sub.wants_state(self.spec.states, t.state):
                self.queued[scan_id] = t.seq
                event = sub.PendingEvent(
                    id=sub.event_id(self.uid, scan_id, t.seq), scan_id=scan_id, seq=t.seq, state=t.state,
                    time=t.at, data=None if data is None else {**data(), "scan_state": t.state},
                )  # fmt: skip
                bisect.insort(self.queue, event, key=lambda e: (e.time, e.scan_id, e.seq))
                self.wake.set()

    def done(self, head: sub.PendingEvent) -> None:
        self.queue.remove(head)
        if self.queued.get(head.scan_id) == head.seq:  # none of the scan's left in the queue
            del self.queued[head.scan_id]
        self.status.announced[head.scan_id] = max(self.status.announced.get(head.scan_id, 0), head.seq)


class Webhooks:
    def __init__(
        self, api: kube.Kube, settings: OperatorSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self.api, self.settings, self.clock = api, settings, clock
        self.destinations = settings.webhook_destinations()
        self.couriers: dict[Key, Courier] = {}
        # The couriers that may want a scan's events, by (namespace, scan id): a subscription naming
        # scans is under each, one naming none under (namespace, ""). A change looks at these alone.
        self._watching: dict[Key, set[Key]] = {}
        # Every scan in the cluster, packed (`Seen.pack`), by namespace then scan id (no key tuple per scan)
        self._seen: dict[str, dict[str, bytes]] = {}
        self._secrets: dict[str, tuple[float, dict[str, str]]] = {}  # namespace -> (read when, its data)
        self._session: aiohttp.ClientSession | None = None
        self._chores: set[asyncio.Task[None]] = set()  # keys being taken out of the webhook Secret
        self._writing = asyncio.Lock()
        self._next_write = 0.0  # monotonic seconds: the earliest the next status write may go

    # --- fed by the watch events ---
    def on_scan(self, event_type: str | None, body: dict[str, Any]) -> None:
        # interned, as the store's keys (`live_scans.key_of`): one copy of each name, not one here too
        namespace, name = sys.intern(body["metadata"]["namespace"]), sys.intern(body["metadata"]["name"])
        if event_type == "DELETED":
            self._seen.get(namespace, {}).pop(name, None)
            for courier in self._of(namespace):
                if name in courier.status.announced:
                    courier.forgotten.add(name)
                    courier.wake.set()
            return
        record = ScanRecord(body)
        transitions = tuple(Entered(t.seq, t.state, t.at) for t in record.transitions())
        known = self.seen(namespace, name)
        if not transitions or (known is not None and known.transitions[-1] == transitions[-1]):
            return
        seen = Seen(dict(record.classifiers), transitions)
        self._seen.setdefault(namespace, {})[name] = seen.pack()
        data = functools.cache(lambda: event_data(body, record))  # made once, if a courier wants it
        for at in ((namespace, name), (namespace, "")):
            for key in self._watching.get(at, ()):
                self.couriers[key].offer(name, seen, data)

    def on_subscription(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        courier = self.couriers.get(key)
        same = courier if courier is not None and courier.uid == meta["uid"] else None
        if same and event_type != "DELETED" and same.generation == meta.get("generation"):
            return  # its status written (by its courier): the spec held is current
        if event_type == "DELETED":
            if courier is not None:
                self._unindex(self.couriers.pop(key))
                for task in courier.tasks():
                    task.cancel()
                if courier.spec.secret_ref.key == key[1]:  # its own key (REST names it so): gone with it
                    self._chores.add(asyncio.create_task(self._drop_key(key[0], key[1])))
            return
        try:
            spec = sub.spec_of(body)
        except ValueError as e:
            log.warning("subscription %s/%s ignored: invalid spec: %s", *key, e)
            return
        if same:
            self._unindex(same)
            same.spec, same.generation = spec, meta.get("generation")  # the status held is the newest
            self._index(same)
            if spec.secret:
                same.wake.set()
            return
        if courier is not None:  # made again under its name: the old one's courier goes
            self._unindex(courier)
            for task in courier.tasks():
                task.cancel()
        status = sub.status_of(body) or sub.SubscriptionStatus()
        created = cond.epoch(meta.get("creationTimestamp")) or self.clock()
        courier = Courier(key, meta["uid"], meta.get("generation"), created, spec, status)
        self.couriers[key] = courier
        self._index(courier)
        if spec.scan_ids:  # a look at each scan it names, not at every scan
            known = ((name, self.seen(key[0], name)) for name in spec.scan_ids)
        else:
            known = ((name, Seen.unpack(packed)) for name, packed in list(self._seen.get(key[0], {}).items()))
        for name, seen in known:
            if seen is not None:  # what it has not delivered (this operator restarted, or another held it)
                courier.offer(name, seen)
        courier.wake.set()
        courier.task = asyncio.create_task(self._run(courier), name=f"webhooks-{key[1]}")

    def seen(self, namespace: str, name: str) -> Seen | None:
        """The scan as last seen (None: not seen, or gone)."""
        packed = self._seen.get(namespace, {}).get(name)
        return None if packed is None else Seen.unpack(packed)

    def _of(self, namespace: str) -> list[Courier]:
        return [c for (ns, _), c in self.couriers.items() if ns == namespace]

    def _index(self, courier: Courier) -> None:
        for scan_id in courier.spec.scan_ids or [""]:
            self._watching.setdefault((courier.key[0], scan_id), set()).add(courier.key)

    def _unindex(self, courier: Courier) -> None:
        for scan_id in courier.spec.scan_ids or [""]:
            at = (courier.key[0], scan_id)
            if (keys := self._watching.get(at)) is not None:
                keys.discard(courier.key)
                if not keys:
                    del self._watching[at]

    async def stop(self) -> None:
        tasks = [t for c in self.couriers.values() for t in c.tasks()] + list(self._chores)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session:
            await self._session.close()

    # --- one subscription's courier ---
    async def _run(self, courier: Courier) -> None:
        backoff = BACKOFF_FIRST
        while True:
            try:
                if courier.spec.secret:  # handed over in the spec: into the webhook Secret first
                    await self._take_secret(courier)
                if courier.forgotten or not courier.written:
                    await self._write(courier)
                if not courier.queue:
                    courier.wake.clear()
                    if courier.unwritten_since is None or courier.writing_now():
                        await courier.wake.wait()  # a write ending with deliveries left unwritten wakes it
                        continue
                    with contextlib.suppress(TimeoutError):  # written with the next deliveries, or alone
                        await asyncio.wait_for(courier.wake.wait(), self._write_in(courier))
                    self._write_soon(courier)
                    continue
                head = courier.queue[0]
                if self.clock() - head.time > self.settings.webhook_retry_seconds:
                    courier.done(head)
                    courier.status.given_up += 1
                    metrics.WEBHOOK_GIVE_UPS.inc()
                    self._note(courier, head, f"gave up after {head.attempts} attempts")
                    await self._write(courier)
                    continue
                if head.data is None:  # offered when this operator took the subscription up
                    head.data = await self._read_data(courier.key[0], head)
                await self._pace(courier)
                outcome = await self._deliver(courier, head)
                head.attempts += 1
                if outcome is None:
                    courier.done(head)
                    courier.status.delivered += 1
                    metrics.WEBHOOK_DELIVERIES.labels("delivered").inc()
                    metrics.WEBHOOK_LATENCY.observe(max(0.0, self.clock() - head.time))
                    self._note(courier, head, "delivered")
                    backoff = BACKOFF_FIRST
                    if courier.unwritten_since is None:
                        courier.unwritten_since = self.clock()
                    self._write_soon(courier)
                    continue
                courier.status.failures += 1
                metrics.WEBHOOK_DELIVERIES.labels("failed").inc()
                self._note(courier, head, outcome)
                await self._write(courier)
                metrics.WEBHOOK_RETRIES.inc()
                await asyncio.sleep(backoff)  # a deleted subscription cancels the wait
                backoff = min(backoff * 2, BACKOFF_MAX)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a status write that failed: the outbox stays as recorded
                level = logging.WARNING if is_outage(e) or isinstance(e, NotFound) else logging.ERROR
                log.log(
                    level,
                    "subscription %s/%s: %r; trying again",
                    *courier.key,
                    e,
                    exc_info=level == logging.ERROR,
                )
                await asyncio.sleep(WRITE_RETRY_SECONDS)

    async def _take_secret(self, courier: Courier) -> None:
        """The secret handed over in the spec stored as its key of the webhook Secret, then removed from
        the spec (only while it is still that secret): the shim, which reads subscriptions, cannot
        read it from then on."""
        namespace, name = courier.key
        secret = courier.spec.secret or ""
        try:
            sub.signing_key(secret)
        except ValueError as e:
            log.warning(
                "subscription %s/%s: its handed-over secret is no signing secret: %s", namespace, name, e
            )
        else:
            data = {courier.spec.secret_ref.key: base64.b64encode(secret.encode()).decode()}
            path = kube.core_path("secrets", namespace, sub.SECRET_NAME)
            await self.api.request("PATCH", path, body={"data": data}, content_type=kube.MERGE_PATCH)
            self._secrets.pop(namespace, None)  # read again at the next delivery
        spec_path = kube.path(sub.API_VERSION, sub.PLURAL, namespace, name)
        taken = [
            {"op": "test", "path": "/spec/secret", "value": secret},
            {"op": "remove", "path": "/spec/secret"},
        ]
        with contextlib.suppress(ApiRefused, NotFound):  # changed or gone meanwhile: its next event says how
            await self.api.request("PATCH", spec_path, body=taken, content_type=JSON_PATCH)
        courier.spec = courier.spec.model_copy(update={"secret": None})

    async def _drop_key(self, namespace: str, key: str) -> None:
        path = kube.core_path("secrets", namespace, sub.SECRET_NAME)
        try:
            await self.api.request("PATCH", path, body={"data": {key: None}}, content_type=kube.MERGE_PATCH)
        except Exception as e:  # left there: harmless without its subscription
            log.warning("the key %s of %s/%s could not be removed: %r", key, namespace, sub.SECRET_NAME, e)
        finally:
            if (task := asyncio.current_task()) is not None:
                self._chores.discard(task)

    def _note(self, courier: Courier, head: sub.PendingEvent, result: str) -> None:
        courier.status.last_delivery = sub.LastDelivery(
            event_id=head.id, scan_id=head.scan_id, state=head.state, at=self.clock(), attempts=head.attempts,
            result=result,
        )  # fmt: skip

    def _write_in(self, courier: Courier) -> float:
        """Seconds until the deliveries its status does not show are written."""
        since = courier.unwritten_since
        return math.inf if since is None else since + DONE_WRITE_DELAY - self.clock()

    def _write_soon(self, courier: Courier) -> None:
        """Its deliveries written once they are due, while it delivers the next ones: the write may
        wait its turn (`STATUS_WRITES_PER_SECOND`)."""
        if self._write_in(courier) <= 0 and not courier.writing_now():
            courier.writing = asyncio.create_task(self._write_aside(courier))

    async def _write_aside(self, courier: Courier) -> None:
        try:
            await self._write(courier)
        except Exception as e:  # written with the next ones
            log.warning("subscription %s/%s: its status not written: %r", *courier.key, e)
        finally:
            if courier.unwritten_since is not None:  # deliveries since it began, or it failed
                courier.wake.set()

    async def _write(self, courier: Courier) -> None:
        """The status as held here, whole (a merge patch: the API server's cheapest write; the operator
        is the status's one writer), the forgotten scans taken out of `announced`."""
        async with courier.lock:  # the latest status taken once the write before it is answered
            forgotten = set(courier.forgotten)
            status = courier.status
            for name in forgotten:
                status.announced.pop(name, None)
            status.backlog = len(courier.queue)
            wire = status.to_kube()
            wire["announced"] = {**wire["announced"], **dict.fromkeys(forgotten)}
            path = kube.path(sub.API_VERSION, sub.PLURAL, *courier.key, "status")
            since, courier.unwritten_since = courier.unwritten_since, None  # later ones: the next write
            try:
                async with self._writing:
                    await asyncio.sleep(self._next_write - time.monotonic())
                    self._next_write = time.monotonic() + 1 / STATUS_WRITES_PER_SECOND
                    await self.api.read("PATCH", path, body={"status": wire}, content_type=kube.MERGE_PATCH)
            except BaseException:
                courier.unwritten_since = min(
                    (t for t in (since, courier.unwritten_since) if t is not None), default=None
                )
                raise
            courier.written = True
            courier.forgotten -= forgotten

    async def _pace(self, courier: Courier) -> None:
        gap = 1.0 / self.settings.webhook_rate_per_second - (self.clock() - courier.last_sent)
        if gap > 0:
            await asyncio.sleep(gap)
        courier.last_sent = self.clock()

    async def _read_data(self, namespace: str, event: sub.PendingEvent) -> dict[str, Any]:
        """An event's data from its Scan as it is now (the scan id and state alone once it is gone)."""
        try:
            scan = await self.api.request("GET", kube.scan_path(namespace, event.scan_id))
        except NotFound:
            return {"scan_id": event.scan_id, "scan_state": event.state}
        return {**event_data(scan, ScanRecord(scan)), "scan_state": event.state}

    async def _deliver(self, courier: Courier, head: sub.PendingEvent) -> str | None:
        """None once the receiver took the event; else what went wrong."""
        url = courier.spec.url
        if refusal := self.destinations.url_refusal(url):
            return f"refused: {refusal}"
        try:
            key = await self._signing_key(courier.key[0], courier.spec.secret_ref.key)
            host = URL(url).host or ""
            with contextlib.suppress(ValueError):  # a literal address is not resolved: checked here
                ipaddress.ip_address(host.strip("[]"))
                if refusal := self.destinations.address_refusal(host.strip("[]")):
                    return f"refused: {refusal}"
            body = sub.cloud_event(courier.key[0], head)
            headers = {
                "Content-Type": "application/cloudevents+json",
                **sub.signature_headers(key, head.id, int(self.clock()), body),
            }
            timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout_seconds)
            async with self._client().post(
                url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            ) as answer:
                await answer.content.read(ANSWER_BYTES)
                if 200 <= answer.status < 300:
                    return None
                if 300 <= answer.status < 400:
                    return f"HTTP {answer.status}: redirects are not followed"
                return f"HTTP {answer.status}"
        except Refused as e:
            return f"refused: {e}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            return f"no answer: {type(e).__name__}"
        except (LookupError, ValueError) as e:
            return f"no signing secret: {e}"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(resolver=CheckedResolver(self.destinations), limit=100)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def _signing_key(self, namespace: str, name: str) -> bytes:
        """The key of subscription secret `name`, from the one webhook Secret (read at most every
        `SECRETS_KEPT_SECONDS`, and again at once for a key it did not have)."""
        for fresh in (False, True):
            kept = self._secrets.get(namespace)
            if fresh or kept is None or self.clock() - kept[0] > SECRETS_KEPT_SECONDS:
                path = kube.core_path("secrets", namespace, sub.SECRET_NAME)
                kept = self._secrets[namespace] = (
                    self.clock(),
                    (await self.api.request("GET", path)).get("data") or {},
                )
            if (encoded := kept[1].get(name)) is not None:
                return sub.signing_key(base64.b64decode(encoded).decode())
        raise LookupError(f"{sub.SECRET_NAME} has no key {name}")
