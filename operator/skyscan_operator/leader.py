"""The operator's Lease, read and written: stand by until this replica holds it, then keep it.

`lease` decides; this module does the I/O through `skyscan.io.kube`. A replica that loses the Lease (a
renewal failed until the renew deadline, or the Lease names another holder) ends its process at once
with `EXIT_LEASE_LOST`, whatever it is doing: Kubernetes restarts it as a standby. Stopping the
operator's tasks gracefully instead could let them act on after a standby took over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from skyscan.io import kube
from skyscan.io.kube_errors import TRANSPORT_ERRORS, Conflict, KubeError, NotFound
from skyscan_operator import lease
from skyscan_operator.settings import OperatorSettings

log = logging.getLogger(__name__)
EXIT_LEASE_LOST = 3


def identity_of(settings: OperatorSettings) -> str:
    return settings.lease_identity or f"{socket.gethostname()}-{os.getpid()}"


def problem(e: BaseException) -> str:
    return f"{e} {e.message}" if isinstance(e, KubeError) else f"API server unreachable ({e!r})"


def lose(reason: str) -> NoReturn:
    """End the process now: no task of this replica may act once another may hold the Lease."""
    log.error("lost the operator's Lease (%s): exiting to stand by again", reason)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LEASE_LOST)


class Deadline:
    """Calls `expire` once `clock()` passes the deadline, unless it was moved on or cancelled before.

    It waits in a thread of its own, so an event loop kept busy (a large listing being parsed) cannot
    delay the holder's stop past the moment a standby may take over."""

    def __init__(self, at: float, expire: Callable[[str], object], clock: Callable[[], float]) -> None:
        self._at, self._expire, self._clock = at, expire, clock
        self._cancelled = False
        self._wake = threading.Condition()
        threading.Thread(target=self._run, name="lease-deadline", daemon=True).start()

    def extend(self, at: float) -> None:
        with self._wake:  # the thread, waiting for the earlier deadline, looks again when it passes
            self._at = max(self._at, at)

    def cancel(self) -> None:
        with self._wake:
            self._cancelled = True
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while not self._cancelled and (left := self._at - self._clock()) > 0:
                self._wake.wait(left)
            if not self._cancelled:
                self._expire("not renewed in time")


class Leadership:
    """This replica's side of the Lease named by the settings."""

    def __init__(
        self,
        api: kube.Kube,
        settings: OperatorSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        lost: Callable[[str], object] = lose,
    ) -> None:
        self.api, self.clock, self.lost = api, clock, lost
        self.identity = identity_of(settings)
        self.timing = lease.Timing(settings.lease_duration_seconds, settings.lease_renew_seconds)
        self.name, self.namespace = settings.lease_name, settings.lease_namespace or settings.namespace
        self.path = kube.path(lease.API_VERSION, "leases", self.namespace, self.name)
        self.where = f"{self.namespace}/{self.name}"
        self.lease: dict[str, Any] | None = None  # as this replica last read or wrote it

    async def _read(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.api.request(
                "GET", self.path, timeout=self.timing.renew_interval
            )
        except NotFound:
            return None
        return found

    async def _hold(self, current: dict[str, Any] | None) -> dict[str, Any]:
        """Create or replace the Lease with this replica holding it (409 when it changed since read)."""
        body = lease.held(current, self.name, self.namespace, self.identity, self.timing, datetime.now(UTC))
        if current is None:
            method, where = "POST", kube.path(lease.API_VERSION, "leases", self.namespace)
        else:
            method, where = "PUT", self.path
        written: dict[str, Any] = await self.api.request(
            method, where, body=body, timeout=self.timing.renew_interval
        )
        return written

    async def acquire(self) -> float:
        """Stand by until this replica holds the Lease; returns when (its clock) the read that led to
        the winning write began, the moment its renew deadline counts from."""
        seen: lease.Seen | None = None
        log.info("standing by for Lease %s as %s", self.where, self.identity)
        while True:
            began = self.clock()
            try:
                current = await self._read()
                seen = lease.seen(current, seen, began)
                if lease.decide(seen, self.identity, began) is not lease.Move.WAIT:
                    self.lease = await self._hold(current)
                    was = (seen and seen.holder) or "nobody"
                    log.info("holding Lease %s as %s (held by %s)", self.where, self.identity, was)
                    return began
            except Conflict:
                pass  # another wrote it first
            except (KubeError, *TRANSPORT_ERRORS) as e:
                log.warning("standing by for Lease %s: %s", self.where, problem(e))
            await asyncio.sleep(self.timing.renew_interval)

    async def keep(self, renewed: float) -> None:
        """Renew the Lease every interval until cancelled; lose it (see `lose`) when no renewal has
        succeeded for the renew deadline, or the Lease names another holder."""
        deadline = Deadline(renewed + self.timing.renew_deadline, self.lost, self.clock)
        try:
            while True:
                await asyncio.sleep(self.timing.renew_interval)
                began = self.clock()
                try:
                    await self._renew()
                    deadline.extend(began + self.timing.renew_deadline)
                except (KubeError, *TRANSPORT_ERRORS) as e:
                    log.warning("renewing Lease %s: %s", self.where, problem(e))
        except asyncio.CancelledError:  # a clean shutdown; any other end leaves the deadline running
            deadline.cancel()
            raise

    async def _renew(self) -> None:
        try:
            self.lease = await self._hold(self.lease)
        except (NotFound, Conflict):
            current = await self._read()  # changed, or gone, since this replica wrote it
            holder = lease.holder_of(current) if current else "nobody: it was deleted"
            if holder != self.identity:
                self.lost(f"now held by {holder}")
                return
            self.lease = await self._hold(current)  # still ours (someone edited it): from its version

    async def release(self) -> None:
        """Let the Lease go (a clean shutdown, once nothing acts any more): a standby takes it at once."""
        if self.lease is None or lease.holder_of(self.lease) != self.identity:
            return
        try:
            await self.api.request(
                "PUT", self.path, body=lease.released(self.lease, datetime.now(UTC)),
                timeout=self.timing.renew_interval,
            )  # fmt: skip
            log.info("released Lease %s", self.where)
        except (KubeError, *TRANSPORT_ERRORS) as e:  # a standby takes it over once it expires
            log.warning("releasing Lease %s: %s", self.where, problem(e))
