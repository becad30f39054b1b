"""The worker hand-off through the real shim: PUT /scan/{id}/startup.json (the sidecar, `system`) and the
public, presigned GET the workers use."""

from __future__ import annotations

import base64
import gzip
import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from api_shim import rest_models
from skyscan import names, presign
from skyscan.io import payloads
from skyscan.io.kube import core_path
from tests.integration.shim.conftest import MakeShim, ShimUnderTest

KEY = secrets.token_hex(32).encode()


def startup_json(n: int = 3000) -> bytes:
    """About 300 KB of GCD-like JSON, serialized as a scanner would (not as the shim would)."""
    geometry = [[s, om, s * 1.25, om * -2.5, 500.0 - om] for s in range(86) for om in range(60)]
    pulses = [[i % 86, i % 60, 9000.5 + i, 0.25] for i in range(n)]
    packet = [{"frame_type": "G", "I3Geometry": geometry}, {"frame_type": "P", "pulses": pulses}]
    doc = {"baseline_GCD_file": "/cvmfs/x/baseline_gcd.i3", "GCDQp_packet": packet}
    return json.dumps(doc).encode()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "presign.key"
    path.write_bytes(KEY + b"\n")
    return path


@pytest.fixture
async def shim(make_shim: MakeShim, key_file: Path) -> ShimUnderTest:
    return await make_shim(presign_key_file=key_file)


def presigned(scan_id: str, expires: int | None = None, key: bytes = KEY) -> dict[str, str]:
    expires = int(time.time()) + 600 if expires is None else expires
    return {"expires": str(expires), "signature": presign.sign(key, scan_id, expires)}


async def fetch(shim: ShimUnderTest, scan_id: str, params: dict[str, str]) -> Any:
    """As a worker: no Authorization header at all."""
    return await shim.call("GET", f"/scan/{scan_id}/startup.json", as_=None, params=params)


