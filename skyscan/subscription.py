"""Subscriptions to scan events (pure): the `ScanSubscription` resource, which scan events it wants, the
CloudEvent announcing one, its Standard Webhooks signature, and where a delivery may go.

A scan event is a scan entering a state (`scan_state`) a subscription names, each state named whole
(`SCAN_HAS_FINAL_RESULT`) or by either half (`ABORTED` is every aborted scan, whatever its stage). The
event is on record before it is first tried: it is a transition the Scan holds (`status.transitions`,
written by the operator), and its id (`event_id`) follows from the subscription and that transition, so
the same event keeps its id however often it is tried, whichever operator replica tries it, and a
receiver drops repeats by `webhook-id`.

The signature follows the Standard Webhooks convention: the secret is `whsec_` and the base64 of its
key; `webhook-signature` is `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` under that key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field

from skyscan.model import GROUP, VERSION, FreeForm, KubeModel

API_VERSION = f"{GROUP}/{VERSION}"

KIND = "ScanSubscription"
PLURAL = "scansubscriptions"
SINGULAR = "scansubscription"
SHORT_NAMES = ["ssub"]
SECRET_NAME = "skyscan-webhook-secrets"  # one Secret, a key per subscription: the operator's alone
SECRET_PREFIX = "whsec_"
EVENT_TYPE = "io.skyscan.scan.state"
MAX_SCAN_IDS, MAX_STATES, MAX_CLASSIFIERS = 100, 20, 25
StateName = Annotated[str, Field(pattern=r"^[A-Z_]{1,64}$")]
ScanId = Annotated[str, Field(min_length=1, max_length=253)]
KEY_BYTES = (24, 64)  # a signing key's length, within these


class SecretRef(KubeModel):
    name: str = Field(
        default=SECRET_NAME, description=f"The Secret holding the signing secret: {SECRET_NAME}."
    )
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class SubscriptionSpec(KubeModel):
    """Which scan events to deliver where, signed with which secret."""

    url: str = Field(
        min_length=1, max_length=2048, description="The receiver: an https URL on an allowed host."
    )
    secret_ref: SecretRef
    states: list[StateName] = Field(
        min_length=1, max_length=MAX_STATES, description="States (whole, or either half) to announce."
    )
    scan_ids: list[ScanId] = Field(
        default_factory=list, max_length=MAX_SCAN_IDS, description="Only these scans."
    )
    classifiers: FreeForm = Field(
        default_factory=dict,
        max_length=MAX_CLASSIFIERS,
        description="Only scans with each of these classifiers.",
    )
    owner: str = Field(
        default="", max_length=256, description="Who made it through REST (they alone see it)."
    )
    secret: str | None = Field(
        default=None,
        max_length=200,
        description="A signing secret handed over at creation: the operator moves it into the webhook Secret "
        "(the key secretRef names) and removes it from here.",
    )


class LastDelivery(KubeModel):
    event_id: str
    scan_id: str
    state: str
    at: float  # Unix seconds of the last attempt
    attempts: int
    result: str  # "delivered", "HTTP 503", "refused: ...", "gave up: ..."


class PendingEvent(KubeModel):
    """An event not yet delivered: a scan's transition a subscription wants."""

    id: str
    scan_id: str
    seq: int  # the transition's
    state: str
    time: float  # Unix seconds: when the transition was recorded
    data: FreeForm | None = None  # the CloudEvent's data (None until it is read from the Scan)
    attempts: int = 0


class SubscriptionStatus(KubeModel):
    announced: dict[str, int] = Field(
        default_factory=dict,
        description="Each scan's last transition (its seq) delivered or given up (scan id -> seq).",
    )
    last_delivery: LastDelivery | None = None
    delivered: int = 0
    failures: int = 0  # attempts that failed
    given_up: int = 0
    backlog: int = Field(default=0, description="Events pending (kubectl get).")


def spec_of(obj: Mapping[str, Any]) -> SubscriptionSpec:
    """A ScanSubscription's spec, checked (ValueError when it is not one)."""
    return SubscriptionSpec.model_validate(obj.get("spec") or {})  # raw: ScanSubscription


