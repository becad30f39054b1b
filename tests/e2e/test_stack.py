"""`make up` is safe to repeat: an unchanged stack keeps its processes, ports and tokens."""

from __future__ import annotations

import asyncio

from skyscan_local import stack as localstack
from tests.e2e.conftest import Rest, Stack


async def test_up_again_changes_nothing(stack: Stack, rest: Rest) -> None:
    before = localstack.load_state(stack.settings.dir)
    env = await asyncio.to_thread(localstack.up, stack.settings)  # it runs its own event loop
    after = localstack.load_state(stack.settings.dir)
    assert after["components"] == before["components"]  # same pids, command lines, configurations
    assert set(after["components"]) == {"wms-simulator", "shim", "operator", "scanner-simulator"}
    assert env["SKYSCAN_URL"] == stack.url and env["SKYSCAN_USER_TOKEN"] == stack.user_token
    assert localstack.status(stack.settings) == dict.fromkeys(after["components"], True)
    # The tokens of the env file work, each with its role only.
    assert (await rest.call("GET", "/scans/backlog")).status_code == 200
    assert (await rest.call("GET", "/scans/backlog", as_="system")).status_code == 403
    lines = (stack.settings.dir / "env").read_text().splitlines()
    assert [line.split("=", 1)[0] for line in lines] == [f"export {k}" for k in localstack.ENV_KEYS]
