"""Webhooks on the local stack: a subscription made through REST or `skyscan subscribe` (a person's
own), a scan launched as `make demo` launches one, and a receiver beside the stack that gets one
CloudEvent for the scan's final result, signed so that the Standard Webhooks library verifies it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.e2e.conftest import Rest, Stack, scan_request
from tests.e2e.test_cli import skyscan
from tests.helpers import eventually
from tests.integration.operator import test_webhooks as operator_webhooks
from tests.integration.operator.test_webhooks import Receiver, _true

pytestmark = pytest.mark.timeout(180)
receiver = operator_webhooks.receiver  # the operator tests' receiver, beside the stack
FINAL = "SCAN_HAS_FINAL_RESULT"


async def test_a_subscription_gets_the_final_result_of_a_scan_signed(rest: Rest, receiver: Receiver) -> None:
    url, got = receiver.url, receiver.got
    made: dict[str, Any] = await rest.ok("POST", "/subscriptions", json={"url": url, "states": [FINAL]})
    scan_id = (await rest.ok("POST", "/scan", json=scan_request()))["scan_id"]
    await rest.wait_status(scan_id, lambda s: s["scan_state"] == FINAL, timeout=120)

    def ours() -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in got if json.loads(body)["subject"] == scan_id]

    assert await eventually(lambda: _true(bool(ours())), timeout=60)
    headers, body = next((h, b) for h, b in got if json.loads(b)["subject"] == scan_id)
    event = Webhook(made["secret"]).verify(body, headers)
    assert event["data"]["scan_state"] == FINAL and event["data"]["scan_id"] == scan_id
    mine = await eventually(lambda: _delivered(rest, made["id"]), timeout=60)  # written within 15 s
    assert mine["last_delivery"]["result"] == "delivered"
    assert len(ours()) == 1  # one event for the scan: its final result
    gone = await rest.ok("DELETE", f"/subscriptions/{made['id']}")
    assert gone["id"] == made["id"]


async def _delivered(rest: Rest, subscription_id: str) -> dict[str, Any] | None:
    listed = await rest.ok("GET", "/subscriptions")
    mine = next(s for s in listed["subscriptions"] if s["id"] == subscription_id)
    return mine if mine["delivered"] >= 1 else None


async def test_skyscan_subscribe_then_a_scan_to_its_final_result(
    stack: Stack, rest: Rest, receiver: Receiver, tmp_path: Path
) -> None:
    """The issue's path: `skyscan subscribe --url … --state SCAN_HAS_FINAL_RESULT`, then a scan."""
    url, got = receiver.url, receiver.got
    made = skyscan(stack, tmp_path, "subscribe", "--url", url, "--state", FINAL, "--json")
    assert made.code == 0, made.err
    subscription = json.loads(made.out)
    said = skyscan(stack, tmp_path, "subscribe", "--url", "https://elsewhere.example.org/x", "--state", FINAL)
    assert said.code != 0 and "not on the allowed list" in said.err
    scan_id = (await rest.ok("POST", "/scan", json=scan_request()))["scan_id"]
    await rest.wait_status(scan_id, lambda s: s["scan_state"] == FINAL, timeout=120)

    def ours() -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b in got if json.loads(b)["subject"] == scan_id]

    assert await eventually(lambda: _true(bool(ours())), timeout=60)
    assert Webhook(subscription["secret"]).verify(ours()[0][1], ours()[0][0])["data"]["scan_id"] == scan_id
    listed = skyscan(stack, tmp_path, "subscriptions")
    assert listed.code == 0 and subscription["id"] in listed.out
    gone = skyscan(stack, tmp_path, "unsubscribe", subscription["id"])
    assert gone.code == 0 and f"deleted subscription {subscription['id']}" in gone.out
