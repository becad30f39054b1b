"""Kubernetes Events about Scans (what `kubectl describe scan` shows), posted in the background."""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
from typing import Any, NamedTuple

from skyscan import logs, model
from skyscan.conditions import iso
from skyscan.io import kube
from skyscan.io.kube_errors import TRANSPORT_ERRORS, KubeError

log = logging.getLogger(__name__)
COMPONENT = "skyscan-operator"


def event_body(scan: dict[str, Any], type_: str, reason: str, message: str, now: float) -> dict[str, Any]:
    meta = scan["metadata"]
    return {
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": iso(now),
        "lastTimestamp": iso(now),
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }


async def send_event(api: kube.Kube, body: dict[str, Any]) -> None:
    """Post one Event (`event_body`); a failure only logs: an Event tells, nothing depends on it."""
    try:
        await api.request("POST", kube.core_path("events", body["metadata"]["namespace"]), body=body)
    except (KubeError, *TRANSPORT_ERRORS) as e:
        name = body["involvedObject"]["name"]
        log.warning("could not post event %s for %s: %s", body["reason"], name, e, extra=logs.about(name))


class Pending(NamedTuple):
    """An Event waiting to be posted, as little as makes its body (built when sent): ~130 B against
    ~1.1 KB as a body, and a backlog of 10,000 (every waiting scan's `Queued` at once) is common. Its
    strings are interned: the scan's name and namespace and a message many scans share are held once."""

    namespace: str
    name: str
    uid: str
    type_: str
    reason: str
    message: str
    at: float

    @classmethod
    def of(cls, scan: dict[str, Any], type_: str, reason: str, message: str, at: float) -> Pending:
        meta, i = scan["metadata"], sys.intern
        return cls(i(meta["namespace"]), i(meta["name"]), meta["uid"], type_, reason, i(message[:1024]), at)

    def body(self) -> dict[str, Any]:
        scan = {"metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid}}
        return event_body(scan, self.type_, self.reason, self.message, self.at)


class EventPoster:
    """A queue drained by one task, so reconciles never wait on Events and failures only log."""

    def __init__(self, api: kube.Kube, maxsize: int = 10_000) -> None:
        self._api = api
        self._queue: asyncio.Queue[Pending] = asyncio.Queue(maxsize)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="skyscan-events")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def post(self, scan: dict[str, Any], type_: str, reason: str, message: str, now: float) -> None:
        namespace, name = scan["metadata"]["namespace"], scan["metadata"]["name"]
        log.info("%s/%s %s: %s", namespace, name, reason, message, extra=logs.about(name))
        try:
            self._queue.put_nowait(Pending.of(scan, type_, reason, message, now))
        except asyncio.QueueFull:
            log.warning("event queue full; dropped %s", reason, extra=logs.about(name))

    async def _run(self) -> None:
        while True:
            await send_event(self._api, (await self._queue.get()).body())
