"""An audit probe's outcome and how it is read: a request the API refused, SQL PostgreSQL refused (or
a login it refused), and waiting for something to show."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx


@dataclass(frozen=True)
class Probe:
    what: str
    refused: bool
    how: str

    def line(self) -> str:
        return f"{'refused' if self.refused else 'ALLOWED'}: {self.what} ({self.how})"


def refused_status(got: httpx.Response) -> Probe:
    """An API answer that refused the request (a patch's success would have carried the Secret back)."""
    return Probe("", got.status_code in (401, 403, 422), f"{got.status_code} {_reason(got)}")


def _reason(got: httpx.Response) -> str:
    try:
        return str(got.json().get("message", ""))[:160]
    except ValueError:
        return got.text[:160]


async def sql_refused(dsn: str, sql: str) -> Probe:
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError) as e:
        return Probe("", True, f"no login: {type(e).__name__}")
    try:
        await conn.execute(sql)
        return Probe("", False, "ran")
    except asyncpg.PostgresError as e:
        return Probe("", True, f"{type(e).__name__}: {str(e)[:120]}")
    finally:
        await conn.close()


def poll(probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := probe():
            return got
        time.sleep(0.25)
    return None
