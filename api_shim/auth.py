"""Who is calling: pluggable authenticators (OIDC for people, a static token file for local use).

An `Authenticator` turns a bearer token into an `Identity` (name + roles) or None. The roles are
the reference service's, `user` (people, clients) and `system` (the scanner, the operator), and
`viewer`: people who may read everything a user may and change nothing (a shifter who follows scans).
None means "not authenticated" (401); an Identity without roles is authenticated but may use no
route (403).

`OIDCPeople`: people's bearer JWTs, verified by `oidc.OIDCVerifier` against the configured issuers
(Keycloak in production), roles from each issuer's claim mapping, name `preferred_username` else `sub`.

`StaticTokens`, for the local stack only: token file format (JSON)
`{"<sha256 hex of the token>": {"name": "alice", "roles": ["user"], "names": "interface"}}` (`names`,
optional: the wire names its answers speak, `interface` or `reference`). Only hashes are stored;
`skyscan-shim make-token` prints a new token once and records its hash.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from api_shim import oidc
from api_shim.wire_names import Names

USER = "user"
SYSTEM = "system"
VIEWER = "viewer"
ROLES = (USER, SYSTEM, VIEWER)
PEOPLE = frozenset({USER, VIEWER})


@dataclass(frozen=True)
class Identity:
    name: str
    roles: frozenset[str]
    scan_id: str | None = None  # set: the identity acts only on this scan (a scanner's credential)
    names: Names = Names.INTERFACE  # the wire names its answers speak (`api_shim.wire_names`)

    @property
    def is_person(self) -> bool:
        """A person's identity (a user or a viewer), not a scanner's credential nor the system alone."""
        return self.scan_id is None and bool(self.roles & PEOPLE)


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Identity | None: ...


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class StaticTokens:
    """The token file's entries, read once. A token found is remembered as it came (up to `remember`
    of them; a token not found never is), so its next request costs a dictionary lookup, not a hash:
    the entries never change while the shim runs."""

    def __init__(self, entries: dict[str, Identity], remember: int = 1024) -> None:
        self._by_hash = entries
        self._remember = remember
        self._known: dict[str, Identity] = {}

    @classmethod
    def load(cls, path: Path) -> StaticTokens:
        raw = json.loads(path.read_text()) if path.exists() else {}
        return cls(
            {
                h: Identity(
                    name=e["name"],
                    roles=frozenset(e["roles"]) & set(ROLES),
                    names=Names(e.get("names", Names.INTERFACE)),
                )
                for h, e in raw.items()
            }
        )

    async def authenticate(self, token: str) -> Identity | None:
        identity = self._known.get(token)
        if identity is None:
            identity = self._by_hash.get(token_hash(token))
            if identity is not None and len(self._known) < self._remember:
                self._known[token] = identity
        return identity

    @property
    def remembered(self) -> int:
        """Tokens answered without hashing them again."""
        return len(self._known)


class OIDCPeople:
    """People's OIDC bearer JWTs: verified claims mapped to roles by their issuer's configuration."""

    def __init__(self, verifier: oidc.OIDCVerifier) -> None:
        self.verifier = verifier
        # The identity of each cached claims object (the verifier returns the same object while it
        # caches the token), so the role mapping runs once per token too. Holding the claims keeps
        # their id() unique while the entry lives.
        self._identities: OrderedDict[int, tuple[Mapping[str, Any], Identity | None]] = OrderedDict()

    async def authenticate(self, token: str) -> Identity | None:
        if token.count(".") != 2:  # not a JWT (a static token, say): no work
            return None
        claims = await self.verifier.claims(token)
        if claims is None:
            return None
        known = self._identities.get(id(claims))
        if known is not None and known[0] is claims:
            return known[1]
        identity = self.identity(claims)
        self._identities[id(claims)] = (claims, identity)
        if len(self._identities) > self.verifier.cache_size:
            self._identities.popitem(last=False)
        return identity

    def identity(self, claims: Mapping[str, Any]) -> Identity | None:
        config = self.verifier.config(claims["iss"])
        name = claims.get("preferred_username") or claims.get("sub")
        if not isinstance(name, str) or not name:
            return None
        roles = config.roles_of(claims) if isinstance(config, oidc.PeopleIssuerConfig) else frozenset()
        names = config.names if isinstance(config, oidc.PeopleIssuerConfig) else Names.INTERFACE
        return Identity(name=name, roles=roles & set(ROLES), names=names)


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


def make_token(path: Path, name: str, roles: list[str], names: Names = Names.INTERFACE) -> str:
    """Add a new random token for `name` to the token file; return the token (shown once). Its answers
    speak `names` (`api_shim.wire_names`)."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown roles: {sorted(unknown)} (known: {', '.join(ROLES)})")
    token = secrets.token_urlsafe(32)
    entries = json.loads(path.read_text()) if path.exists() else {}
    entries[token_hash(token)] = {"name": name, "roles": sorted(set(roles))}
    if names is not Names.INTERFACE:
        entries[token_hash(token)]["names"] = names.value
    path.write_text(json.dumps(entries, indent=2) + "\n")
    path.chmod(0o600)
    return token
