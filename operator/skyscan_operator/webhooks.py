"""Scan events delivered to subscribers' webhooks: at least once, in order per subscription, signed.

Every Scan watch event passes through `on_scan`, which does nothing unless the scan's `scan_state`
changed since it was last seen. A change is offered to each subscription of the namespace that wants
that scan and state and has not put it on record yet (`status.announced`); the subscription's
`Courier`, the one writer of its status, then:

1. records the event in `status.pending` (the outbox) in one write, before any attempt: an operator
   that dies from here on leaves it on record, and the next leader (or this one, restarted) carries on
   from there with the same event id;
2. delivers the outbox's head, signed: a CloudEvent over HTTP POST, no redirect followed, the answer's
   size and time bounded, the receiver's address checked where the connection is made;
3. records the outcome: a 2xx takes the head off the outbox (written with the next events recorded, or
   `DONE_WRITE_DELAY` later); a failure is tried again after a delay that doubles per attempt
   (`BACKOFF_*`), until the event is `webhook_retry_seconds` old, when it is given up. The head blocks
   what follows it: a subscription's events arrive in the order they were seen.

A scan that passes through several states while no operator runs is announced in the state it is in
when one runs again: a subscription taken up before (all of them, when an operator starts) is offered
the states of the scans known, and delivers those it has not announced. A new subscription starts from
now: the states scans are in already are noted as announced, not delivered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

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
# A delivery is written to the status with the next events put on record, or this long after it when no
# more come: one write per event, not two. An operator that dies meanwhile delivers it again (same id).
DONE_WRITE_DELAY = 15.0
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


def event_data(scan: dict[str, Any], record: ScanRecord, state: str) -> dict[str, Any]:
    """What a CloudEvent carries: the scan's status (`state`, already read) and its manifest's key fields."""
    found = manifest.of(scan)
    return {
        "scan_id": record.name,
        "scan_state": state,
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


@dataclass
class Seen:
    """A scan as the subscriptions match it: its state, its classifiers and the event's data."""

    state: str
    classifiers: dict[str, Any]
    data: dict[str, Any]
    version: str  # the Scan's resourceVersion where the state was seen


