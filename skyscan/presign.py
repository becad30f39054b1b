"""Presigned URLs for a scan's `startup.json` (pure).

Workers run outside the cluster and hold no Skyscan credential: the WMS hands them, in their init
command, a URL that carries its own authorization, like an S3 presigned GET:

    {rest}/scan/{scan_id}/startup.json?expires=<Unix seconds>&signature=<hex HMAC-SHA256>

The signature is HMAC-SHA256, keyed with the deployment's presign key (`SKYSCAN_PRESIGN_KEY_FILE`,
a mounted Secret shared by the operator, which signs, and the shim, which verifies), over the scan id
and the expiry. So a URL opens exactly one scan's file until its expiry, and changing either makes
it invalid. The operator chooses the expiry (`scanner_job.startup_url_lifetime`): the scanner's whole
possible life, so the URL never outlives its scan by more than that.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

MIN_KEY_BYTES = 32
_CONTEXT = b"skyscan-startup-json-v1"  # domain separation: this key signs nothing else


def check_key(raw: bytes) -> bytes:
    """The key from a key file's bytes (surrounding whitespace, e.g. a trailing newline, dropped);
    a key shorter than `MIN_KEY_BYTES` is refused."""
    key = raw.strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the presign key must have at least {MIN_KEY_BYTES} bytes (it has {len(key)})")
    return key


def sign(key: bytes, scan_id: str, expires: int) -> str:
    message = b"\n".join((_CONTEXT, scan_id.encode(), str(int(expires)).encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def query(key: bytes, scan_id: str, expires: int) -> str:
    return f"expires={int(expires)}&signature={sign(key, scan_id, expires)}"


def signed(location: str, key: bytes, scan_id: str, expires: int) -> str:
    """`location` (any URL that serves this scan's startup.json) with the signature appended."""
    return f"{location}{'&' if '?' in location else '?'}{query(key, scan_id, expires)}"


def url(base: str, scan_id: str, expires: int, key: bytes) -> str:
    """The presigned URL of the scan's startup.json under the REST address `base`."""
    return signed(f"{base.rstrip('/')}/scan/{quote(scan_id, safe='')}/startup.json", key, scan_id, expires)


def verify(key: bytes, scan_id: str, expires: int, signature: str, now: float) -> bool:
    """True only for this scan's signature of this expiry, before that expiry (constant-time compare)."""
    if now > expires or not signature.isascii():
        return False
    return hmac.compare_digest(sign(key, scan_id, expires).encode(), signature.encode())
