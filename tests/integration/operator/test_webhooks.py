"""Webhooks from the real operator (a subprocess) to a real receiving HTTP server, the subscriptions and
Scans on the real API server: a final result arrives as a CloudEvent its receiver verifies with the
Standard Webhooks library; an operator killed mid-delivery delivers the event again with the same id;
a receiver down through the first retries gets everything in order afterwards; destinations the
deployment does not allow, or a redirect, get nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from skyscan import subscription as sub
from skyscan.io import install, kube
from skyscan.io.kube import Kube, scan_path
from skyscan_local.processes import free_port
from tests.helpers import eventually
from tests.integration.operator.conftest import OperatorFactory, create_scan, get_scan

pytestmark = pytest.mark.timeout(180)
LOCAL = {  # the receiver runs beside the test, on loopback, in clear
    "SKYSCAN_WEBHOOK_ALLOWED_HOSTS": json.dumps(["127.0.0.1", "localhost"]),
    "SKYSCAN_WEBHOOK_ALLOWED_NETWORKS": json.dumps(["127.0.0.0/8"]),
    "SKYSCAN_WEBHOOK_PLAIN_HTTP": "true",
}
FINAL = "SCAN_HAS_FINAL_RESULT"


@dataclass
class Receiver:
    """A webhook receiver: what it was sent, and how it answers (a status; `held`: not yet)."""

    url: str
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    status: int = 204
    held: asyncio.Event | None = None
    location: str = ""

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    found = Receiver(f"http://127.0.0.1:{port}/hook")

    async def hook(request: web.Request) -> web.Response:
        found.got.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        if found.held is not None:
            await found.held.wait()
        headers = {"Location": found.location} if found.location else {}
        return web.Response(status=found.status, headers=headers)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield found
    if found.held is not None:
        found.held.set()
    await runner.cleanup()


def new_secret() -> str:
    return sub.SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


async def subscribe(api: Kube, namespace: str, name: str, url: str, secret: str, **spec: Any) -> None:
    """A subscription as kubectl would make it, its secret a key of the webhook Secret."""
    await install.ensure_webhook_secrets(api, namespace)
    await api.request(
        "PATCH",
        kube.core_path("secrets", namespace, sub.SECRET_NAME),
        body={"data": {name: base64.b64encode(secret.encode()).decode()}},
        content_type="application/merge-patch+json",
    )
    body = {
        "apiVersion": sub.API_VERSION,
        "kind": sub.KIND,
        "metadata": {"name": name},
        "spec": {"url": url, "secretRef": {"key": name}, "states": [FINAL], **spec},
    }
    await api.request("POST", kube.path(sub.API_VERSION, sub.PLURAL, namespace), body=body)
    await eventually(lambda: _taken_up(api, namespace, name), timeout=60)  # the operator has it


async def final_result(api: Kube, namespace: str, scan_id: str) -> None:
    """What the shim writes when the scanner PUTs its final result."""
    await api.request(
        "PATCH",
        scan_path(namespace, scan_id, "status"),
        body={"status": {"result": {"isFinal": True, "updatedAt": time.time()}}},
        content_type="application/merge-patch+json",
    )


async def status(api: Kube, namespace: str, name: str) -> dict[str, Any]:
    got = await api.request("GET", kube.path(sub.API_VERSION, sub.PLURAL, namespace, name))
    return dict(got.get("status") or {})


async def test_a_final_result_arrives_signed_once_and_its_delivery_shows(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    operator(**LOCAL)
    scan_id, other = await create_scan(api, namespace), await create_scan(api, namespace)
    secret = new_secret()
    await subscribe(api, namespace, "final", receiver.url, secret, scanIds=[scan_id])
    await final_result(api, namespace, other)  # not one it asked for
    await final_result(api, namespace, scan_id)
    assert await eventually(lambda: _true(len(receiver.got) == 1), timeout=60)
    headers, body = receiver.got[0]
    event = Webhook(secret).verify(body, headers)  # as a receiver checks it: signature and timestamp
    assert headers["content-type"] == "application/cloudevents+json"
    assert event["specversion"] == "1.0" and event["type"] == sub.EVENT_TYPE and event["subject"] == scan_id
    assert event["source"] == f"/skyscan/{namespace}/scans" and event["id"] == headers["webhook-id"]
    assert event["data"]["scan_state"] == FINAL and event["data"]["scan_complete"] is True
    shown = await eventually(lambda: _delivered(api, namespace, "final", 1), timeout=60)
    assert shown["lastDelivery"]["result"] == "delivered" and shown["lastDelivery"]["eventId"] == event["id"]
    (entered,) = [t for t in await _transitions(api, namespace, scan_id) if t["state"] == FINAL]
    assert shown["backlog"] == 0 and shown["announced"] == {scan_id: entered["seq"]}  # not the other scan's
    assert len(receiver.got) == 1


async def test_an_operator_killed_mid_delivery_delivers_the_same_event_again(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    first = operator(**LOCAL)
    scan_id = await create_scan(api, namespace)
    await subscribe(api, namespace, "held", receiver.url, new_secret())
    receiver.held = asyncio.Event()  # the first attempt hangs in the receiver
    await final_result(api, namespace, scan_id)
    assert await eventually(lambda: _true(len(receiver.got) == 1), timeout=60)
    # On record before it was tried: the transition the Scan holds.
    assert [t["state"] for t in await _transitions(api, namespace, scan_id)][-1] == FINAL
    assert (await status(api, namespace, "held")).get("delivered", 0) == 0
    first.kill()
    receiver.held.set()
    receiver.held = None
    operator(**LOCAL)
    assert await eventually(lambda: _true(len(receiver.got) >= 2), timeout=60)
    ids = {headers["webhook-id"] for headers, _ in receiver.got}
    assert len(ids) == 1  # the same event, whoever tried it
    datas = [event["data"] for event in receiver.events()]  # the second's read from the Scan, maybe
    assert all(d["scan_state"] == FINAL and d["manifest"]["priority"] is not None for d in datas), datas
    await eventually(lambda: _delivered(api, namespace, "held", 1), timeout=30)


async def test_a_receiver_down_through_the_first_retries_gets_everything_in_order(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    operator(**LOCAL)
    receiver.status = 503
    await subscribe(api, namespace, "down", receiver.url, new_secret(), states=["PRESTARTUP", FINAL])
    scans = [await create_scan(api, namespace) for _ in range(3)]
    for scan_id in scans:  # each seen waiting for its scanner: its PRESTARTUP event was seen before
        await eventually(
            lambda s=scan_id: _in_state(api, namespace, s, "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP")
        )
    for scan_id in scans:  # the finals, one after another as the operator sees them
        await final_result(api, namespace, scan_id)
        await eventually(lambda s=scan_id: _in_state(api, namespace, s, FINAL), timeout=30)
    down = await eventually(lambda: _failed(api, namespace, "down", 3), timeout=60)
    assert down["lastDelivery"]["result"] == "HTTP 503"
    receiver.status = 200
    shown = await eventually(lambda: _delivered(api, namespace, "down", 6), timeout=90)
    assert shown["backlog"] == 0
    accepted: list[tuple[str, str]] = []
    for event in receiver.events():
        key = (event["subject"], event["data"]["scan_state"])
        if key not in accepted:
            accepted.append(key)
    # Each scan's PRESTARTUP event before its final one, and the scans' finals in the order they came.
    finals = [s for s, state in accepted if state == FINAL]
    assert finals == scans
    for scan_id in scans:
        assert accepted.index((scan_id, "PENDING__PRESTARTUP")) < accepted.index((scan_id, FINAL))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data", "not on the allowed list"),
        ("http://skyscan.example.org/hook", "not on the allowed list"),
        ("http://localhost:{port}/hook", "refused: address"),  # a listed name that resolves to loopback
        ("http://127.0.0.1:{port}/hook", "refused: address"),  # a listed loopback address
    ],
)
async def test_destinations_not_allowed_get_nothing(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver, url: str, why: str
) -> None:
    operator(
        SKYSCAN_WEBHOOK_ALLOWED_HOSTS=json.dumps(["127.0.0.1", "localhost"]),
        SKYSCAN_WEBHOOK_PLAIN_HTTP="true",
    )  # loopback not among the allowed networks
    scan_id = await create_scan(api, namespace)
    await subscribe(
        api, namespace, "refused", url.format(port=receiver.url.split(":")[2].split("/")[0]), new_secret()
    )
    await final_result(api, namespace, scan_id)
    shown = await eventually(lambda: _failed(api, namespace, "refused", 1), timeout=60)
    assert why in shown["lastDelivery"]["result"]
    assert receiver.got == []


async def test_a_redirect_is_not_followed(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    operator(**LOCAL)
    scan_id = await create_scan(api, namespace)
    receiver.status, receiver.location = 307, "http://127.0.0.2:9/elsewhere"
    await subscribe(api, namespace, "moved", receiver.url, new_secret())
    await final_result(api, namespace, scan_id)
    shown = await eventually(lambda: _failed(api, namespace, "moved", 1), timeout=60)
    assert shown["lastDelivery"]["result"] == "HTTP 307: redirects are not followed"
    assert len(receiver.got) >= 1 and all(h["host"].startswith("127.0.0.1") for h, _ in receiver.got)


async def _true(value: bool) -> bool:
    return value


async def _delivered(api: Kube, namespace: str, name: str, at_least: int) -> dict[str, Any] | None:
    found = await status(api, namespace, name)
    return found if found.get("delivered", 0) >= at_least else None


async def _failed(api: Kube, namespace: str, name: str, at_least: int) -> dict[str, Any] | None:
    found = await status(api, namespace, name)
    return found if found.get("failures", 0) >= at_least else None


async def _taken_up(api: Kube, namespace: str, name: str) -> bool:
    return "backlog" in await status(api, namespace, name)


async def _transitions(api: Kube, namespace: str, scan_id: str) -> list[dict[str, Any]]:
    return list(((await get_scan(api, namespace, scan_id)).get("status") or {}).get("transitions") or [])


async def _in_state(api: Kube, namespace: str, scan_id: str, state: str) -> bool:
    return bool(((await get_scan(api, namespace, scan_id)).get("status") or {}).get("state") == state)


async def test_a_new_subscription_starts_from_now(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    operator(**LOCAL)
    old, new = await create_scan(api, namespace), await create_scan(api, namespace)
    await final_result(api, namespace, old)
    await eventually(lambda: _in_state(api, namespace, old, FINAL))  # the operator has seen it final
    # A subscription is made at a whole second (its creationTimestamp): the one after that final.
    recorded = (await _transitions(api, namespace, old))[-1]["at"]
    await eventually(lambda: _true(time.time() >= math.floor(recorded) + 1), timeout=5)
    await subscribe(api, namespace, "fresh", receiver.url, new_secret())
    await final_result(api, namespace, new)
    await eventually(lambda: _delivered(api, namespace, "fresh", 1), timeout=60)
    assert [e["subject"] for e in receiver.events()] == [new]  # the old scan's final was there before


async def test_a_secret_handed_over_in_the_spec_moves_into_the_webhook_secret(
    api: Kube, namespace: str, operator: OperatorFactory, receiver: Receiver
) -> None:
    """As `POST /subscriptions` makes one: the secret in the spec, which the operator stores and removes."""
    operator(**LOCAL)
    await install.ensure_webhook_secrets(api, namespace)
    secret, scan_id = new_secret(), await create_scan(api, namespace)
    body = {
        "apiVersion": sub.API_VERSION, "kind": sub.KIND, "metadata": {"name": "handed"},
        "spec": {"url": receiver.url, "secretRef": {"key": "handed"}, "states": [FINAL], "secret": secret},
    }  # fmt: skip
    await api.request("POST", kube.path(sub.API_VERSION, sub.PLURAL, namespace), body=body)

    async def moved() -> bool:
        obj = await api.request("GET", kube.path(sub.API_VERSION, sub.PLURAL, namespace, "handed"))
        return "secret" not in obj["spec"]

    await eventually(moved, timeout=60)
    kept = await api.request("GET", kube.core_path("secrets", namespace, sub.SECRET_NAME))
    assert base64.b64decode(kept["data"]["handed"]).decode() == secret
    await final_result(api, namespace, scan_id)
    assert await eventually(lambda: _true(len(receiver.got) == 1), timeout=60)
    assert Webhook(secret).verify(receiver.got[0][1], receiver.got[0][0])["subject"] == scan_id
    await api.request("DELETE", kube.path(sub.API_VERSION, sub.PLURAL, namespace, "handed"))

    async def key_gone() -> bool:
        found = await api.request("GET", kube.core_path("secrets", namespace, sub.SECRET_NAME))
        return "handed" not in (found.get("data") or {})

    await eventually(key_gone, timeout=30)  # its key leaves with it
