"""Concurrent calls for one key that share one run (a scan's guarded soft delete, a replica's read of
a scan it does not hold): the first caller starts it, later ones await the same outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedRuns(Generic[K, V]):
    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    async def __call__(self, key: K, run: Callable[[], Awaitable[V]]) -> V:
        """`run()`'s outcome, shared with every concurrent call for `key`. The run is a task of its
        own: a caller that gives up (its client gone) does not cancel it for the others."""
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = asyncio.ensure_future(run())
            running.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(running)
