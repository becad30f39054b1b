"""Each scanner's credential, end to end: it works on its own scan's routes only, no Job or Pod carries
one that works elsewhere (the audit script over `kubectl get jobs,pods -o json`), and it stops working
once its scan is deleted through REST."""

from __future__ import annotations

import asyncio
import base64
import json
import sys

import httpx

from tests.e2e.conftest import LONG_NSIDES, REPO, Rest, Stack, kubectl, workers_held
from tests.e2e.test_actions import in_progress


async def scanner_token(stack: Stack, scan_id: str) -> str:
    secret = json.loads(await kubectl(stack, "get", "secret", f"skyscan-{scan_id}-scanner", "-o", "json"))
    return base64.b64decode(secret["data"]["token"]).decode()


async def as_scanner(rest: Rest, token: str, method: str, path: str, body: object = None) -> httpx.Response:
    return await rest.http.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})


async def test_a_scanner_credential_works_on_its_own_scan_only_and_dies_with_it(
    rest: Rest, stack: Stack
) -> None:
    with workers_held(stack):
        await both_scanners_checked(rest, stack)


async def both_scanners_checked(rest: Rest, stack: Stack) -> None:
    a, b = await rest.launch(nsides=LONG_NSIDES), await rest.launch(nsides=LONG_NSIDES)
    for scan_id in (a, b):
        await rest.wait_status(scan_id, in_progress)

    audit = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "tools" / "identity_audit.py"), "--namespace", stack.namespace,
        "--url", stack.url, "--kubeconfig", stack.kubeconfig,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await asyncio.wait_for(audit.communicate(), timeout=120))[0].decode()
    assert audit.returncode == 0, out
    assert f"works on ['{a}']" in out and f"works on ['{b}']" in out, out  # each found, each its own

    token = await scanner_token(stack, a)
    assert (await as_scanner(rest, token, "PATCH", f"/scan/{a}/manifest", {})).status_code == 200
    assert (await as_scanner(rest, token, "GET", f"/scan/{a}/status")).status_code == 200
    for method, path, body in [
        ("PATCH", f"/scan/{b}/manifest", {"scan_metadata": {"forged": 1}}),
        ("PUT", f"/scan/{b}/result", {"scan_result": {"forged": 1}, "is_final": False}),
        ("GET", f"/scan/{b}/manifest", None),
        ("POST", "/scans/find", {"filter": {}}),
    ]:
        refused = await as_scanner(rest, token, method, path, body)
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["reason"] == "authorization failed"

    await rest.ok("DELETE", f"/scan/{a}", json={})
    after = await as_scanner(rest, token, "PATCH", f"/scan/{a}/manifest", {})
    assert after.status_code in (401, 403), after.text
    # ... and its Secret goes, so the token no longer validates anywhere.
    await rest.wait_status(a, lambda s: s["wms_deactivated"] == "ABORTED", timeout=30)
