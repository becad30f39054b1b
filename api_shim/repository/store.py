"""Writes to Scans: create; unconditional writes of keys only the shim writes; and read-modify-write
updates guarded by resourceVersion, for the checks that must not race.

Every write lands in the cache right away (`ScanCache.observe`), so the same client reads it back,
and its version is noted for the answer (`versions.wrote`: read-your-writes through other replicas).
A write whose new value does not depend on the stored one (a soft-delete flag, `lastUpdated`, the
progress, the result record) carries no resourceVersion: the API server applies it to the current
object, so concurrent writers never conflict. A check-then-write (set-once fields, appending a worker
request) is guarded: on a conflict (someone else wrote in between: the operator, another request,
another shim replica) it re-reads the Scan from the API server and decides again, with jittered
backoff, until its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from api_shim.errors import ApiError, not_found
from api_shim.repository.cache import ScanCache
from api_shim.repository.versions import wrote
from skyscan import model, names
from skyscan.io import kube
from skyscan.io.kube import Kube, scan_path
from skyscan.io.kube_errors import Conflict, NotFound
from skyscan.scan_record import resource_version

Obj = dict[str, Any]
MERGE = kube.MERGE_PATCH
# Every write names the shim as its field manager (the Scan's managedFields say who wrote what).
AS_SHIM = {"fieldManager": names.SHIM_MANAGER}


@dataclass(frozen=True)
class Change:
    """What to write: merge patches for `spec` and for `status` (either may be empty)."""

    spec: Obj | None = None
    status: Obj | None = None


class ScanStore:
    def __init__(self, api: Kube, namespace: str, cache: ScanCache, timeout: float) -> None:
        self._api = api
        self.namespace = namespace
        self.cache = cache
        self._timeout = timeout

    async def create(self, name: str, spec: Obj, timestamp: float) -> Obj:
        body = {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "metadata": {"name": name, "annotations": {names.TIMESTAMP_ANNOTATION: repr(timestamp)}},
            "spec": spec,
        }
        obj: Obj = await self._api.request(
            "POST", scan_path(self.namespace), params=AS_SHIM, body=body, timeout=self._timeout
        )
        self.cache.observe(obj)
        wrote(obj)
        return obj

    async def delete(self, name: str) -> None:
        await self._api.request("DELETE", scan_path(self.namespace, name), timeout=self._timeout)

    async def read(self, name: str) -> Obj:
        return await self._noted(
            self._api.request("GET", scan_path(self.namespace, name), timeout=self._timeout)
        )

    async def _patch(self, name: str, body: Any, *, status: bool) -> Obj:
        path = scan_path(self.namespace, name, "status" if status else None)
        call = self._api.request(
            "PATCH", path, params=AS_SHIM, body=body, content_type=MERGE, timeout=self._timeout
        )
        return await self._written(call)

    async def _written(self, call: Awaitable[Obj]) -> Obj:
        """A write's answer, noted in the cache and as this request's written version."""
        obj = await self._noted(call)
        wrote(obj)
        return obj

    async def _noted(self, call: Awaitable[Obj]) -> Obj:
        """The answer of a read or write of one Scan, noted in the cache; no such Scan is the REST 404."""
        try:
            obj = await call
        except NotFound:
            raise not_found() from None
        self.cache.observe(obj)
        return obj

    async def merge(self, name: str, change: Change) -> Obj:
        """Merge `change` into the Scan as it is now, with no precondition: for keys only the shim
        writes, whose new value does not depend on the stored one."""
        current: Obj | None = None
        if change.spec:
            current = await self._patch(name, {"spec": change.spec}, status=False)
        if change.status:
            current = await self._patch(name, {"status": change.status}, status=True)
        return current if current is not None else self.cache.get(name) or await self.read(name)

    async def replace_progress(self, name: str, progress: Obj) -> Obj:
        """Replace the scanner's progress whole (and move lastUpdated), with no precondition: a
        server-side apply of always these two keys as the shim, so a key the new progress lacks is gone
        (an atomic map in the CRD) and no other key of the status is touched."""
        body = {
            "apiVersion": model.API_VERSION,
            "kind": model.KIND,
            "metadata": {"name": name},
            "status": model.ScanStatus(progress=progress, last_updated=now()).to_patch(),
        }
        path = scan_path(self.namespace, name, "status")
        return await self._written(self._api.apply(path, body, names.SHIM_MANAGER, timeout=self._timeout))

    async def _guarded(self, name: str, change: Change, rv: str) -> Obj:
        current: Obj | None = None
        if change.spec:
            current = await self._patch(
                name, {"spec": change.spec, "metadata": {"resourceVersion": rv}}, status=False
            )
            rv = current["metadata"]["resourceVersion"]
        if change.status:
            current = await self._patch(
                name, {"status": change.status, "metadata": {"resourceVersion": rv}}, status=True
            )
        assert current is not None
        return current

    async def update(self, name: str, decide: Callable[[Obj], Change], budget: float | None = None) -> Obj:
        """Apply `decide(current)` only to the version it saw; `decide` may raise ApiError to refuse.
        On a conflict, decide again on a newer version: the cache's when it already holds one (a write
        through this replica, or the watch, brought it), else a fresh read; with jittered, doubling
        pauses (the contenders spread out) until `budget` seconds (default: the write timeout, at
        least 10 s) have passed."""
        current = self.cache.get(name) or await self.read(name)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(budget if budget is not None else max(self._timeout, 10.0)),
            wait=tenacity.wait_random_exponential(multiplier=0.01, max=0.5),
            retry=tenacity.retry_if_exception_type(Conflict),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        current = await self._newer(name, current)
                    change = decide(current)
                    if not (change.spec or change.status):
                        return current
                    return await self._guarded(name, change, current["metadata"]["resourceVersion"])
        except Conflict:
            pass
        raise ApiError(
            503,
            "too many concurrent updates",
            f"Scan {name} kept changing; try again.",
            headers={"Retry-After": "1"},
        )

    async def _newer(self, name: str, seen: Obj) -> Obj:
        """A version newer than `seen`: the cache's if it holds one, else the API server's."""
        cached = self.cache.get(name)
        if cached is not None and resource_version(cached) > resource_version(seen):
            return cached
        return await self.read(name)


def now() -> float:
    return time.time()
