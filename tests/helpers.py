"""Helpers for tests: polling for a condition instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from skyscan.kube import ApiError

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], timeout: float = 30.0, interval: float = 0.2) -> T:
    """Await `probe()` until it returns a truthy value without raising; return that value."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if result := await probe():
                return result
        except (ApiError, AssertionError) as e:
            last = e
        await asyncio.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout}s (last error: {last!r})")
