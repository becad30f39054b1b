"""Writes to Scans: create, and read-modify-write patches guarded by resourceVersion.

Every write lands in the cache right away (`ScanCache.observe`), so the same client reads it back.
A conflict (someone else wrote in between: the operator, another shim replica) re-reads the Scan
from the API server and recomputes the change, so checks such as set-once never race.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api_shim.cache import SCAN, ScanCache
from api_shim.errors import ApiError, not_found
from skyscan import kube, model, names

Obj = dict[str, Any]
MERGE = kube.MERGE_PATCH


@dataclass(frozen=True)
class Change:
    """What to write: merge patches for `spec` and for `status` (either may be empty)."""

    spec: Obj | None = None
    status: Obj | None = None


class ScanStore:
    def __init__(self, api: client.ApiClient, namespace: str, cache: ScanCache, timeout: float) -> None:
        self._objs = client.CustomObjectsApi(api)
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
        obj: Obj = await self._objs.create_namespaced_custom_object(
            **SCAN, namespace=self.namespace, body=body, _request_timeout=self._timeout
        )
        self.cache.observe(obj)
        return obj

    async def delete(self, name: str) -> None:
        await self._objs.delete_namespaced_custom_object(
            **SCAN, namespace=self.namespace, name=name, _request_timeout=self._timeout
        )

    async def read(self, name: str) -> Obj:
        try:
            obj: Obj = await self._objs.get_namespaced_custom_object(
                **SCAN, namespace=self.namespace, name=name, _request_timeout=self._timeout
            )
        except ApiException as e:
            if e.status == 404:
                raise not_found() from None
            raise
        self.cache.observe(obj)
        return obj

    async def _patch(self, name: str, patch: Obj, rv: str, status: bool) -> Obj:
        call = (
            self._objs.patch_namespaced_custom_object_status
            if status
            else self._objs.patch_namespaced_custom_object
        )
        body = {**patch, "metadata": {"resourceVersion": rv}}
        obj: Obj = await call(
            **SCAN,
            namespace=self.namespace,
            name=name,
            body=body,
            _content_type=MERGE,
            _request_timeout=self._timeout,
        )
        self.cache.observe(obj)
        return obj

    async def update(self, name: str, decide: Callable[[Obj], Change], attempts: int = 5) -> Obj:
        """Apply `decide(current)`; `decide` may raise ApiError to refuse. Retries on conflicts."""
        current = self.cache.get(name) or await self.read(name)
        for _ in range(attempts):
            change = decide(current)
            try:
                if change.spec:
                    current = await self._patch(
                        name, {"spec": change.spec}, current["metadata"]["resourceVersion"], False
                    )
                if change.status:
                    current = await self._patch(
                        name, {"status": change.status}, current["metadata"]["resourceVersion"], True
                    )
                return current
            except ApiException as e:
                if e.status == 404:
                    raise not_found() from None
                if e.status != 409:
                    raise
                current = await self.read(name)
        raise ApiError(503, "too many concurrent updates", f"Scan {name} kept changing; try again.")


def now() -> float:
    return time.time()
