"""Bearer JWTs from OpenID Connect issuers: discovery, JWKS, signature and claim checks (PyJWT).

People sign in at an OIDC provider (Keycloak in production) and send its access token; the shim
verifies it here and `auth.OIDCPeople` maps the verified claims to the roles `user` and `system`.
Verification and role mapping are separate, so the same verifier checks any issuer's tokens, for
example the cluster's own service-account tokens (its API server is an OIDC issuer too).

The API (what `auth.OIDCPeople` uses, and what other authenticators may reuse):

    verifier = OIDCVerifier([IssuerConfig(issuer="https://kc.example/realms/r", audience="skyscan")],
                            leeway=30.0)
    claims = await verifier.claims(token)    # the verified claims (read-only), or None
    config = verifier.config(claims["iss"])  # the IssuerConfig (or subclass) that verified them

    OIDCVerifier(issuers: Iterable[IssuerConfig | Issuer], *, leeway=30.0, refetch_interval=30.0,
                 jwks_max_age=600.0, cache_size=10_000, clock=time.monotonic, now=time.time)
    Issuer(config: IssuerConfig, *, refetch_interval=30.0, jwks_max_age=600.0, clock=time.monotonic)

An `Issuer` (or subclass, e.g. one fetching through the Kubernetes API client by overriding
`_get_json`) may be passed instead of its config; it keeps its own fetch options.

- `IssuerConfig` says where an issuer is and what it must sign: `issuer` (equal to the token's `iss`
  and to the discovery document's `issuer`), `audience` (one of the token's `aud`), and how to reach
  it: `discovery_url` (default `{issuer}/.well-known/openid-configuration`), `ca_file` (a PEM bundle
  for TLS to it) and `token_file` (a bearer token sent with discovery and JWKS requests; a Kubernetes
  API server asks for one unless anonymous discovery is allowed). `PeopleIssuerConfig` adds the
  claim-to-role mapping that only people's tokens need.
- The JWKS is fetched (asynchronously, httpx) on first use through the discovery document's
  `jwks_uri`, kept, fetched again when it is older than `jwks_max_age`, and when a token names a
  `kid` it lacks (key rotation) — at most once per `refetch_interval` per issuer, whatever the
  number of unknown kids; a failed fetch keeps the keys already known.
- Only asymmetric algorithms verify (RS*, PS*, ES*, EdDSA). The algorithm is the token's `alg` only
  when that is one the JWK's own type (and curve, and `alg` if it names one) allows, and the key is
  bound to it (`jwt.PyJWK(jwk, algorithm)`): `none`, HS* (including HMAC keyed with a public key) and
  an RSA token checked against an EC key are refused before any signature check.
- `exp` is required and checked with `nbf`, `iss` and `aud`, all with `leeway` seconds (default 30)
  of clock skew either way.
- Verified tokens are cached by their sha256 until their `exp` (least recently used first out,
  `cache_size` entries), so a token costs one signature check, not one per request.
- A token is tried only against the issuer its (unverified) `iss` names: no fetch is ever made for
  an issuer that is not configured.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import jwt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api_shim.wire_names import Names

log = logging.getLogger(__name__)

ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
_OKP_CURVES = frozenset({"Ed25519", "Ed448"})
MAX_DOCUMENT_BYTES = 1024 * 1024  # a discovery document or JWKS larger than this is refused
FETCH_TIMEOUT = 10.0
Role = Literal["user", "system", "viewer"]  # auth.ROLES


def _checked_url(url: str) -> str:
    """https, or http to a loopback host (a test or local issuer): keys never travel in the clear."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname:
        if parts.hostname == "localhost":
            return url
        try:
            if ipaddress.ip_address(parts.hostname).is_loopback:
                return url
        except ValueError:
            pass
    raise ValueError(f"{url!r}: an issuer URL must be https (http only to a loopback address)")


def document_url(document: Mapping[str, Any], name: str) -> str | None:
    """The URL a discovery document gives under `name`, if it gives one as `_checked_url` allows."""
    url = document.get(name)
    try:
        return _checked_url(url) if isinstance(url, str) else None
    except ValueError:
        return None


