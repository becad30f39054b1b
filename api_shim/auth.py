"""Who is calling: pluggable authenticators, and the static token file used for now.

An `Authenticator` turns a bearer token into an `Identity` (name + roles) or None. The roles are
the reference service's: `user` (people, clients) and `system` (the scanner, the operator).
OIDC JWTs or Kubernetes TokenReview can be added as further authenticators without touching routes.

Token file format (JSON): `{"<sha256 hex of the token>": {"name": "alice", "roles": ["user"]}}`.
Only hashes are stored; `skyscan-shim make-token` prints a new token once and records its hash.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

USER = "user"
SYSTEM = "system"
ROLES = (USER, SYSTEM)


@dataclass(frozen=True)
class Identity:
    name: str
    roles: frozenset[str]
    scan_id: str | None = None  # set: the identity acts only on this scan (a scanner's credential)


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Identity | None: ...


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class StaticTokens:
    def __init__(self, entries: dict[str, Identity]) -> None:
        self._by_hash = entries

    @classmethod
    def load(cls, path: Path) -> StaticTokens:
        raw = json.loads(path.read_text()) if path.exists() else {}
        return cls(
            {h: Identity(name=e["name"], roles=frozenset(e["roles"]) & set(ROLES)) for h, e in raw.items()}
        )

    async def authenticate(self, token: str) -> Identity | None:
        return self._by_hash.get(token_hash(token))


class AllowAll:
    """Local development without tokens: every caller is a user and the system."""

    async def authenticate(self, token: str) -> Identity | None:
        return Identity(name="anonymous", roles=frozenset(ROLES))


async def identify(authenticators: list[Authenticator], header: str | None) -> Identity | None:
    token = ""
    if header and header.lower().startswith("bearer "):
        token = header[7:].strip()
    for authenticator in authenticators:
        if isinstance(authenticator, AllowAll) or token:
            identity = await authenticator.authenticate(token)
            if identity:
                return identity
    return None


def make_token(path: Path, name: str, roles: list[str]) -> str:
    """Add a new random token for `name` to the token file; return the token (shown once)."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles: {sorted(unknown)} (known: {', '.join(ROLES)})")
    token = secrets.token_urlsafe(32)
    entries = json.loads(path.read_text()) if path.exists() else {}
    entries[token_hash(token)] = {"name": name, "roles": sorted(set(roles))}
    path.write_text(json.dumps(entries, indent=2) + "\n")
    path.chmod(0o600)
    return token
