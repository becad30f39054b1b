"""SharedRuns: concurrent calls for one key share one run, which outlives a caller that gives up."""

from __future__ import annotations

import asyncio

import pytest

from api_shim.repository.sharing import SharedRuns

pytestmark = pytest.mark.timeout(10)


async def test_concurrent_calls_for_one_key_share_one_run_and_others_get_their_own() -> None:
    shared: SharedRuns[str, int] = SharedRuns()
    runs: list[str] = []
    release, both_running = asyncio.Event(), asyncio.Event()

    async def run(key: str) -> str:
        runs.append(key)
        if len(runs) == 2:
            both_running.set()
        await release.wait()
        return f"{key}{len(runs)}"

    calls = [asyncio.create_task(shared(k, lambda k=k: run(k))) for k in ("a", "a", "a", "b")]
    await both_running.wait()  # every call has joined a run by then: tasks start in order
    release.set()
    assert await asyncio.gather(*calls) == ["a2", "a2", "a2", "b2"]
    assert sorted(runs) == ["a", "b"]
    assert await shared("a", lambda: run("a")) == "a3"  # a finished run is not reused


async def test_a_caller_that_gives_up_does_not_cancel_the_run_for_the_others() -> None:
    shared: SharedRuns[str, str] = SharedRuns()
    release = asyncio.Event()

    async def run() -> str:
        await release.wait()
        return "done"

    first = asyncio.create_task(shared("k", run))
    second = asyncio.create_task(shared("k", run))
    await asyncio.sleep(0)  # both calls have joined the run (they start in order, at the first turn)
    first.cancel()
    release.set()
    assert await second == "done"
    assert first.cancelled()
