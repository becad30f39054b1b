"""Subscriptions through REST, from a real shim over real HTTP to the real API server: made with a
secret (given, or made and answered once) handed over in the subscription's spec for the operator,
never written to a Secret by the shim; each person sees and deletes their own only; destinations,
secrets and states the deployment refuses are 400s."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from skyscan import subscription as sub
from skyscan.io import install, kube
from tests.integration.shim.conftest import MakeShim, ShimUnderTest

pytestmark = pytest.mark.timeout(60)
ALLOWED = {"webhook_allowed_hosts": ["hooks.example.org", ".alerts.example.net"]}
SECRET = sub.SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


def body(**changes: Any) -> dict[str, Any]:
    return {
        "url": "https://hooks.example.org/skyscan",
        "states": ["SCAN_HAS_FINAL_RESULT", "ABORTED"],
    } | changes


async def stored_secrets(shim: ShimUnderTest) -> dict[str, str]:
    found = await shim.api.request("GET", kube.core_path("secrets", shim.namespace, sub.SECRET_NAME))
    return {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}


async def test_a_person_subscribes_lists_and_deletes_their_own(make_shim: MakeShim) -> None:
    shim = await make_shim(**ALLOWED)
    await install.ensure_webhook_secrets(shim.api, shim.namespace)
    given = await shim.call("POST", "/subscriptions", json_body=body(secret=SECRET, scan_ids=["s1"]))
    assert given.status == 200, given.body
    assert "secret" not in given.body and given.body["url"] == "https://hooks.example.org/skyscan"
    made = await shim.call("POST", "/subscriptions", json_body=body(classifiers={"k": 1}))
    assert made.status == 200, made.body
    secret = made.body["secret"]  # answered once
    assert sub.signing_key(secret) and len(sub.signing_key(secret)) == 32
    assert await stored_secrets(shim) == {}  # the shim reaches no Secret: the operator moves them

    obj = await shim.api.request(
        "GET", kube.path(sub.API_VERSION, sub.PLURAL, shim.namespace, made.body["id"])
    )
    assert obj["spec"]["owner"] == "alice" and obj["spec"]["secretRef"] == {
        "name": sub.SECRET_NAME,
        "key": made.body["id"],
    }
    assert obj["spec"]["classifiers"] == {"k": 1} and obj["spec"]["states"] == [
        "SCAN_HAS_FINAL_RESULT",
        "ABORTED",
    ]

    listed = await shim.call("GET", "/subscriptions")
    assert sorted(s["id"] for s in listed.body["subscriptions"]) == sorted(
        [given.body["id"], made.body["id"]]
    )
    assert all("secret" not in s for s in listed.body["subscriptions"])
    assert (await shim.call("GET", "/subscriptions", as_="icecube")).body == {
        "subscriptions": []
    }  # another person
    gone = await shim.call("DELETE", f"/subscriptions/{made.body['id']}", as_="icecube")
    assert (gone.status, gone.body["reason"]) == (404, "subscription not found")
    assert (await shim.call("GET", "/subscriptions", as_="viewer")).status == 403

    deleted = await shim.call("DELETE", f"/subscriptions/{made.body['id']}")
    assert deleted.status == 200 and deleted.body["id"] == made.body["id"]
    assert [s["id"] for s in (await shim.call("GET", "/subscriptions")).body["subscriptions"]] == [
        given.body["id"]
    ]
    again = await shim.call("DELETE", f"/subscriptions/{made.body['id']}")
    assert again.status == 404
    for hostile in (
        "%C2%88%C3%82%25b%40",
        "A" * 300,
        "sub-1%2F..%2Fx",
        "Sub_1",
    ):  # no object name: none of yours  # no object name: none of yours
        refused = await shim.call("DELETE", f"/subscriptions/{hostile}")
        assert (refused.status, refused.body["reason"]) == (404, "subscription not found"), hostile


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"url": "https://169.254.169.254/latest/meta-data"},
            "url: host 169.254.169.254 is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)",
        ),
        (
            {"url": "https://127.0.0.1:8443/hook"},
            "url: host 127.0.0.1 is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)",
        ),
        (
            {"url": "https://evil.example.com/hook"},
            "url: host evil.example.com is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)",
        ),
        ({"url": "http://hooks.example.org/hook"}, "url: the scheme must be https"),
        (
            {"url": "https://alerts.example.net.evil.io/"},
            "url: host alerts.example.net.evil.io is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)",
        ),
        ({"secret": "not-a-secret"}, "secret: a signing secret begins with whsec_"),
        (
            {"secret": "whsec_" + base64.b64encode(b"short").decode()},
            "secret: a signing key has 24 to 64 bytes",
        ),
        ({"states": []}, None),
        ({"states": ["final"]}, None),
        ({"scan_ids": ["x" * 254]}, None),
        ({"more": 1}, None),
    ],
)
async def test_what_a_subscription_may_not_be(
    make_shim: MakeShim, changes: dict[str, Any], reason: str | None
) -> None:
    shim = await make_shim(**ALLOWED)
    await install.ensure_webhook_secrets(shim.api, shim.namespace)
    refused = await shim.call("POST", "/subscriptions", json_body=body(**changes))
    assert refused.status == 400, refused.body
    if reason:
        assert refused.body["reason"] == reason
    assert await stored_secrets(shim) == {}