class IssuerConfig(BaseModel):
    """One trusted issuer and how to reach it (verification only; no roles)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(description="Exactly the tokens' `iss` and the discovery document's `issuer`.")
    audience: str = Field(description="A token must name this in its `aud`.")
    discovery_url: str | None = Field(
        default=None,
        description="Where the discovery document is; unset: {issuer}/.well-known/openid-configuration.",
    )
    ca_file: Path | None = Field(
        default=None, description="PEM bundle for TLS to the issuer; unset: the system's CAs."
    )
    token_file: Path | None = Field(
        default=None, description="Bearer token sent with discovery and JWKS requests (read at each fetch)."
    )

    @field_validator("issuer", "discovery_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _checked_url(value)

    @property
    def discovery(self) -> str:
        return self.discovery_url or f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"


def _default_roles() -> dict[Role, list[str]]:
    return {"user": ["skyscan-user"], "system": ["skyscan-system"], "viewer": ["skyscan-viewer"]}


class RoleGrant(BaseModel):
    """A role a token earns when one claim holds one value (the claim path as in `roles_claims`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim: str = Field(min_length=1)
    value: str = Field(min_length=1)
    role: Role


class PeopleIssuerConfig(IssuerConfig):
    """An issuer of people's tokens: which claims carry roles, which values grant `user`, `system`, `viewer`.

    A claim path is dot-separated (`realm_access.roles`, `resource_access.skyscan.roles`, `groups`,
    `sub`); a key that itself contains dots is matched whole. A claim may be a string or a list of
    strings. A token whose claims match no configured value is authenticated with no roles (403).
    `roles_claims` pools the values of every claim it names; `grants` instead ties each role to its own
    (claim, value) pairs, as IceCube's issuer sets them: `users` in one client's roles grants `user`,
    and only `system` in another's grants `system`.
    """

    roles_claims: list[str] = Field(default_factory=lambda: ["realm_access.roles"], min_length=1)
    roles: dict[Role, list[str]] = Field(default_factory=_default_roles)
    grants: list[RoleGrant] = Field(default_factory=list)
    names: Names = Names.INTERFACE  # the wire names answers to its tokens speak (`api_shim.wire_names`)

    @model_validator(mode="after")
    def _one_mapping(self) -> PeopleIssuerConfig:
        if self.grants and {"roles_claims", "roles"} & self.model_fields_set:
            raise ValueError("grants replaces roles_claims and roles: give one or the other")
        return self

    def roles_of(self, claims: Mapping[str, Any]) -> frozenset[str]:
        if self.grants:
            return frozenset(g.role for g in self.grants if g.value in claim_values(claims, g.claim))
        values: set[str] = set()
        for path in self.roles_claims:
            values |= claim_values(claims, path)
        return frozenset(role for role, granted in self.roles.items() if values & set(granted))


def claim_values(claims: Mapping[str, Any], path: str) -> set[str]:
    """The string values at a dotted claim path (a string, or the strings of a list); else none."""
    value = _lookup(claims, path.split("."))
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, str)}
    return set()


def _lookup(node: Any, parts: list[str]) -> Any:
    if not parts:
        return node
    if not isinstance(node, Mapping):
        return None
    for n in range(len(parts), 0, -1):  # the longest key first: client ids may contain dots
        key = ".".join(parts[:n])
        if key in node:
            found = _lookup(node[key], parts[n:])
            if found is not None:
                return found
    return None


def key_algorithms(jwk: Mapping[str, Any]) -> frozenset[str]:
    """The algorithms a JWK may verify: from its type and curve, narrowed to its `alg` if it names one.
    Symmetric (`oct`) keys and encryption keys verify nothing."""
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if jwk.get("use") not in (None, "sig"):
        return frozenset()
    if kty == "RSA":
        by_type = _RSA
    elif kty == "EC" and crv in _EC_CURVES:
        by_type = frozenset({_EC_CURVES[crv]})
    elif kty == "OKP" and crv in _OKP_CURVES:
        by_type = frozenset({"EdDSA"})
    else:
        return frozenset()
    alg = jwk.get("alg")
    return by_type & {alg} if alg is not None else by_type


