"""Read-your-writes across shim replicas.

Each replica reads from its own watch-backed cache, which a write through another replica reaches
after that replica's watch delay (milliseconds, unless the watch is reconnecting). Two things close
the gap, and neither lets a caller turn its requests into API-server load:

- **Versions.** A write's answer carries `Skyscan-Version`: the highest resourceVersion the request
  wrote to a Scan. A read that sends it back as `Skyscan-Min-Version` is answered once this replica's
  cache reflects every Scan write up to it: its watch has delivered that version, or the scan the path
  names is held at it or later. It waits on the cache for up to `WAIT_SECONDS`; then a scan path reads
  its scan from the API server (a consistent read), and a listing is answered as the cache stands.
- **Recent misses.** A well-formed scan id this replica does not hold, whose embedded creation time is
  within `RECENT_SECONDS`, is read once from the API server: a scan created a moment ago through another
  replica is found (so create-then-read works without the header).

Every such read is bounded: concurrent reads of one id share one GET, an id found missing is
remembered for `MISS_SECONDS`, and all of them draw on one token bucket (`READS_PER_SECOND`, burst
`READS_BURST`); beyond it a read is answered from the cache alone, as with one replica.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from api_shim.errors import ApiError
from api_shim.repository.cache import ScanCache
from api_shim.repository.sharing import SharedRuns
from api_shim.repository.versions import min_version
from skyscan.scan_record import resource_version

log = logging.getLogger(__name__)
Obj = dict[str, Any]

WAIT_SECONDS = 2.0  # the longest wait for this replica's watch to reach a version a client asks for
RECENT_SECONDS = 300.0  # a missing id created (by its own timestamp) this recently is read once
SKEW_SECONDS = 60.0  # an id's timestamp may be this far ahead of this replica's clock
MISS_SECONDS = 10.0  # how long an id read and found missing is answered from the cache alone
MISSES_KEPT = 10_000
READS_PER_SECOND = 20.0
READS_BURST = 40
SCAN_ID = re.compile(r"[0-9a-f]{11}x[0-9a-f]{20}")  # `skyscan.model.new_scan_id`


def created_at(scan_id: str) -> float | None:
    """The creation time (Unix seconds) a well-formed scan id carries; None for any other string."""
    return int(scan_id[:11], 16) / 1000 if SCAN_ID.fullmatch(scan_id) else None


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self._rate, self._burst = rate, float(burst)
        self._tokens, self._at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Freshness:
    def __init__(self, cache: ScanCache, read: Callable[[str], Awaitable[Obj]]) -> None:
        self._cache = cache
        self._read_scan = read  # from the API server, into the cache; ApiError 404 when there is none
        self._bucket = TokenBucket(READS_PER_SECOND, READS_BURST)
        self._misses: OrderedDict[str, float] = OrderedDict()  # id -> until when it is not read again
        self._reading: SharedRuns[str, Obj | None] = SharedRuns()

    async def reach(self, request: web.Request) -> None:
        """Wait until this replica's cache is as fresh as the request's `Skyscan-Min-Version` asks."""
        version = min_version(request)
        if version is None:
            return
        name = request.match_info.get("scan_id", "")

        def fresh(scan: Obj | None) -> bool:
            watched = int(self._cache.resource_version or 0)
            return watched >= version or (scan is not None and resource_version(scan) >= version)

        await self._cache.wait_for(name, fresh, WAIT_SECONDS)
        if not fresh(self._cache.get(name)) and SCAN_ID.fullmatch(name):
            await self._read(name)  # behind a lagging watch: this one scan, as the API server has it

    async def missing(self, scan_id: str) -> Obj | None:
        """A recently created scan this replica does not hold yet, read from the API server (or None)."""
        at = created_at(scan_id)
        if at is None or not -SKEW_SECONDS < time.time() - at < RECENT_SECONDS:
            return None
        return await self._read(scan_id)

    async def _read(self, scan_id: str) -> Obj | None:
        if (until := self._misses.get(scan_id)) is not None:
            if until > time.monotonic():
                return None
            del self._misses[scan_id]
        return await self._reading(scan_id, lambda: self._read_once(scan_id))

    async def _read_once(self, scan_id: str) -> Obj | None:
        if not self._bucket.take():
            return None
        scan = await self._get(scan_id)
        if scan is None:
            self._misses[scan_id] = time.monotonic() + MISS_SECONDS
            while len(self._misses) > MISSES_KEPT:
                self._misses.popitem(last=False)
        return scan

    async def _get(self, scan_id: str) -> Obj | None:
        try:
            return await self._read_scan(scan_id)
        except ApiError as e:
            if e.status != 404:
                raise
            return None
