"""A de-duplicating work queue: each key is processed by one worker at a time, and a key added while
it is being processed is processed once more afterwards (the controller-runtime semantics)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}

    def add(self, key: K) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` after `delay` seconds; an earlier pending wake-up for the key wins."""
        if delay <= 0:
            self.add(key)
            return
        due = time.monotonic() + delay
        held = self._timers.get(key)
        if held and held[0] <= due:
            return
        if held:
            held[1].cancel()
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def forget(self, key: K) -> None:
        held = self._timers.pop(key, None)
        if held:
            held[1].cancel()

    async def get(self) -> K:
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._queued)
