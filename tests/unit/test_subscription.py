"""Subscriptions' pure rules (`skyscan.subscription`): which events a subscription wants, the event's
stable id, the CloudEvent, the Standard Webhooks signature (verified by that convention's own library),
and where deliveries may go."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from skyscan import subscription as sub

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def spec(**changes: object) -> sub.SubscriptionSpec:
    fields = {
        "url": "https://hooks.example.org/x",
        "secretRef": {"key": "k"},
        "states": ["SCAN_HAS_FINAL_RESULT"],
    }
    return sub.SubscriptionSpec.model_validate(fields | changes)


def test_states_are_whole_or_either_half_and_scans_by_id_and_classifiers() -> None:
    assert sub.wants_state(["SCAN_HAS_FINAL_RESULT"], "SCAN_HAS_FINAL_RESULT")
    assert sub.wants_state(["ABORTED"], "ABORTED__PARTIAL_RESULT_GENERATED")
    assert sub.wants_state(["PRESTARTUP"], "PENDING__PRESTARTUP")
    assert not sub.wants_state(["ABORTED"], "PENDING__PRESTARTUP")
    assert not sub.wants_state(["ABORT"], "ABORTED__PRESTARTUP")  # a half is whole, not a prefix
    assert sub.wants_scan(spec(), "s1", {})
    assert sub.wants_scan(spec(scanIds=["s1"]), "s1", {}) and not sub.wants_scan(
        spec(scanIds=["s1"]), "s2", {}
    )
    picky = spec(classifiers={"k": 1})
    assert sub.wants_scan(picky, "s", {"k": 1, "o": 2})
    assert not sub.wants_scan(picky, "s", {"k": "1"}) and not sub.wants_scan(picky, "s", {})


def test_an_event_id_differs_by_subscription_scan_and_transition() -> None:
    first = sub.event_id("uid-1", "s1", 3)
    assert first == sub.event_id("uid-1", "s1", 3) and len(first) == 32
    others = (("uid-2", "s1", 3), ("uid-1", "s2", 3), ("uid-1", "s1", 4), ("uid-1", "s13", 1))
    assert len({first, *(sub.event_id(*other) for other in others)}) == 5


def test_the_cloud_event_is_signed_as_standard_webhooks_verify_it() -> None:
    event = sub.PendingEvent(
        id="e1", scan_id="s1", seq=2, state="SCAN_HAS_FINAL_RESULT", time=1_700_000_000.5, data={"x": 1}
    )
    body = sub.cloud_event("ns", event)
    assert json.loads(body) == {
        "specversion": "1.0", "type": sub.EVENT_TYPE, "source": "/skyscan/ns/scans", "id": "e1",
        "time": "2023-11-14T22:13:20.500000Z", "subject": "s1", "datacontenttype": "application/json",
        "data": {"x": 1},
    }  # fmt: skip
    assert b" " not in body  # compact: what is signed is what is sent
    now = int(time.time())
    headers = sub.signature_headers(sub.signing_key(SECRET), "e1", now, body)
    assert sorted(headers) == [
        "webhook-id",
        "webhook-signature",
        "webhook-timestamp",
    ]  # the convention's names
    assert Webhook(SECRET).verify(body, headers)["id"] == "e1"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", headers)
    other = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, headers)


def key_of(n: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(n))).decode()


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ("", "a signing secret begins with whsec_"),
        ("abc", "a signing secret begins with whsec_"),
        (SECRET[6:], "a signing secret begins with whsec_"),
        ("whsec_!!!", "a signing secret is whsec_ and base64"),
        ("whsec_", "a signing key has 24 to 64 bytes"),
        (key_of(23), "a signing key has 24 to 64 bytes"),
        (key_of(65), "a signing key has 24 to 64 bytes"),
    ],
)
def test_a_signing_secret_is_whsec_and_base64_of_a_key_long_enough(secret: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        sub.signing_key(secret)
    assert str(refused.value) == why


def test_keys_of_24_to_64_bytes_sign() -> None:
    assert sub.signing_key(key_of(24)) == bytes(range(24)) and sub.signing_key(key_of(64)) == bytes(range(64))


def test_destinations_by_host_list_scheme_and_address() -> None:
    where = sub.destinations(["hooks.example.org", ".alerts.example.net"], [], plain_http=False)
    assert where.url_refusal("https://hooks.example.org/x") is None
    assert where.url_refusal("https://a.alerts.example.net:8443/x") is None
    assert where.url_refusal("https://HOOKS.example.org./x") is None
    not_listed = "host {} is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)"
    credentials = "a URL with a host and no credentials"
    for url, why in (
        ("http://hooks.example.org/x", "the scheme must be https"),
        ("ftp://hooks.example.org/x", "the scheme must be https"),
        ("https://evil.example.org/x", not_listed.format("evil.example.org")),
        ("https://alerts.example.net.evil.io/x", not_listed.format("alerts.example.net.evil.io")),
        ("https://xalerts.example.net/x", not_listed.format("xalerts.example.net")),
        ("https://127.0.0.1/x", not_listed.format("127.0.0.1")),
        ("https://169.254.169.254/latest", not_listed.format("169.254.169.254")),
        ("https://u:p@hooks.example.org/x", credentials),
        ("https://u@hooks.example.org/x", credentials),
        ("https://:p@hooks.example.org/x", credentials),
        ("https:///x", credentials),
        ("https://[::1/x", "not a URL"),
        ("https://hooks.example.org:99999/x", "not a URL"),
    ):
        assert where.url_refusal(url) == why, url
    for address in ("127.0.0.1", "10.0.0.80", "169.254.169.254", "192.168.1.1", "::1", "fe80::1",
                    "::ffff:127.0.0.1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "fd00::1"):  # fmt: skip
        assert where.address_refusal(address) is not None, address
    assert where.address_refusal("93.184.216.34") is None and where.address_refusal("2606:4700::1111") is None
    local = sub.destinations(["127.0.0.1"], ["127.0.0.1/8"], plain_http=True)  # host bits set: the network
    assert local.url_refusal("http://127.0.0.1:9999/hook") is None
    assert local.address_refusal("127.0.0.1") is None and local.address_refusal("10.0.0.1") is not None


def test_a_subscriptions_spec_and_status_are_read_from_its_resource() -> None:
    spec = {"url": "https://a.example.org/h", "secretRef": {"key": "k"}, "states": ["SCAN_HAS_FINAL_RESULT"]}
    obj = {"spec": spec, "status": {"announced": {"s1": 3}, "delivered": 2}}
    read = sub.spec_of(obj)
    assert (read.url, read.secret_ref.key, read.states) == (spec["url"], "k", spec["states"])
    for missing in ({}, {"spec": None}, {"SPEC": spec}):
        with pytest.raises(ValueError):
            sub.spec_of(missing)
    status = sub.status_of(obj)
    assert status is not None and (status.announced, status.delivered) == ({"s1": 3}, 2)
    assert sub.status_of({"spec": spec}) is None and sub.status_of({"spec": spec, "status": {}}) is None
