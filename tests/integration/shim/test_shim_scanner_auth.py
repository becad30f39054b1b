"""Scanner credentials at the shim: real service-account tokens from the TokenRequest API, bound to a
scan's Secret as the operator mints them, verified against the cluster's own OIDC issuer."""

from __future__ import annotations

import base64
import json
from typing import Any

from api_shim.auth import SYSTEM
from api_shim.plumbing import Route
from api_shim.routes import ROUTES
from skyscan import names
from skyscan.io.kube import core_path
from tests.integration.shim.conftest import ShimUnderTest

RUNNING = {"job": {"name": "j", "state": "Running"}}


async def mint(shim: ShimUnderTest, scan_id: str, *, account: str = names.SCANNER_SERVICE_ACCOUNT,
               audience: str = names.SCANNER_TOKEN_AUDIENCE, secret: str | None = None) -> str:  # fmt: skip
    """A token as the operator mints it: for the scanner account, bound to the scan's Secret."""
    name = secret or names.scanner_token_secret_name(scan_id)
    secrets = core_path("secrets", shim.namespace)
    created = await shim.api.request("POST", secrets, body={"metadata": {"name": name}})
    body = {"spec": {"audiences": [audience], "expirationSeconds": 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": name,
                                        "uid": created["metadata"]["uid"]}}}  # fmt: skip
    accounts = core_path("serviceaccounts", shim.namespace)
    if account != "default" and account not in [
        a["metadata"]["name"] for a in (await shim.api.request("GET", accounts))["items"]
    ]:
        await shim.api.request("POST", accounts, body={"metadata": {"name": account}})
    granted = await shim.api.request("POST", f"{accounts}/{account}/token", body=body)
    token: str = granted["status"]["token"]
    return token


async def running(shim: ShimUnderTest, credential: dict[str, Any] | None = None) -> str:
    scan_id = str((await shim.launch())["scan_id"])
    secret = names.scanner_token_secret_name(scan_id)
    await shim.operator_writes(scan_id, {**RUNNING, "scannerCredential": credential or {"secret": secret}})
    return scan_id


def claims(token: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    return payload


async def test_a_scanner_token_acts_on_its_own_scan_only(shim: ShimUnderTest) -> None:
    a, b = await running(shim), await running(shim)
    token = await mint(shim, a)
    assert claims(token)["kubernetes.io"]["secret"]["name"] == names.scanner_token_secret_name(a)
    own = await shim.call("PATCH", f"/scan/{a}/manifest", as_=token, json_body={"scan_metadata": {"k": 1}})
    assert own.status == 200, own.body
    assert (await shim.call("GET", f"/scan/{a}/status", as_=token)).status == 200
    result = {"scan_result": {"x": 1}, "is_final": False}
    assert (await shim.call("PUT", f"/scan/{a}/result", as_=token, json_body=result)).status == 200
    for method, path, body in [
        ("PATCH", f"/scan/{b}/manifest", {"scan_metadata": {"forged": 1}}),
        ("PUT", f"/scan/{b}/result", result),
        ("GET", f"/scan/{b}/manifest", None),
        ("POST", "/scans/find", {"filter": {}}),
        ("GET", "/scans/backlog", None),
    ]:
        refused = await shim.call(method, path, as_=token, json_body=body)
        assert refused.status == 403, (method, path, refused.body)
        assert refused.body["reason"] == "authorization failed"
    assert (await shim.kube_scan(b))["status"].get("scanMetadata") is None


async def test_a_scanner_token_dies_with_its_scan(shim: ShimUnderTest) -> None:
    a = await running(shim)
    token = await mint(shim, a)
    assert (await shim.call("GET", f"/scan/{a}/status", as_=token)).status == 200
    assert (await shim.call("DELETE", f"/scan/{a}", json_body={})).status == 200  # as the user
    after = await shim.call("PATCH", f"/scan/{a}/manifest", as_=token, json_body={"scan_metadata": {"k": 1}})
    assert after.status == 403 and "revoked" in after.body["message"]


async def test_a_scanner_token_stops_with_its_job_or_a_revoked_credential(shim: ShimUnderTest) -> None:
    a = await running(shim)
    token = await mint(shim, a)
    assert (await shim.call("GET", f"/scan/{a}/status", as_=token)).status == 200
    await shim.operator_writes(a, {"job": {"name": "j", "state": "Succeeded"}})

    def ended(scan: dict[str, Any] | None) -> bool:
        return bool(scan) and scan["status"]["job"]["state"] == "Succeeded"  # type: ignore[index]

    assert await shim.state.scans._cache.wait_for(a, ended, 10) is not None
    assert (await shim.call("GET", f"/scan/{a}/status", as_=token)).status == 403
    b = await running(shim, {"secret": "x", "revoked": True})
    assert (await shim.call("GET", f"/scan/{b}/status", as_=await mint(shim, b))).status == 403


async def test_tokens_that_are_not_a_scans_own_are_not_scanner_credentials(shim: ShimUnderTest) -> None:
    a = await running(shim)
    wrong = {
        "another account": await mint(shim, a, account="default"),
        "another audience": await mint(shim, a, audience="kubernetes", secret="aud-" + a),
        "bound to another secret": await mint(shim, a, secret=f"skyscan-{a}-ewms"),
    }
    for why, token in wrong.items():
        assert (await shim.call("GET", f"/scan/{a}/status", as_=token)).status == 401, why


async def test_a_scanner_token_is_refused_on_every_route_but_its_own_reads_and_reports(
    shim: ShimUnderTest,
) -> None:
    # Every route of the table, so a new route is covered: a scanner reads its scan and writes what
    # only the system writes; it can neither rescan, add workers, delete nor read what only people read.
    a = await running(shim)
    token = await mint(shim, a)

    def scanners(route: Route) -> bool:
        roles = route.roles or frozenset()
        return SYSTEM in roles and (route.method == "GET" or roles == {SYSTEM})

    refused_routes = [r for r in ROUTES if r.roles is not None and not scanners(r)]
    acts = {("POST", "/scan/{scan_id}/actions/rescan"), ("DELETE", "/scan/{scan_id}")}
    acts.add(("POST", "/scan/{scan_id}/actions/add-workers"))
    assert acts <= {(r.method, r.path) for r in refused_routes}
    for route in refused_routes:
        body = None if route.method == "GET" else {}
        refused = await shim.call(
            route.method, route.path.format(scan_id=a, subscription_id="sub-1"), as_=token, json_body=body
        )
        assert refused.status == 403, (route.method, route.path, refused.status, refused.body)
    scan = await shim.kube_scan(a)
    assert not scan["spec"].get("deleted") and not scan["spec"].get("workerRequests")
    assert not scan["spec"].get("replacedBy")