@dataclass
class Courier:
    """One subscription: its spec and status (the operator is the only writer of the status), the
    events waiting to go on record, and the task that records and delivers them."""

    key: Key
    uid: str
    generation: int | None  # of the spec held
    spec: sub.SubscriptionSpec
    status: sub.SubscriptionStatus
    inbox: list[sub.PendingEvent] = field(default_factory=list)
    forgotten: set[str] = field(default_factory=set)  # scans gone from the cluster: no longer announced
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    last_sent: float = 0.0
    written: bool = False  # its status written since it was first seen (kubectl shows it taken up)
    delivered_unwritten: bool = False  # deliveries its status does not show yet

    def wants(self, scan_id: str, seen: Seen) -> bool:
        return sub.wants_state(self.spec.states, seen.state) and sub.wants_scan(
            self.spec, scan_id, seen.classifiers
        )

    def offer(self, scan_id: str, seen: Seen, now: float) -> None:
        if not self.wants(scan_id, seen):
            return
        recorded = self.status.announced.get(scan_id)
        queued = next((e.state for e in reversed(self.inbox) if e.scan_id == scan_id), None)
        if (queued or recorded) == seen.state:
            return
        event_id = sub.event_id(self.uid, scan_id, seen.state, seen.version)
        self.inbox.append(
            sub.PendingEvent(id=event_id, scan_id=scan_id, state=seen.state, time=now, data=seen.data)
        )
        self.wake.set()


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
        self.seen: dict[Key, Seen] = {}  # every scan in the cluster, by (namespace, scan id)
        self._secrets: dict[str, tuple[float, dict[str, str]]] = {}  # namespace -> (read when, its data)
        self._session: aiohttp.ClientSession | None = None
        self._chores: set[asyncio.Task[None]] = set()  # keys being taken out of the webhook Secret

    # --- fed by the watch events ---
    def on_scan(self, event_type: str | None, body: dict[str, Any]) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if event_type == "DELETED":
            self.seen.pop((namespace, name), None)
            for courier in self._of(namespace):
                if name in courier.status.announced:
                    courier.forgotten.add(name)
                    courier.wake.set()
            return
        record = ScanRecord(body)
        state = record.scan_state
        known = self.seen.get((namespace, name))
        if known is not None and known.state == state:
            return
        version = str(body["metadata"].get("resourceVersion", ""))
        try:
            data = event_data(body, record, state)
        except ValueError:  # a spec the operator fails as InvalidSpec has no manifest: its state still counts
            data = {"scan_id": name, "scan_state": state}
        seen = self.seen[namespace, name] = Seen(state, dict(record.classifiers), data, version)
        now = self.clock()
        for at in ((namespace, name), (namespace, "")):
            for key in self._watching.get(at, ()):
                self.couriers[key].offer(name, seen, now)

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
                if courier.task:
                    courier.task.cancel()
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
            if courier.task:
                courier.task.cancel()
        status = sub.status_of(body)
        new = status is None  # never taken up: it starts from now
        status = status or sub.SubscriptionStatus()
        courier = self.couriers[key] = Courier(key, meta["uid"], meta.get("generation"), spec, status)
        self._index(courier)
        now = self.clock()
        if spec.scan_ids:  # a look at each scan it names, not at every scan
            known = ((name, self.seen.get((key[0], name))) for name in spec.scan_ids)
        else:
            known = ((name, seen) for (namespace, name), seen in self.seen.items() if namespace == key[0])
        for name, seen in known:
            if seen is None:
                continue
            if not new:  # taken up before (this operator restarted, or another held it): what it missed
                courier.offer(name, seen, now)
            elif courier.wants(name, seen):  # the states scans are in already are not news
                courier.status.announced[name] = seen.state
        courier.wake.set()
        courier.task = asyncio.create_task(self._run(courier), name=f"webhooks-{key[1]}")

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
        tasks = [c.task for c in self.couriers.values() if c.task] + list(self._chores)
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
                if courier.inbox or courier.forgotten or not courier.written:
                    await self._record(courier)
                if not courier.status.pending:
                    courier.wake.clear()
                    if courier.inbox or courier.forgotten:
                        continue
                    if courier.delivered_unwritten:  # written with the next events, or once none come
                        try:
                            await asyncio.wait_for(courier.wake.wait(), DONE_WRITE_DELAY)
                        except TimeoutError:
                            await self._write(courier)
                        continue
                    await courier.wake.wait()
                    continue
                head = courier.status.pending[0]
                if self.clock() - head.time > self.settings.webhook_retry_seconds:
                    courier.status.pending.pop(0)
                    courier.status.given_up += 1
                    metrics.WEBHOOK_GIVE_UPS.inc()
                    self._note(courier, head, f"gave up after {head.attempts} attempts")
                    await self._write(courier)
                    continue
                await self._pace(courier)
                outcome = await self._deliver(courier, head)
                head.attempts += 1
                if outcome is None:
                    courier.status.pending.pop(0)
                    courier.status.delivered += 1
                    metrics.WEBHOOK_DELIVERIES.labels("delivered").inc()
                    metrics.WEBHOOK_LATENCY.observe(max(0.0, self.clock() - head.time))
                    self._note(courier, head, "delivered")
                    backoff = BACKOFF_FIRST
                    courier.delivered_unwritten = True
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

    async def _record(self, courier: Courier) -> None:
        """The inbox on record (appended to the outbox) and forgotten scans dropped, in one write."""
        taken, forgotten = list(courier.inbox), set(courier.forgotten)
        status = courier.status
        status.pending.extend(taken)
        for event in taken:
            status.announced[event.scan_id] = event.state
        for name in forgotten:
            status.announced.pop(name, None)
        try:
            await self._write(courier, removed=forgotten)
        except BaseException:
            del status.pending[len(status.pending) - len(taken) :]  # not on record: kept in the inbox
            raise
        del courier.inbox[: len(taken)]
        courier.forgotten -= forgotten

    async def _write(self, courier: Courier, removed: Iterable[str] = ()) -> None:
        """The status as held here, whole (a merge patch: the API server's cheapest write; the operator
        is the status's one writer); `removed`: scans dropped from `announced`."""
        courier.status.backlog = len(courier.status.pending)
        namespace, name = courier.key
        status = courier.status.to_kube()
        status["announced"] = {**status["announced"], **dict.fromkeys(removed)}
        path = kube.path(sub.API_VERSION, sub.PLURAL, namespace, name, "status")
        await self.api.read("PATCH", path, body={"status": status}, content_type=kube.MERGE_PATCH)
        courier.written, courier.delivered_unwritten = True, False

    async def _pace(self, courier: Courier) -> None:
        gap = 1.0 / self.settings.webhook_rate_per_second - (self.clock() - courier.last_sent)
        if gap > 0:
            await asyncio.sleep(gap)
        courier.last_sent = self.clock()

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
