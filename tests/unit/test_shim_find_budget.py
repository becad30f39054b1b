"""The work budget of `/scans/find` (`api_shim.find.search`): a filter's cost per scan times the
scans it examines stays within `FindLimits.max_work`, checked before any pattern is compiled, as each
is compiled, and on the compiled filter; the filter's shape is checked first."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from api_shim.errors import ApiError
from api_shim.find import search as find
from api_shim.find.match import cost as cost_of
from api_shim.find.query import FindLimits, Pattern, parse
from api_shim.find.regex import Regex
from api_shim.find.search import Asked
from tests.helpers import find_filter
from tests.unit.test_find_search import new_finds

PATTERNS = {"run_id": {"$regex": "a{40}"}, "event_id": {"$regex": "b{40}"}, "x": {"$regex": "c{40}"}}


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Sets the work budget of finds (`find.LIMITS.max_work`)."""

    def set_budget(max_work: int) -> None:
        monkeypatch.setattr(find, "LIMITS", dataclasses.replace(FindLimits(), max_work=max_work))

    return set_budget


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[Pattern]:
    """The patterns the find compiles, in order."""
    seen: list[Pattern] = []
    real = find.compile_regex_for

    def counting(key: Pattern, limits: FindLimits) -> Regex:
        seen.append(key)
        return real(key, limits)

    monkeypatch.setattr(find, "compile_regex_for", counting)
    return seen


def asked(query: dict[str, Any]) -> Asked:
    """A find of `query` as first asked."""
    return new_finds().ask(b"", query, ())


def least_cost(query: dict[str, Any]) -> int:
    """Its cost with its patterns uncompiled: the least it can cost."""
    return cost_of(parse(query), {})


async def refusal(query: dict[str, Any], examined: int) -> str:
    with pytest.raises(ApiError) as refused:
        await find.compile_in_slices(asked(query), examined)
    assert refused.value.status == 400
    return refused.value.reason


async def test_a_filter_costing_exactly_the_budget_over_the_examined_scans_is_compiled(budget: Any) -> None:
    query = {"run_id": 1, "priority": {"$gt": 2}}
    cost = find_filter(query).cost
    budget(cost * 10)
    found = await find.compile_in_slices(asked(query), 10)
    assert found.cost == cost and found.matches({"run_id": 1, "priority": 3})
    assert not found.matches({"run_id": 1, "priority": 2})
    assert await refusal(query, 11) == (
        f"filter too costly: {cost} per scan * 11 scans exceeds the work budget of {cost * 10}"
    )


async def test_a_filter_whose_plan_alone_is_beyond_the_budget_is_refused_before_any_pattern_compiles(
    budget: Any, compiled: list[Pattern]
) -> None:
    planned = least_cost(PATTERNS)
    budget(planned * 5)
    assert await refusal(PATTERNS, 6) == (
        f"filter too costly: at least {planned} per scan * 6 scans exceeds the work budget of {planned * 5}"
    )
    assert compiled == []


async def test_patterns_are_compiled_one_at_a_time_until_they_take_the_find_beyond_the_budget(
    budget: Any, compiled: list[Pattern]
) -> None:
    planned = least_cost(PATTERNS)
    full = find_filter(PATTERNS).cost
    assert planned < full
    budget(full * 2)
    assert (await find.compile_in_slices(asked(PATTERNS), 2)).cost == full  # exactly the budget: compiled
    assert len(compiled) == 3
    compiled.clear()
    budget((planned + 1) * 2)  # the plan fits; its first compiled pattern does not
    reason = await refusal(PATTERNS, 2)
    assert compiled == [Pattern("a{40}", "")]
    first, work = planned + (full - planned) // 3, (planned + 1) * 2
    assert (
        reason == f"filter too costly: at least {first} per scan * 2 scans exceeds the work budget of {work}"
    )


async def test_a_pattern_used_twice_is_compiled_once_and_costed_twice(
    budget: Any, compiled: list[Pattern]
) -> None:
    query = {"run_id": {"$regex": "a{40}"}, "event_id": {"$regex": "a{40}"}}
    cost = find_filter(query).cost
    budget(cost * 2)
    assert (await find.compile_in_slices(asked(query), 2)).cost == cost
    assert compiled == [Pattern("a{40}", "")]
    compiled.clear()
    budget(cost * 2 - 1)  # the plan and the pattern compiled once fit; the filter with both uses does not
    assert await refusal(query, 2) == (
        f"filter too costly: {cost} per scan * 2 scans exceeds the work budget of {cost * 2 - 1}"
    )
    assert compiled == [Pattern("a{40}", "")]


async def test_the_finds_own_limits_hold_for_its_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(find, "LIMITS", dataclasses.replace(FindLimits(), max_regex_length=3))
    reason = await refusal({"run_id": {"$regex": "abcd"}}, 1)
    assert reason == "invalid filter: invalid $regex: pattern longer than 3 characters"


async def test_an_invalid_pattern_is_reported_as_invalid_even_before_costly_ones(
    budget: Any, compiled: list[Pattern]
) -> None:
    query = {"a": {"$regex": "("}, **PATTERNS}
    budget(least_cost(query))
    reason = await refusal(query, 1)
    assert reason.startswith("invalid filter: invalid $regex: "), reason
    assert compiled == [Pattern("(", "")]  # the costly ones after it were never compiled


async def test_a_malformed_filter_is_refused_as_invalid() -> None:
    assert await refusal({"priority": {"$near": 1}}, 1) == "invalid filter: unsupported operator: $near"


async def test_compiling_many_patterns_yields_to_the_event_loop_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(find, "SLICE_SECONDS", 0.0)  # every pattern is a slice
    turns = 0
    running = True

    async def other_request() -> None:
        nonlocal turns
        while running:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    await asyncio.sleep(0)
    before = turns
    await find.compile_in_slices(asked(PATTERNS), 1)
    running = False
    await other
    assert turns - before >= len(PATTERNS)


def test_the_shape_is_checked_before_anything_else() -> None:
    finds = new_finds()
    query: dict[str, Any] = {"run_id": 1}
    assert finds.ask(b"{}", query, ()).query == parse(query)
    deep: dict[str, Any] = {"a": 1}
    for _ in range(find.LIMITS.max_depth):
        deep = {"$and": [deep]}
    with pytest.raises(ApiError) as refused:
        finds.ask(b"{}", deep, ())
    assert refused.value.status == 400
    assert (
        refused.value.reason
        == f"invalid filter: the filter is nested deeper than {find.LIMITS.max_depth} levels"
    )
    hint = "Simplify the filter (fewer conditions, $in over values, fewer or simpler $regex patterns)."
    assert find.too_costly(3, 4).message == hint


def test_a_find_too_costly_over_the_archive_says_so_and_how_to_narrow_it() -> None:
    refused = find.too_costly(3, 40, archived=True)
    budget = find.LIMITS.max_work
    assert (
        refused.reason
        == f"filter too costly: 3 per scan * 40 scans (live and archived) exceeds the work budget of {budget}"
    )
    assert refused.message == find.NARROW
    assert find.too_costly(3, 40, at_least=True).reason.startswith(
        "filter too costly: at least 3 per scan * 40 scans exceeds"
    )
