"""Presigned startup.json URLs: one scan, one expiry, nothing else verifies."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlsplit

import pytest

from skyscan import presign

KEY = b"k" * 32
SCAN = "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0"
NOW = 1_800_000_000.0


def parts(url: str) -> tuple[str, int, str]:
    split = urlsplit(url)
    query = parse_qs(split.query)
    return split.path, int(query["expires"][0]), query["signature"][0]


def test_a_url_verifies_for_its_scan_until_it_expires() -> None:
    url = presign.url("http://shim:8080/", SCAN, int(NOW) + 60, KEY)
    assert url.startswith(f"http://shim:8080/scan/{SCAN}/startup.json?expires={int(NOW) + 60}&signature=")
    path, expires, signature = parts(url)
    assert path == f"/scan/{SCAN}/startup.json" and len(signature) == 64
    assert presign.verify(KEY, SCAN, expires, signature, NOW)
    assert presign.verify(KEY, SCAN, expires, signature, expires)  # valid through its last second
    assert not presign.verify(KEY, SCAN, expires, signature, expires + 0.001)  # expired


def test_tampering_another_scan_or_another_key_fails() -> None:
    expires = int(NOW) + 60
    signature = presign.sign(KEY, SCAN, expires)
    assert not presign.verify(KEY, SCAN, expires + 3600, signature, NOW)  # a later expiry
    assert not presign.verify(KEY, SCAN[:-1] + "1", expires, signature, NOW)  # another scan's id
    other = presign.sign(KEY, "another-scan", expires)
    assert not presign.verify(KEY, SCAN, expires, other, NOW)  # another scan's signature
    assert not presign.verify(b"x" * 32, SCAN, expires, signature, NOW)  # another key
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    for bad in (flipped, signature.upper(), signature[:-2], "", "é" * 64, signature + "00"):
        assert not presign.verify(KEY, SCAN, expires, bad, NOW), bad


def test_signed_appends_to_any_location() -> None:
    assert (
        presign.signed("https://x/s.json", KEY, SCAN, 5) == f"https://x/s.json?{presign.query(KEY, SCAN, 5)}"
    )
    assert presign.signed("https://x/s.json?a=1", KEY, SCAN, 5).startswith("https://x/s.json?a=1&expires=5&")


def test_keys_are_checked() -> None:
    assert presign.check_key(b"  " + KEY + b"\n") == KEY
    with pytest.raises(ValueError, match="at least 32 bytes"):
        presign.check_key(b"short\n")


def test_the_signature_is_hmac_sha256_of_the_context_scan_and_expiry_one_a_line() -> None:
    # The operator signs and the shim verifies: two versions of either must agree on the message.
    key = b"k" * 32
    message = b"skyscan-startup-json-v1\nscan-1\n1700000000"
    assert presign.sign(key, "scan-1", 1_700_000_000) == hmac.new(key, message, hashlib.sha256).hexdigest()


def test_the_url_escapes_the_scan_id_whole_and_drops_only_trailing_slashes() -> None:
    got = presign.url("https://shim.example/rootX//", "a/b", 5, b"k" * 32)
    assert got.startswith("https://shim.example/rootX/scan/a%2Fb/startup.json?expires=5&signature=")
