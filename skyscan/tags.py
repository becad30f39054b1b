"""Image tags: the skymap-scanner tag catalog, and the two ways a tag is held to it.

The catalog is a CVMFS-style directory whose entries are named `skymap_scanner:<tag>`, plus an
optional list from settings (`SKYSCAN_TAG_CATALOG_DIR`, `SKYSCAN_TAGS`; the shim and the operator
read the same). REST resolves a requested tag (`resolve_tag`): a present tag is used as given;
`latest`, `X` and `X.Y` pick the newest matching `X.Y.Z`; a semver tag older than the minimum
(`SKYSCAN_MIN_TAG`) is refused; anything else is unknown. What it stores is always a tag the catalog
lists, so the operator holds a stored tag (a Scan made with kubectl skips REST) to exactly that
(`check_tag`).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Collection, Iterable
from pathlib import Path

IMAGE_PREFIX = "skymap_scanner:"
DEFAULT_MIN_TAG = "4.0.0"
# A tag is the part of an image reference after its ':'; these would make it a digest
# (`4.2.1@sha256:...`) or another image (`evil/image:tag`).
NOT_IN_A_TAG = ("@", ":", "/")
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_PARTIAL = re.compile(r"^\d+(\.\d+)?$")
_V_PREFIXED = re.compile(r"^[vV](\d.*)$")


class TagError(ValueError):
    """The tag cannot be used; str(e) is the client-visible reason."""


def semver(tag: str) -> tuple[int, int, int] | None:
    m = _SEMVER.match(tag)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def strip_v(tag: str) -> str:
    m = _V_PREFIXED.match(tag.strip())
    return m.group(1) if m else tag.strip()


def _older_than_minimum(tag: str, min_tag: str) -> bool:
    """A semver tag older than the minimum (a tag that is no semver has no age)."""
    version, minimum = semver(tag), semver(strip_v(min_tag))
    return bool(version and minimum and version < minimum)


def _too_old(min_tag: str) -> TagError:
    return TagError(
        f"argument docker_tag: Image tag is older than the minimum supported tag "
        f"'v{strip_v(min_tag)}'. Contact admins for more info."
    )


def resolve_tag(requested: str, catalog: Iterable[str], min_tag: str) -> str:
    tags = set(catalog)
    tag = strip_v(requested)
    if not tag:
        raise TagError("argument docker_tag: image not found")
    if tag in tags:
        resolved = tag
    elif tag == "latest" or _PARTIAL.match(tag):
        prefix = "" if tag == "latest" else tag + "."
        candidates = [t for t in tags if semver(t) and t.startswith(prefix)]
        if not candidates:
            raise TagError("argument docker_tag: image not found")
        resolved = max(candidates, key=lambda t: semver(t) or (0, 0, 0))
    else:
        raise TagError("argument docker_tag: image not found")
    if _older_than_minimum(resolved, min_tag):
        raise _too_old(min_tag)
    return resolved


def check_tag(tag: str, catalog: Collection[str], min_tag: str) -> None:
    """Raise TagError unless `tag`, as stored in a Scan, is one REST could have stored: exactly a tag the
    catalog lists (REST resolves `latest`, `4`, `4.2` and a leading `v` before storing), at or above the
    minimum, and never a digest or another image's name."""
    if any(c in tag for c in NOT_IN_A_TAG):
        raise TagError(
            f"'{tag}' is not an image tag: a tag has no '@', ':' or '/' (no digest, no other image)"
        )
    if strip_v(tag) != tag or tag not in catalog:
        raise TagError(
            f"'{tag}' is not a tag of the catalog (SKYSCAN_TAGS, SKYSCAN_TAG_CATALOG_DIR); "
            "a scan names one of its tags exactly"
        )
    if _older_than_minimum(tag, min_tag):
        raise TagError(f"'{tag}' is older than the minimum supported tag 'v{strip_v(min_tag)}'")


def read_catalog_dir(directory: Path) -> set[str]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {n[len(IMAGE_PREFIX) :] for n in names if n.startswith(IMAGE_PREFIX)}


class TagCatalog:
    """The configured tags; the directory is re-read at most every `ttl` seconds, off the event loop."""

    def __init__(self, directory: Path | None, listed: Iterable[str], ttl: float = 5.0) -> None:
        self._directory = directory
        self._listed = {strip_v(t) for t in listed}
        self._ttl = ttl
        self._cached: set[str] = set()
        self._read_at = -float("inf")

    async def tags(self) -> set[str]:
        if self._directory is None:
            return self._listed
        if time.monotonic() - self._read_at > self._ttl:
            self._cached = await asyncio.to_thread(read_catalog_dir, self._directory)
            self._read_at = time.monotonic()
        return self._cached | self._listed
