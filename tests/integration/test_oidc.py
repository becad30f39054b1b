"""People's OIDC tokens against real issuers.

- A Keycloak-shaped issuer: a small aiohttp server on 127.0.0.1 (a free port) serving discovery and
  JWKS for keys made here (RSA, EC, Ed25519), counting the requests it receives.
- The local kube-apiserver: an OIDC issuer for its service-account tokens (TokenRequest API).
- The real shim over HTTP with an OIDC issuer configured.

Time that a test must move (the JWKS rate limit, the token cache) is an injected clock, not a sleep.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from api_shim import auth, oidc
from api_shim.app import create_app
from api_shim.settings import ShimSettings
from skyscan.io.kube import Kube, core_path
from tests.conftest import Cluster

REALM = "/realms/icecube"
CLAIMS = ["realm_access.roles", "resource_access.skyscan.roles", "groups"]
ROLES = {"user": ["skyscan-user", "/icecube/skyscan-users"], "system": ["skyscan-system"]}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str
    private: Any
    jwk: dict[str, Any]  # the public JWK the issuer publishes

    @property
    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def make_key(alg: str = "RS256", *, jwk_names_alg: bool = True) -> SigningKey:
    kid = secrets.token_hex(8)
    private: Any
    if alg.startswith(("RS", "PS")):
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    elif alg.startswith("ES"):
        curve = {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}[alg]
        private = ec.generate_private_key(curve)
        jwk = json.loads(ECAlgorithm.to_jwk(private.public_key()))
    else:
        private = ed25519.Ed25519PrivateKey.generate()
        jwk = json.loads(OKPAlgorithm.to_jwk(private.public_key()))
    jwk = {**jwk, "kid": kid, "use": "sig", **({"alg": alg} if jwk_names_alg else {})}
    return SigningKey(kid, alg, private, jwk)


class LocalIssuer:
    """A Keycloak-shaped OIDC issuer: discovery and JWKS over real HTTP on 127.0.0.1."""

    def __init__(self) -> None:
        self.published: dict[str, dict[str, Any]] = {}
        self.hits: Counter[str] = Counter()
        self.authorizations: list[str | None] = []
        self.claimed_issuer: str | None = None  # what discovery says; None: the truth
        self.failing = False
        app = web.Application()
        app.router.add_get(REALM + "/.well-known/openid-configuration", self._discovery)
        app.router.add_get(REALM + "/protocol/openid-connect/certs", self._jwks)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def issuer(self) -> str:
        return self.base + REALM

    def config(self, **changes: Any) -> oidc.PeopleIssuerConfig:
        return oidc.PeopleIssuerConfig.model_validate(
            {"issuer": self.issuer, "audience": "skyscan", "roles_claims": CLAIMS, "roles": ROLES, **changes}
        )

    def new_key(self, alg: str = "RS256", *, publish: bool = True, jwk_names_alg: bool = True) -> SigningKey:
        key = make_key(alg, jwk_names_alg=jwk_names_alg)
        if publish:
            self.published[key.kid] = key.jwk
        return key

    def claims(self, **changes: Any) -> dict[str, Any]:
        """An access token's claims as Keycloak writes them (an audience mapper adds `skyscan`)."""
        now = int(time.time())
        claims = {
            "exp": now + 300,
            "iat": now,
            "jti": str(uuid.uuid4()),
            "iss": self.issuer,
            "aud": ["skyscan", "account"],
            "sub": str(uuid.uuid4()),
            "typ": "Bearer",
            "azp": "skyscan-cli",
            "preferred_username": "alice",
            "realm_access": {"roles": ["offline_access", "default-roles-icecube", "skyscan-user"]},
            "resource_access": {"account": {"roles": ["manage-account"]}},
            "groups": ["/icecube"],
            "scope": "openid profile email",
        }
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def sign(self, key: SigningKey, claims: dict[str, Any] | None = None, **header: Any) -> str:
        return jwt.encode(
            claims if claims is not None else self.claims(),
            key.private,
            algorithm=key.alg,
            headers={"kid": key.kid, **header},
        )

    async def _discovery(self, request: web.Request) -> web.Response:
        self.hits["discovery"] += 1
        self.authorizations.append(request.headers.get("Authorization"))
        if self.failing:
            raise web.HTTPServiceUnavailable()
        return web.json_response(
            {
                "issuer": self.claimed_issuer or self.issuer,
                "jwks_uri": self.issuer + "/protocol/openid-connect/certs",
                "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            }
        )

    async def _jwks(self, request: web.Request) -> web.Response:
        self.hits["jwks"] += 1
        self.authorizations.append(request.headers.get("Authorization"))
        if self.failing:
            raise web.HTTPServiceUnavailable()
        return web.json_response({"keys": list(self.published.values())})


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
async def keycloak() -> AsyncIterator[LocalIssuer]:
    issuer = LocalIssuer()
    await issuer.start()
    yield issuer
    await issuer.server.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


MakeVerifier = Callable[..., oidc.OIDCVerifier]


@pytest.fixture
def verifier_for(clock: Clock) -> MakeVerifier:
    def make(*configs: oidc.IssuerConfig, **options: Any) -> oidc.OIDCVerifier:
        return oidc.OIDCVerifier(configs, **{"clock": clock, **options})

    return make


# --- Keycloak-shaped tokens ------------------------------------------------------------------------


@pytest.mark.parametrize(("alg", "jwk_names_alg"), [
    ("RS256", True), ("RS512", False), ("PS256", True), ("PS384", False),
    ("ES256", False), ("ES384", True), ("ES512", False), ("EdDSA", False),
])  # fmt: skip
async def test_every_asymmetric_algorithm_verifies(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, alg: str, jwk_names_alg: bool
) -> None:
    key = keycloak.new_key(alg, jwk_names_alg=jwk_names_alg)
    verifier = verifier_for(keycloak.config())
    claims = await verifier.claims(keycloak.sign(key))
    assert claims is not None and claims["preferred_username"] == "alice"
    assert verifier.config(claims["iss"]).issuer == keycloak.issuer
    assert keycloak.hits == {"discovery": 1, "jwks": 1}


@pytest.mark.parametrize(
    ("changes", "roles"),
    [
        ({}, {"user"}),  # realm role skyscan-user
        ({"realm_access": {"roles": ["offline_access"]}, "groups": ["/icecube/skyscan-users"]}, {"user"}),
        ({"resource_access": {"skyscan": {"roles": ["skyscan-system"]}}, "realm_access": None}, {"system"}),
        ({"resource_access": {"skyscan": {"roles": ["skyscan-system"]}}}, {"user", "system"}),
        ({"realm_access": {"roles": ["skyscan-system"]}}, {"system"}),
        # the system role of another client, a look-alike group, no roles: authenticated, no role
        ({"resource_access": {"other": {"roles": ["skyscan-system"]}}, "realm_access": None}, set()),
        ({"realm_access": None, "groups": ["/icecube/skyscan-users/x", "/skyscan-users"]}, set()),
        ({"realm_access": None, "groups": None}, set()),
    ],
)
async def test_keycloak_claims_map_to_roles(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, changes: dict[str, Any], roles: set[str]
) -> None:
    key = keycloak.new_key("RS256")
    people = auth.OIDCPeople(verifier_for(keycloak.config()))
    identity = await people.authenticate(keycloak.sign(key, keycloak.claims(**changes)))
    assert identity == auth.Identity("alice", frozenset(roles))


@pytest.mark.parametrize(
    ("resource_access", "roles"),
    [
        ({"skydriver-external": {"roles": ["users"]}}, {"user"}),
        ({"skydriver-external": {"roles": ["users"]}, "skydriver-internal": {"roles": ["system"]}},
         {"user", "system"}),
        ({"skydriver-external": {"roles": ["users", "system"]}}, {"user"}),  # system from its own client only
    ],
)  # fmt: skip
async def test_icecubes_client_roles_map_to_roles_by_grants(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, resource_access: dict[str, Any], roles: set[str]
) -> None:
    """Tokens of the local issuer carrying the claims IceCube's issuer sets, mapped by `grants`."""
    key = keycloak.new_key("RS256")
    config = oidc.PeopleIssuerConfig.model_validate(
        {"issuer": keycloak.issuer, "audience": "skyscan", "grants": [
            {"claim": "resource_access.skydriver-external.roles", "value": "users", "role": "user"},
            {"claim": "resource_access.skydriver-internal.roles", "value": "system", "role": "system"},
        ]}
    )  # fmt: skip
    people = auth.OIDCPeople(verifier_for(config))
    claims = keycloak.claims(resource_access=resource_access)
    identity = await people.authenticate(keycloak.sign(key, claims))
    assert identity == auth.Identity("alice", frozenset(roles))


async def test_a_tokens_identity_is_mapped_once(keycloak: LocalIssuer, verifier_for: MakeVerifier) -> None:
    key = keycloak.new_key()
    people = auth.OIDCPeople(verifier_for(keycloak.config()))
    token = keycloak.sign(key)
    first = await people.authenticate(token)
    assert first is not None and await people.authenticate(token) is first
    other = await people.authenticate(keycloak.sign(key, keycloak.claims(preferred_username="bob")))
    assert other is not None and other.name == "bob" and await people.authenticate(token) is first


async def test_the_name_is_preferred_username_else_sub(
    keycloak: LocalIssuer, verifier_for: MakeVerifier
) -> None:
    key = keycloak.new_key("ES256")
    people = auth.OIDCPeople(verifier_for(keycloak.config()))
    by_sub = await people.authenticate(
        keycloak.sign(key, keycloak.claims(preferred_username=None, sub="5c1e"))
    )
    assert by_sub is not None and by_sub.name == "5c1e"
    nameless = keycloak.claims(preferred_username=None, sub=None)
    assert await people.authenticate(keycloak.sign(key, nameless)) is None


async def test_discovery_and_jwks_are_fetched_with_the_token_file(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("reader-token\n")
    key = keycloak.new_key()
    verifier = verifier_for(keycloak.config(token_file=tmp_path / "token"))
    assert await verifier.claims(keycloak.sign(key)) is not None
    assert keycloak.authorizations == ["Bearer reader-token", "Bearer reader-token"]


async def test_a_discovery_url_other_than_the_issuer(
    keycloak: LocalIssuer, verifier_for: MakeVerifier
) -> None:
    """The issuer string need not be where discovery is; it must still be what discovery names."""
    key = keycloak.new_key()
    config = keycloak.config(discovery_url=keycloak.issuer + "/.well-known/openid-configuration")
    keycloak.claimed_issuer = "https://keycloak.example/realms/icecube"
    elsewhere = config.model_copy(update={"issuer": keycloak.claimed_issuer})
    token = keycloak.sign(key, keycloak.claims(iss=keycloak.claimed_issuer))
    claims = await verifier_for(elsewhere).claims(token)
    assert claims is not None and claims["iss"] == keycloak.claimed_issuer


# --- negative cases ----------------------------------------------------------------------------------


def expired(k: LocalIssuer, key: SigningKey) -> str:
    now = int(time.time())
    return k.sign(key, k.claims(iat=now - 400, exp=now - 31 - 5))  # past the 30 s leeway


def not_yet_valid(k: LocalIssuer, key: SigningKey) -> str:
    return k.sign(key, k.claims(nbf=int(time.time()) + 31 + 5))


def wrong_audience(k: LocalIssuer, key: SigningKey) -> str:
    return k.sign(key, k.claims(aud=["account", "skyscan-scanner"]))


def no_audience(k: LocalIssuer, key: SigningKey) -> str:
    return k.sign(key, k.claims(aud=None))


def no_expiry(k: LocalIssuer, key: SigningKey) -> str:
    return k.sign(key, k.claims(exp=None))


def wrong_issuer(k: LocalIssuer, key: SigningKey) -> str:
    """Another issuer's valid token (its own key, its own iss) is not ours."""
    return k.sign(key, k.claims(iss=k.base + "/realms/other"))


def signed_by_a_stranger(k: LocalIssuer, key: SigningKey) -> str:
    """Our iss and our kid, signed by a key we never published."""
    stranger = make_key(key.alg)
    return jwt.encode(k.claims(), stranger.private, algorithm=key.alg, headers={"kid": key.kid})


def tampered_payload(k: LocalIssuer, key: SigningKey) -> str:
    header, _, signature = k.sign(key, k.claims(realm_access={"roles": []})).split(".")
    forged = b64(json.dumps(k.claims(realm_access={"roles": ["skyscan-system"]})).encode())
    return f"{header}.{forged}.{signature}"


def alg_none(k: LocalIssuer, key: SigningKey) -> str:
    header = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": key.kid}).encode())
    return f"{header}.{b64(json.dumps(k.claims()).encode())}."


def hmac_with_the_public_key(k: LocalIssuer, key: SigningKey) -> str:
    """The classic confusion: HS256 keyed with the issuer's public key PEM, which anyone can get."""
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    signing_input = f"{header}.{b64(json.dumps(k.claims()).encode())}"
    mac = hmac.new(key.public_pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def rsa_alg_on_an_ec_key(k: LocalIssuer, key: SigningKey) -> str:
    """A token whose alg does not fit the key its kid names (a known EC key) is refused."""
    (ec_kid,) = (kid for kid, jwk in k.published.items() if jwk["kty"] == "EC")
    return jwt.encode(k.claims(), key.private, algorithm="RS256", headers={"kid": ec_kid})


@pytest.mark.parametrize(
    "forge",
    [
        expired, not_yet_valid, wrong_audience, no_audience, no_expiry, wrong_issuer,
        signed_by_a_stranger, tampered_payload, alg_none, hmac_with_the_public_key, rsa_alg_on_an_ec_key,
    ],
)  # fmt: skip
async def test_a_bad_token_is_not_authenticated(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, forge: Callable[[LocalIssuer, SigningKey], str]
) -> None:
    key = keycloak.new_key("RS256")
    keycloak.new_key("ES256")  # published too
    verifier = verifier_for(keycloak.config())
    assert await verifier.claims(keycloak.sign(key)) is not None  # the same issuer and key do verify
    bad = forge(keycloak, key)
    assert await verifier.claims(bad) is None
    assert await auth.OIDCPeople(verifier).authenticate(bad) is None
    assert verifier.verifications == 1


async def test_the_leeway_is_30_seconds_either_way(keycloak: LocalIssuer, verifier_for: MakeVerifier) -> None:
    key = keycloak.new_key("ES256")
    verifier = verifier_for(keycloak.config())
    now = int(time.time())
    assert await verifier.claims(keycloak.sign(key, keycloak.claims(iat=now - 400, exp=now - 20))) is not None
    assert await verifier.claims(keycloak.sign(key, keycloak.claims(nbf=now + 20))) is not None
    assert await verifier.claims(keycloak.sign(key, keycloak.claims(nbf=now + 45))) is None
    strict = verifier_for(keycloak.config(), leeway=0)
    assert await strict.claims(keycloak.sign(key, keycloak.claims(iat=now - 400, exp=now - 5))) is None


async def test_discovery_naming_another_issuer_is_refused(
    keycloak: LocalIssuer, verifier_for: MakeVerifier
) -> None:
    key = keycloak.new_key()
    keycloak.claimed_issuer = "https://evil.example/realms/icecube"
    assert await verifier_for(keycloak.config()).claims(keycloak.sign(key)) is None
    assert keycloak.hits == {"discovery": 1}  # its jwks_uri is not followed


# --- key rotation and the refetch rate limit ---------------------------------------------------------


async def test_a_new_kid_is_fetched_once_and_unknown_kids_do_not_flood_the_issuer(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, clock: Clock
) -> None:
    old = keycloak.new_key("RS256")
    verifier = verifier_for(keycloak.config(), refetch_interval=30.0)
    assert await verifier.claims(keycloak.sign(old)) is not None
    assert keycloak.hits == {"discovery": 1, "jwks": 1}

    new = keycloak.new_key("ES256")  # rotation: the issuer publishes a new key and signs with it
    clock.advance(30)
    token = keycloak.sign(new)
    assert await verifier.claims(token) is not None
    assert keycloak.hits == {"discovery": 1, "jwks": 2}
    assert await verifier.claims(keycloak.sign(new)) is not None  # known now: no fetch
    assert keycloak.hits["jwks"] == 2

    # A flood of unknown kids, all at once: nothing verifies and the issuer sees no request ...
    unpublished = keycloak.new_key("RS256", publish=False)
    flood = [keycloak.sign(unpublished, kid=secrets.token_hex(8)) for _ in range(50)]
    assert await asyncio.gather(*(verifier.claims(t) for t in flood)) == [None] * 50
    assert keycloak.hits["jwks"] == 2
    # ... and after the interval, one request for the whole next flood (the kid is unknown after it too).
    clock.advance(30)
    assert await asyncio.gather(*(verifier.claims(t) for t in flood)) == [None] * 50
    assert keycloak.hits == {"discovery": 1, "jwks": 3}
    assert await verifier.claims(keycloak.sign(old)) is not None  # the known keys kept working


async def test_a_key_published_within_the_interval_waits_for_it(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, clock: Clock
) -> None:
    verifier = verifier_for(keycloak.config(), refetch_interval=30.0)
    assert await verifier.claims(keycloak.sign(keycloak.new_key())) is not None
    new = keycloak.new_key("ES384")
    clock.advance(29)
    assert await verifier.claims(keycloak.sign(new)) is None
    clock.advance(1)
    assert await verifier.claims(keycloak.sign(new)) is not None
    assert keycloak.hits["jwks"] == 2


async def test_a_removed_key_stops_verifying_once_the_jwks_is_old(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, clock: Clock
) -> None:
    key = keycloak.new_key()
    verifier = verifier_for(keycloak.config(), jwks_max_age=600.0)
    assert await verifier.claims(keycloak.sign(key)) is not None
    del keycloak.published[key.kid]  # revoked at the issuer
    assert await verifier.claims(keycloak.sign(key)) is not None  # the JWKS kept is still fresh
    clock.advance(601)
    assert await verifier.claims(keycloak.sign(key)) is None
    assert keycloak.hits == {"discovery": 1, "jwks": 2}


async def test_an_unreachable_issuer_refuses_tokens_and_is_retried_after_the_interval(
    keycloak: LocalIssuer, verifier_for: MakeVerifier, clock: Clock
) -> None:
    key = keycloak.new_key()
    verifier = verifier_for(keycloak.config(), refetch_interval=30.0)
    keycloak.failing = True
    assert await verifier.claims(keycloak.sign(key)) is None
    assert await verifier.claims(keycloak.sign(key)) is None
    assert keycloak.hits == {"discovery": 1}  # the failure is rate-limited too
    keycloak.failing = False
    clock.advance(30)
    assert await verifier.claims(keycloak.sign(key)) is not None
    assert keycloak.hits == {"discovery": 2, "jwks": 1}


# --- the verified-token cache ------------------------------------------------------------------------


async def test_a_verified_token_is_cached_until_its_exp(
    keycloak: LocalIssuer, verifier_for: MakeVerifier
) -> None:
    key = keycloak.new_key()
    wall = [time.time()]
    verifier = verifier_for(keycloak.config(), now=lambda: wall[0])
    claims = keycloak.claims()
    token = keycloak.sign(key, claims)
    first = await verifier.claims(token)
    assert first is not None and await verifier.claims(token) is first
    assert verifier.verifications == 1
    wall[0] = claims["exp"] + 0.5  # the cache's clock passes exp: the token is checked again
    assert await verifier.claims(token) is not None
    assert verifier.verifications == 2
    with pytest.raises(TypeError):
        first["preferred_username"] = "mallory"  # type: ignore[index]


async def test_the_cache_is_bounded(keycloak: LocalIssuer, verifier_for: MakeVerifier) -> None:
    key = keycloak.new_key()
    verifier = verifier_for(keycloak.config(), cache_size=2)
    tokens = [keycloak.sign(key) for _ in range(3)]
    for token in tokens:
        assert await verifier.claims(token) is not None
    assert verifier.verifications == 3
    await verifier.claims(tokens[2])  # the most recent ones are kept ...
    await verifier.claims(tokens[1])
    assert verifier.verifications == 3
    await verifier.claims(tokens[0])  # ... the least recently used one was dropped
    assert verifier.verifications == 4


# --- the real issuer: the local kube-apiserver ---------------------------------------------------------


def api_server_access(cluster: Cluster, tmp_path: Path) -> tuple[str, Path, Path]:
    """The local API server's URL (its service-account issuer), its CA file, and a file with its
    admin token (its discovery endpoints want an authenticated caller)."""
    if cluster.local is None:
        pytest.skip("needs the local control plane, whose issuer is its own URL")
    kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    token_file = tmp_path / "admin-token"
    token_file.write_text(kubeconfig["users"][0]["user"]["token"])
    return (
        cluster.local.server,
        Path(kubeconfig["clusters"][0]["cluster"]["certificate-authority"]),
        token_file,
    )


async def service_account_token(api: Kube, namespace: str, audience: str) -> str:
    request = await api.request(
        "POST",
        core_path("serviceaccounts", namespace, "default", "token"),
        body={"spec": {"audiences": [audience], "expirationSeconds": 600}},
    )
    token: str = request["status"]["token"]
    return token


async def test_a_service_account_token_of_the_api_server_verifies(
    cluster: Cluster, api: Kube, namespace: str, tmp_path: Path
) -> None:
    server, ca_file, token_file = api_server_access(cluster, tmp_path)
    subject = f"system:serviceaccount:{namespace}:default"
    config = oidc.PeopleIssuerConfig(
        issuer=server,
        audience="skyscan",
        ca_file=ca_file,
        token_file=token_file,
        roles_claims=["sub"],
        roles={"user": [subject]},
    )
    verifier = oidc.OIDCVerifier([config])
    token = await service_account_token(api, namespace, "skyscan")
    claims = await verifier.claims(token)
    assert claims is not None, "the API server's own token did not verify"
    assert claims["iss"] == server and claims["sub"] == subject and claims["aud"] == ["skyscan"]
    assert claims["kubernetes.io"]["namespace"] == namespace
    assert jwt.get_unverified_header(token)["alg"] == "ES256"  # the local signing key is EC P-256
    identity = await auth.OIDCPeople(verifier).authenticate(token)
    assert identity == auth.Identity(subject, frozenset({auth.USER}))
    assert verifier.issuers[server].fetches == 2  # discovery, then its jwks_uri

    assert await verifier.claims(await service_account_token(api, namespace, "skyscan-scanner")) is None
    header, payload, signature = token.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged["sub"] = "system:serviceaccount:kube-system:admin"
    assert await verifier.claims(f"{header}.{b64(json.dumps(forged).encode())}.{signature}") is None


async def test_the_api_server_wants_a_bearer_for_its_discovery(
    cluster: Cluster, api: Kube, namespace: str, tmp_path: Path
) -> None:
    server, ca_file, _ = api_server_access(cluster, tmp_path)
    verifier = oidc.OIDCVerifier([oidc.IssuerConfig(issuer=server, audience="skyscan", ca_file=ca_file)])
    assert await verifier.claims(await service_account_token(api, namespace, "skyscan")) is None
    assert verifier.issuers[server].fetches == 1  # discovery answered 401/403


# --- the real shim over HTTP ---------------------------------------------------------------------------


async def test_the_shim_authenticates_people_by_oidc(
    cluster: Cluster, namespace: str, keycloak: LocalIssuer, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    static = auth.make_token(tokens, "local", ["user"])
    settings = ShimSettings(
        namespace=namespace,
        kubeconfig=cluster.kubeconfig,
        token_file=tokens,
        oidc_issuers=[keycloak.config()],
    )
    app = await create_app(settings)  # the authenticators from the settings, as `skyscan-shim serve`
    server = TestServer(app)
    await server.start_server()
    key = keycloak.new_key("RS256")
    now = int(time.time())
    try:
        async with aiohttp.ClientSession(base_url=server.make_url("")) as http:

            async def backlog(token: str) -> int:
                async with http.get("/scans/backlog", headers={"Authorization": f"Bearer {token}"}) as r:
                    await r.read()
                    return r.status

            assert await backlog(keycloak.sign(key)) == 200  # realm role skyscan-user
            assert (
                await backlog(keycloak.sign(key, keycloak.claims(groups=["/icecube/skyscan-users"]))) == 200
            )
            no_role = keycloak.claims(realm_access={"roles": ["offline_access"]})
            assert await backlog(keycloak.sign(key, no_role)) == 403
            system_only = keycloak.claims(realm_access={"roles": ["skyscan-system"]})
            assert await backlog(keycloak.sign(key, system_only)) == 403  # a user route
            assert await backlog(keycloak.sign(key, keycloak.claims(iat=now - 600, exp=now - 120))) == 401
            assert await backlog(hmac_with_the_public_key(keycloak, key)) == 401
            assert await backlog(alg_none(keycloak, key)) == 401
            assert await backlog(static) == 200  # the local token file still works beside OIDC
            assert await backlog("not-a-token") == 401
    finally:
        await server.close()