def status_of(obj: Mapping[str, Any]) -> SubscriptionStatus | None:
    """A ScanSubscription's status; None before the operator first wrote one (not taken up yet)."""
    found = obj.get("status")  # raw: ScanSubscription
    return SubscriptionStatus.model_validate(found) if found else None


def wants_state(states: Iterable[str], state: str) -> bool:
    """Whether `state` is one of `states`, each whole or either half of one."""
    wanted = set(states)
    return state in wanted or bool(set(state.split("__")) & wanted)


def wants_scan(spec: SubscriptionSpec, scan_id: str, classifiers: Mapping[str, Any]) -> bool:
    if spec.scan_ids and scan_id not in spec.scan_ids:
        return False
    return all(k in classifiers and classifiers[k] == v for k, v in spec.classifiers.items())


def event_id(subscription_uid: str, scan_id: str, seq: int) -> str:
    """An event's id: the subscription's, the scan's and its transition's number (a scan entering a
    state again is a new transition, so a new event)."""
    text = f"{subscription_uid}\0{scan_id}\0{seq}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cloud_event(namespace: str, event: PendingEvent) -> bytes:
    """The CloudEvents 1.0 structured-mode JSON of `event`."""
    body = {
        "specversion": "1.0",
        "type": EVENT_TYPE,
        "source": f"/skyscan/{namespace}/scans",
        "id": event.id,
        "time": datetime.fromtimestamp(event.time, UTC).isoformat().replace("+00:00", "Z"),
        "subject": event.scan_id,
        "datacontenttype": "application/json",
        "data": event.data,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def signing_key(secret: str) -> bytes:
    """The key of a Standard Webhooks secret (`whsec_` + base64); ValueError if it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a signing secret begins with {SECRET_PREFIX}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError(f"a signing secret is {SECRET_PREFIX} and base64") from None
    if not KEY_BYTES[0] <= len(key) <= KEY_BYTES[1]:
        raise ValueError(f"a signing key has {KEY_BYTES[0]} to {KEY_BYTES[1]} bytes")
    return key


def signature_headers(key: bytes, event_id_: str, timestamp: int, body: bytes) -> dict[str, str]:
    signed = f"{event_id_}.{timestamp}.".encode() + body
    digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {"webhook-id": event_id_, "webhook-timestamp": str(timestamp), "webhook-signature": f"v1,{digest}"}


# Where a delivery may go ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Destinations:
    """The receivers a deployment allows: hosts by name or suffix (`.example.org`), and networks an
    address may be in although it is loopback, private, link-local or otherwise not public."""

    hosts: tuple[str, ...]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    plain_http: bool = False  # http allowed (the local stack's receivers), else https only

    def url_refusal(self, url: str) -> str | None:
        """Why `url` may not receive deliveries, or None."""
        try:
            parts = urlsplit(url)
            host, _ = parts.hostname, parts.port
        except ValueError:
            return "not a URL"
        if parts.scheme != "https" and not (parts.scheme == "http" and self.plain_http):
            return "the scheme must be https"
        if not host or parts.username is not None or parts.password is not None:
            return "a URL with a host and no credentials"
        if not self.allows_host(host):
            return f"host {host} is not on the allowed list (SKYSCAN_WEBHOOK_ALLOWED_HOSTS)"
        return None

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == h or (h.startswith(".") and host.endswith(h)) for h in self.hosts)

    def address_refusal(self, address: str) -> str | None:
        """Why a connection to `address` (what the host resolved to) is refused, or None."""
        ip = ipaddress.ip_address(address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in network for network in self.networks):
            return None
        if not ip.is_global or ip.is_multicast:
            return f"address {ip} is not a public one (loopback, private, link-local or reserved)"
        return None


def destinations(hosts: Iterable[str], networks: Iterable[str], plain_http: bool) -> Destinations:
    return Destinations(
        tuple(h.lower().strip() for h in hosts if h.strip()),
        tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks if n.strip()),
        plain_http,
    )