@dataclass
class _KeySet:
    by_kid: dict[str | None, list[Mapping[str, Any]]]
    fetched_at: float
    bound: dict[tuple[str | None, int, str], jwt.PyJWK] = field(default_factory=dict)

    @classmethod
    def parse(cls, document: Any, fetched_at: float) -> _KeySet:
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise ValueError("a JWKS has a list `keys`")
        by_kid: dict[str | None, list[Mapping[str, Any]]] = {}
        for jwk in document["keys"]:
            if isinstance(jwk, dict) and key_algorithms(jwk):
                kid = jwk.get("kid")
                by_kid.setdefault(kid if isinstance(kid, str) else None, []).append(jwk)
        return cls(by_kid, fetched_at)

    def knows(self, kid: str | None) -> bool:
        return kid in self.by_kid if kid is not None else sum(map(len, self.by_kid.values())) == 1

    def key(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        """The key for a token's kid, bound to the token's alg when that key's type allows it.
        A token without kid uses the set's only key, if it has exactly one."""
        if kid is None:
            candidates = [(k, i, jwk) for k, jwks in self.by_kid.items() for i, jwk in enumerate(jwks)]
            if len(candidates) != 1:
                return None
        else:
            candidates = [(kid, i, jwk) for i, jwk in enumerate(self.by_kid.get(kid, []))]
        for k, i, jwk in candidates:
            if alg in key_algorithms(jwk):
                if (k, i, alg) not in self.bound:
                    self.bound[(k, i, alg)] = jwt.PyJWK(dict(jwk), algorithm=alg)
                return self.bound[(k, i, alg)]
        return None


class Issuer:
    """One issuer's keys: discovery once, the JWKS on first use, when stale, and on unknown kids
    (rate-limited). `fetches` counts the HTTP requests sent (discovery and JWKS).

    A subclass may fetch differently by overriding `_get_json(url)` (return the parsed JSON document,
    raise ValueError/OSError/httpx.HTTPError on failure); an `OIDCVerifier` takes it as it is."""

    def __init__(
        self,
        config: IssuerConfig,
        *,
        refetch_interval: float = 30.0,
        jwks_max_age: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.refetch_interval = refetch_interval
        self.jwks_max_age = jwks_max_age
        self._clock = clock
        self._jwks_uri: str | None = None
        self._keys: _KeySet | None = None
        self._attempted_at: float | None = None
        self._lock = asyncio.Lock()
        self._document: Mapping[str, Any] | None = None  # the discovery document, once fetched
        self._discovered_at: float | None = None  # when `discovery()` last tried
        self.fetches = 0

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        keys = self._keys
        if keys is None or self._clock() - keys.fetched_at > self.jwks_max_age:
            await self._refresh(self._attempted_at)
        elif not keys.knows(kid):
            await self._refresh(self._attempted_at)  # a new signing key, perhaps: rate-limited
        return self._keys.key(kid, alg) if self._keys else None

    async def _refresh(self, seen: float | None) -> None:
        """Fetch the JWKS, unless another task did while this one waited (`seen` is the attempt this
        one saw) or the last attempt is less than `refetch_interval` old."""
        async with self._lock:
            now = self._clock()
            if self._attempted_at != seen:
                return
            if self._attempted_at is not None and now - self._attempted_at < self.refetch_interval:
                return
            self._attempted_at = now
            try:
                if self._jwks_uri is None:
                    self._document = self._document or self._discovered(
                        await self._get_json(self.config.discovery)
                    )
                    self._jwks_uri = self._jwks_uri_of(self._document)
                self._keys = _KeySet.parse(await self._get_json(self._jwks_uri), now)
            except (httpx.HTTPError, OSError, ValueError) as e:
                log.warning("OIDC issuer %s: cannot fetch its keys: %s", self.config.issuer, e)

    async def discovery(self) -> Mapping[str, Any] | None:
        """The issuer's discovery document (read-only; it names this issuer), fetched once and kept; None
        while it cannot be fetched (tried again at most once per `refetch_interval`). The keys' own
        fetch shares it."""
        if self._document is None:
            async with self._lock:
                now = self._clock()
                late = self._discovered_at is None or now - self._discovered_at >= self.refetch_interval
                if self._document is None and late:
                    self._discovered_at = now
                    try:
                        self._document = self._discovered(await self._get_json(self.config.discovery))
                    except (httpx.HTTPError, OSError, ValueError) as e:
                        log.warning("OIDC issuer %s: no discovery document: %s", self.config.issuer, e)
        return self._document

    def _discovered(self, discovery: Any) -> Mapping[str, Any]:
        if not isinstance(discovery, Mapping):
            raise ValueError("the discovery document is not a JSON object")
        if discovery.get("issuer") != self.config.issuer:
            raise ValueError(f"the discovery document names issuer {discovery.get('issuer')!r}")
        return MappingProxyType(discovery)

    def _jwks_uri_of(self, discovery: Any) -> str:
        uri = self._discovered(discovery).get("jwks_uri")
        if not isinstance(uri, str):
            raise ValueError("the discovery document has no jwks_uri")
        return _checked_url(uri)

    async def _get_json(self, url: str) -> Any:
        verify, headers = await asyncio.to_thread(self._connection)
        self.fetches += 1
        async with (
            httpx.AsyncClient(verify=verify, timeout=FETCH_TIMEOUT, headers=headers) as http,
            http.stream("GET", url) as response,
        ):
            response.raise_for_status()
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise ValueError(f"{url}: larger than {MAX_DOCUMENT_BYTES} bytes")
        return json.loads(body)

    def _connection(self) -> tuple[ssl.SSLContext | bool, dict[str, str]]:
        """TLS trust and headers, read from their files at each fetch (tokens rotate)."""
        headers = {"Accept": "application/json, application/jwk-set+json"}  # the API server: the latter
        if self.config.token_file is not None:
            headers["Authorization"] = f"Bearer {self.config.token_file.read_text().strip()}"
        if self.config.ca_file is None:
            return True, headers
        return ssl.create_default_context(cafile=str(self.config.ca_file)), headers


class OIDCVerifier:
    """Verifies bearer JWTs of several issuers and caches the verified ones until they expire.
    `verifications` counts full verifications (cache misses that passed)."""

    def __init__(
        self,
        issuers: Iterable[IssuerConfig | Issuer],
        *,
        leeway: float = 30.0,
        refetch_interval: float = 30.0,
        jwks_max_age: float = 600.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.leeway = leeway
        self.cache_size = cache_size
        self._now = now
        self.issuers: dict[str, Issuer] = {}
        for item in issuers:
            issuer = (
                item
                if isinstance(item, Issuer)  # built by the caller, with its own fetch options
                else Issuer(item, refetch_interval=refetch_interval, jwks_max_age=jwks_max_age, clock=clock)
            )
            if issuer.config.issuer in self.issuers:
                raise ValueError(f"issuer {issuer.config.issuer} is configured twice")
            self.issuers[issuer.config.issuer] = issuer
        self._cache: OrderedDict[bytes, tuple[Mapping[str, Any], float]] = OrderedDict()
        # Tokens naming an issuer not configured here (another authenticator's, e.g. a scanner's):
        # remembered, so each costs one parse, not one per request.
        self._foreign: OrderedDict[bytes, None] = OrderedDict()
        self.verifications = 0

    def config(self, iss: str) -> IssuerConfig:
        """The configuration of a configured issuer (e.g. the `iss` of verified claims)."""
        return self.issuers[iss].config

    async def claims(self, token: str) -> Mapping[str, Any] | None:
        """The token's verified claims (read-only), or None if no configured issuer vouches for it."""
        digest = hashlib.sha256(token.encode()).digest()
        if digest in self._foreign:
            return None
        hit = self._cache.get(digest)
        if hit is not None:
            if self._now() < hit[1]:
                self._cache.move_to_end(digest)
                return hit[0]
            del self._cache[digest]
        claims = await self._verify(token, digest)
        if claims is not None:
            expires = float(claims["exp"])
            if self._now() < expires and self.cache_size > 0:
                self._cache[digest] = (claims, expires)
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return claims

    async def _verify(self, token: str, digest: bytes) -> Mapping[str, Any] | None:
        try:
            unverified = jwt.decode_complete(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return None
        header, payload = unverified["header"], unverified["payload"]
        iss, alg, kid = payload.get("iss"), header.get("alg"), header.get("kid")
        issuer = self.issuers.get(iss) if isinstance(iss, str) else None
        if issuer is None:
            self._foreign[digest] = None
            if len(self._foreign) > self.cache_size:
                self._foreign.popitem(last=False)
            return None
        if alg not in ALLOWED_ALGORITHMS or not isinstance(kid, str | None):
            return None
        key = await issuer.key(kid, alg)
        if key is None:
            log.debug("OIDC token of %s refused: no key %r for %s", iss, kid, alg)
            return None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=issuer.config.audience,
                issuer=issuer.config.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as e:
            log.debug("OIDC token of %s refused: %s", iss, e)
            return None
        self.verifications += 1
        return MappingProxyType(claims)