async def test_the_sidecar_uploads_and_workers_fetch_through_the_presigned_url(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    other_id = (await shim.launch())["scan_id"]
    # A valid URL before the upload: 404, so workers retry.
    reply = await fetch(shim, scan_id, presigned(scan_id))
    assert reply.status == 404 and reply.body["reason"] == "startup.json not uploaded yet"
    rest_models.Error.model_validate(reply.body)

    content = startup_json()
    assert 100_000 < len(content) < 530_000
    reply = await shim.call(
        "PUT", f"/scan/{scan_id}/startup.json", as_="system", data=content,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert reply.status == 200, reply.body
    assert reply.body == {"scan_id": scan_id, "size": len(content)}
    rest_models.StartupStored.model_validate(reply.body)

    # Stored compressed, byte for byte, as a payload object owned by the scan.
    cm = await shim.api.request(
        "GET", core_path("configmaps", shim.namespace, names.startup_object_name(scan_id))
    )
    assert cm["metadata"]["labels"][names.PAYLOAD_LABEL] == "startup"
    (owner,) = cm["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Scan", scan_id)
    stored = gzip.decompress(base64.b64decode(cm["binaryData"][payloads.DATA_KEY]))
    assert stored == content and len(cm["binaryData"][payloads.DATA_KEY]) < len(content) / 2

    reply = await fetch(shim, scan_id, presigned(scan_id))
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("application/json")
    assert reply.body == json.loads(content)
    async with shim.session.get(
        f"{shim.url}/scan/{scan_id}/startup.json", params=presigned(scan_id)
    ) as raw:  # byte for byte, as curl saves it
        assert await raw.read() == content

    # The other scan's URL does not open this scan's file, nor does this scan's open the other's.
    reply = await fetch(shim, scan_id, presigned(other_id))
    assert reply.status == 403 and reply.body["reason"] == "invalid signature"
    reply = await fetch(shim, other_id, presigned(scan_id))
    assert reply.status == 403

    # A new upload replaces the file.
    newer = json.dumps({"baseline_GCD_file": "b", "GCDQp_packet": []}).encode()
    reply = await shim.call("PUT", f"/scan/{scan_id}/startup.json", as_="system", data=newer)
    assert reply.status == 200
    assert (await fetch(shim, scan_id, presigned(scan_id))).body == json.loads(newer)


async def test_bad_tampered_or_expired_urls_are_403(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    content = json.dumps({"GCDQp_packet": [1, 2, 3]}).encode()
    assert (await shim.call("PUT", f"/scan/{scan_id}/startup.json", as_="system", data=content)).status == 200
    good = presigned(scan_id)
    assert (await fetch(shim, scan_id, good)).status == 200
    later = str(int(good["expires"]) + 86400)
    flipped = good["signature"][:-1] + ("0" if good["signature"][-1] != "0" else "1")
    past = int(time.time()) - 1
    cases: list[tuple[dict[str, str], str]] = [
        ({**good, "expires": later}, "invalid signature"),  # a longer life, same signature
        ({**good, "signature": flipped}, "invalid signature"),
        (presigned(scan_id, key=b"another key of at least 32 bytes!!"), "invalid signature"),
        (presigned(scan_id, expires=past), "expired signature"),  # correctly signed, expired
        ({"expires": good["expires"]}, "invalid signature"),
        ({"signature": good["signature"]}, "invalid signature"),
        ({**good, "expires": "soon"}, "invalid signature"),
        ({}, "invalid signature"),
    ]
    for params, reason in cases:
        reply = await fetch(shim, scan_id, params)
        assert reply.status == 403, (params, reply.body)
        assert set(reply.body) == {"error", "reason", "message"} and reply.body["error"] == "Forbidden"
        assert reply.body["reason"] == reason, params
    # A bearer token does not replace the signature.
    reply = await shim.call("GET", f"/scan/{scan_id}/startup.json", as_="system")
    assert reply.status == 403


async def test_uploads_are_checked(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/startup.json"
    reply = await shim.call("PUT", path, as_="system", data=b'{"half": [1, 2')
    assert reply.status == 400 and reply.body["reason"] == "startup.json is not valid JSON"
    reply = await shim.call("PUT", path, as_="system", data=b"[1, 2, 3]")
    assert reply.status == 400 and reply.body["reason"] == "startup.json must be a JSON object"
    # Random text barely compresses: over the payload limit even gzip-compressed.
    huge = json.dumps({"GCDQp_packet": secrets.token_urlsafe(1_600_000)}).encode()
    reply = await shim.call("PUT", path, as_="system", data=huge)
    assert reply.status == 413 and reply.body["reason"] == "startup.json too large", reply.body
    assert (await shim.call("PUT", path, as_="user", data=b"{}")).status == 403  # the scanner's route
    assert (await shim.call("PUT", path, as_="wrong", data=b"{}")).status == 401
    unknown = "/scan/0000000000ax4000000000000000000/startup.json"
    assert (await shim.call("PUT", unknown, as_="system", data=b"{}")).status == 404
    # Nothing was stored by any of these.
    assert (await fetch(shim, scan_id, presigned(scan_id))).status == 404


async def test_without_a_key_every_url_is_refused(make_shim: MakeShim) -> None:
    shim = await make_shim()
    scan_id = (await shim.launch())["scan_id"]
    assert (await shim.call("PUT", f"/scan/{scan_id}/startup.json", as_="system", data=b"{}")).status == 200
    reply = await fetch(shim, scan_id, presigned(scan_id))
    assert reply.status == 403 and reply.body["reason"] == "presigned URLs are not configured"


async def test_the_routes_are_documented(shim: ShimUnderTest) -> None:
    doc = (await shim.call("GET", "/openapi.json", as_=None)).body
    ops = doc["paths"]["/scan/{scan_id}/startup.json"]
    put, get = ops["put"], ops["get"]
    assert put["x-roles"] == ["system"] and put["security"] == [{"bearer": []}]
    assert {"200", "400", "401", "403", "404", "413", "503"} <= set(put["responses"])
    assert put["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/StartupJson")
    assert "security" not in get and "x-roles" not in get  # public: the signature is the credential
    assert {"200", "403", "404"} <= set(get["responses"]) and "401" not in get["responses"]
    query = {p["name"]: p for p in get["parameters"] if p["in"] == "query"}
    assert query["expires"]["required"] and query["expires"]["schema"] == {"type": "integer"}
    assert query["signature"]["required"]
