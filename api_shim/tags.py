"""Image tags: resolve a requested skymap-scanner tag against the tag catalog.

The catalog is a CVMFS-style directory whose entries are named `skymap_scanner:<tag>`, plus an
optional list from settings. A present tag is used as given; `latest`, `X` and `X.Y` pick the newest
matching `X.Y.Z`; a semver tag older than the minimum is refused; anything else is unknown.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

IMAGE_PREFIX = "skymap_scanner:"
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
    version, minimum = semver(resolved), semver(strip_v(min_tag))
    if version and minimum and version < minimum:
        raise TagError(
            f"argument docker_tag: Image tag is older than the minimum supported tag "
            f"'v{strip_v(min_tag)}'. Contact admins for more info."
        )
    return resolved


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
