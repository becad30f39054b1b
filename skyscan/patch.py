"""JSON merge patches (RFC 7386), the patch type of every Scan write."""

from __future__ import annotations

from typing import Any


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The smallest merge patch turning `old` into `new`: changed keys, removed keys as null."""
    patch: dict[str, Any] = {}
    for key in old.keys() | new.keys():
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            patch[key] = merge_patch(before, after)
        else:
            patch[key] = after
    return patch
