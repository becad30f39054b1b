"""Request bodies (`api_shim.bodies`): at most `SKYSCAN_MAX_BODY_BYTES` each, read once, and at most
so many bytes of them handled at once. Requests are aiohttp's own, with their bodies fed in chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import pytest
from aiohttp import StreamReader, web
from aiohttp.test_utils import make_mocked_request

from api_shim.bodies import BODIES, BODY, BodyBudget, body_of
from api_shim.errors import ApiError

pytestmark = pytest.mark.timeout(10)


def request(
    budget: BodyBudget,
    chunks: list[bytes] | None,
    *,
    length: int | None = None,
    chunked: bool = False,
    apart: bool = False,
) -> web.Request:
    """A POST whose body arrives as `chunks` (None: no body), with `length` as its Content-Length
    (default: the chunks' total) or, `chunked`, none; `apart`: each chunk once the last one was read
    (as from the network), else all at once."""
    app = web.Application()
    app[BODIES] = budget
    if chunks is None:
        return make_mocked_request("POST", "/", app=app)
    reader = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    for chunk in chunks:
        reader.feed_data(chunk)  # read back as one part
    reader.feed_eof()
    size = sum(map(len, chunks)) if length is None else length
    headers = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(size)}
    payload: Any = Parts(chunks) if apart else reader
    return make_mocked_request("POST", "/", headers=headers, app=app, payload=payload)


class Parts:
    """A body read as it comes from the network: part by part."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def budget(total: int = 100, largest: int = 50, wait: float = 5.0) -> BodyBudget:
    return BodyBudget(total, largest, wait)


async def test_a_body_is_read_whole_and_once() -> None:
    r = request(budget(), [b"ab", b"cd", b"e"])
    body = await body_of(r)
    assert body == b"abcde"
    assert await body_of(r) is body  # the second read is the first one's bytes, not the spent stream


async def test_a_body_arriving_in_parts_is_their_concatenation() -> None:
    assert await body_of(request(budget(), [b"ab", b"cd", b"e"], apart=True)) == b"abcde"


async def test_an_empty_body_is_accepted_even_with_no_room_for_any_other() -> None:
    assert await body_of(request(budget(largest=0), [], chunked=True)) == b""
    assert budget().peak == 0


async def test_a_body_of_exactly_the_largest_size_is_accepted() -> None:
    assert await body_of(request(budget(largest=5), [b"abc", b"de"])) == b"abcde"
    assert await body_of(request(budget(largest=5), [b"abc", b"de"], chunked=True)) == b"abcde"


async def test_a_declared_length_beyond_the_largest_is_refused_413_before_the_body_is_read() -> None:
    r = request(budget(largest=5), [b"abcdef"])
    with pytest.raises(ApiError) as refused:
        await body_of(r)
    assert (refused.value.status, refused.value.reason) == (413, "request body too large")
    assert refused.value.message == "A request body is at most 5 bytes."
    assert await r.content.read() == b"abcdef"  # nothing of it was read


async def test_a_body_longer_than_it_declared_is_refused_413_once_it_passes_the_largest() -> None:
    for r in (
        request(budget(largest=5), [b"abc", b"def"], chunked=True),
        request(budget(largest=5), [b"abc", b"def"], length=3),
        request(budget(largest=5), [b"abc", b"def"], chunked=True, apart=True),
    ):
        with pytest.raises(ApiError) as refused:
            await body_of(r)
        assert (refused.value.status, refused.value.reason) == (413, "request body too large")
        assert refused.value.message == "A request body is at most 5 bytes."
        assert BODY not in r


async def test_a_request_without_a_body_takes_no_room() -> None:
    b = budget(total=10, largest=50, wait=0.05)
    full = request(b, [b"x" * 30])  # one body beyond the total: no other body fits, not even an empty one
    async with b.room(full):
        empty = request(b, None)
        assert b.size(empty) == 0
        async with b.room(empty):  # entered at once, though the budget is past full
            assert b.held == 30


async def test_a_body_takes_its_declared_length_capped_at_the_largest_and_a_chunked_one_the_largest() -> None:
    b = budget(largest=50)
    assert b.size(request(b, [b"x" * 7])) == 7
    assert b.size(request(b, [b"x"], length=80)) == 50
    assert b.size(request(b, [b"x" * 7], chunked=True)) == 50


async def test_one_body_always_fits_even_beyond_the_total() -> None:
    b = budget(total=10, largest=50)
    r = request(b, [b"x" * 30])
    async with b.room(r):
        assert b.held == 30
    assert b.held == 0 and b.peak == 30


async def test_bodies_adding_up_to_exactly_the_total_are_handled_at_once() -> None:
    b = budget(total=10, largest=10)
    async with b.room(request(b, [b"x" * 4])), b.room(request(b, [b"x" * 6])):
        assert b.held == 10
    assert b.held == 0 and b.peak == 10


async def test_a_body_beyond_the_room_left_waits_until_another_lets_go_then_runs() -> None:
    b = budget(total=10, largest=10)
    first, second = request(b, [b"x" * 6]), request(b, [b"x" * 5])
    release, entered = asyncio.Event(), asyncio.Event()

    async def hold_first() -> None:
        async with b.room(first):
            first[BODY] = await body_of(first)
            entered.set()
            await release.wait()
        assert BODY not in first  # the body read is let go with the room

    async def then_second() -> int:
        async with b.room(second):
            return b.held

    holder = asyncio.create_task(hold_first())
    await entered.wait()
    waiter = asyncio.create_task(then_second())
    for _ in range(20):  # the waiter gets many turns of the loop, and stays out
        await asyncio.sleep(0)
    assert not waiter.done() and b.held == 6
    release.set()
    assert await waiter == 5  # it held its own room only: the first's was given back
    await holder
    assert b.held == 0 and b.peak == 6


async def test_a_body_that_finds_no_room_within_the_wait_is_refused_503_with_retry_after() -> None:
    b = budget(total=10, largest=10, wait=0.05)
    async with b.room(request(b, [b"x" * 10])):
        with pytest.raises(ApiError) as refused:
            async with b.room(request(b, [b"x"])):
                pytest.fail("entered a full budget")
        assert b.held == 10
    assert refused.value.status == 503
    assert refused.value.headers == {"Retry-After": "5"}
    assert refused.value.message == (
        "The shim holds at most 10 bytes of request bodies at once and had no room for 1 within 0.05 s; "
        "try again."
    )
    assert b.held == 0


async def test_a_handler_that_fails_still_gives_its_room_back() -> None:
    b = budget(total=10, largest=10)
    with pytest.raises(RuntimeError):
        async with b.room(request(b, [b"x" * 8])):
            raise RuntimeError("handler failed")
    assert b.held == 0
    async with b.room(request(b, [b"x" * 8])):  # would wait, had the first kept its room
        assert b.held == 8
