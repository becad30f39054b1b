"""Subscriptions to scan events through REST: `POST /subscriptions`, `GET /subscriptions`,
`DELETE /subscriptions/{subscription_id}`, each person's own only (`skyscan.subscription`).

A subscription is a `ScanSubscription` the operator delivers (`skyscan_operator.webhooks`). Its signing
secret is handed over in the new subscription's spec; the operator moves it into the one webhook
Secret, which the shim can neither read nor write (a write's answer would carry the Secret back), and
removes it from the spec: a shim's token never reads another subscription's secret.
Who made a subscription is in its spec (`owner`) and, as a digest, a label the listing selects on.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any

from aiohttp import web

from api_shim import rest_models
from api_shim.errors import bad_request, not_found
from api_shim.plumbing import IDENTITY, SHIM, ok, parse_body
from skyscan import names
from skyscan import subscription as sub
from skyscan.io import kube
from skyscan.io.kube_errors import NotFound
from skyscan.names import is_object_name

OWNER_LABEL = "skyscan.io/owner"
KEY_BYTES = 32  # of a secret made for a subscription that brought none


def owner_label(name: str) -> str:
    """A label value for a person's name (any text): its digest."""
    return hashlib.sha256(name.encode()).hexdigest()[:40]


def view(obj: dict[str, Any], secret: str | None = None) -> dict[str, Any]:
    spec = sub.spec_of(obj)
    status = sub.status_of(obj) or sub.SubscriptionStatus()
    last = status.last_delivery
    return {
        "id": obj["metadata"]["name"],
        "url": spec.url,
        "states": spec.states,
        "scan_ids": spec.scan_ids,
        "classifiers": spec.classifiers,
        "created": obj["metadata"].get("creationTimestamp", ""),
        "pending": status.backlog,
        "delivered": status.delivered,
        "failures": status.failures,
        "given_up": status.given_up,
        "last_delivery": None if last is None else last.model_dump(),
        **({"secret": secret} if secret else {}),
    }


def _owner(obj: dict[str, Any]) -> str | None:
    """Who made a subscription through REST; None for one that is no subscription of ours."""
    try:
        return sub.spec_of(obj).owner
    except ValueError:
        return None


async def subscribe(request: web.Request) -> web.Response:
    shim, body = request.app[SHIM], await parse_body(request, rest_models.SubscribeBody)
    if refusal := shim.settings.webhook_destinations().url_refusal(body.url):
        raise bad_request(f"url: {refusal}")
    made = body.secret is None
    secret = body.secret or sub.SECRET_PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()
    try:
        sub.signing_key(secret)
    except ValueError as e:
        raise bad_request(f"secret: {e}") from None
    name = f"sub-{secrets.token_hex(8)}"
    owner = request[IDENTITY].name
    spec = sub.SubscriptionSpec(
        url=body.url,
        secret_ref=sub.SecretRef(key=name),
        states=body.states,
        scan_ids=body.scan_ids,
        classifiers=body.classifiers,
        owner=owner,
        secret=secret,  # the operator moves it into the webhook Secret, which the shim cannot reach
    )
    obj = {
        "apiVersion": sub.API_VERSION,
        "kind": sub.KIND,
        "metadata": {"name": name, "labels": {OWNER_LABEL: owner_label(owner), **names.MANAGED_BY}},
        "spec": spec.to_kube(),
    }
    created = await shim.api.request("POST", kube.path(sub.API_VERSION, sub.PLURAL, shim.namespace), body=obj)
    return ok(view(created, secret if made else None))


async def _own(request: web.Request) -> list[dict[str, Any]]:
    shim, owner = request.app[SHIM], request[IDENTITY].name
    found = await shim.api.request(
        "GET",
        kube.path(sub.API_VERSION, sub.PLURAL, shim.namespace),
        params={"labelSelector": f"{OWNER_LABEL}={owner_label(owner)}"},
    )
    return [o for o in found.get("items", []) if _owner(o) == owner]


async def subscriptions(request: web.Request) -> web.Response:
    mine = sorted(
        await _own(request), key=lambda o: (o["metadata"].get("creationTimestamp", ""), o["metadata"]["name"])
    )
    return ok({"subscriptions": [view(o) for o in mine]})


async def unsubscribe(request: web.Request) -> web.Response:
    shim, name = request.app[SHIM], request.match_info["subscription_id"]
    path = kube.path(sub.API_VERSION, sub.PLURAL, shim.namespace, name)
    try:
        obj = await shim.api.request("GET", path) if is_object_name(name) else None  # no other name is one
    except NotFound:
        obj = None
    if obj is None or _owner(obj) != request[IDENTITY].name:
        raise not_found("subscription")  # another's is not told apart from none
    try:
        await shim.api.request("DELETE", path, body={"preconditions": {"uid": obj["metadata"]["uid"]}})
    except NotFound:
        raise not_found("subscription") from None
    return ok(view(obj))  # the operator takes its key out of the webhook Secret
