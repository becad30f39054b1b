"""OIDC pieces that need no issuer: key/algorithm pairing, claim paths, role mapping, configuration,
and refusals decided before any fetch. The verifier against real issuers: tests/integration/test_oidc.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import typing
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from pydantic import ValidationError

from api_shim import auth, oidc
from api_shim.app import authenticators
from api_shim.settings import ShimSettings

ISSUER = "https://keycloak.invalid/realms/icecube"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": "skyscan", "sub": "u-1", "exp": now + 300, "iat": now, **changes}


def rsa_jwk(**extra: Any) -> dict[str, Any]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), **extra}


def test_the_role_literal_is_the_shims_roles() -> None:
    assert set(typing.get_args(oidc.Role)) == set(auth.ROLES)


@pytest.mark.parametrize(
    ("jwk", "algorithms"),
    [
        ({"kty": "RSA"}, {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}),
        ({"kty": "RSA", "alg": "PS384"}, {"PS384"}),
        ({"kty": "RSA", "alg": "HS256"}, set()),  # a JWK naming HMAC never verifies
        ({"kty": "RSA", "alg": "ES256"}, set()),  # nor one whose alg does not fit its type
        ({"kty": "RSA", "use": "enc"}, set()),
        ({"kty": "EC", "crv": "P-256"}, {"ES256"}),
        ({"kty": "EC", "crv": "P-384"}, {"ES384"}),
        ({"kty": "EC", "crv": "P-521"}, {"ES512"}),
        ({"kty": "EC", "crv": "P-256", "alg": "ES384"}, set()),
        ({"kty": "EC", "crv": "secp256k1"}, set()),
        ({"kty": "OKP", "crv": "Ed25519"}, {"EdDSA"}),
        ({"kty": "OKP", "crv": "X25519"}, set()),
        ({"kty": "oct", "k": "c2VjcmV0"}, set()),
        ({"kty": "oct", "k": "c2VjcmV0", "alg": "HS256"}, set()),
    ],
)
def test_a_key_verifies_only_asymmetric_algorithms_of_its_own_type(
    jwk: dict[str, Any], algorithms: set[str]
) -> None:
    assert oidc.key_algorithms(jwk) == algorithms
    assert algorithms <= oidc.ALLOWED_ALGORITHMS


KEYCLOAK = {
    "sub": "5c1e",
    "preferred_username": "alice",
    "realm_access": {"roles": ["offline_access", "skyscan-user"]},
    "resource_access": {"skyscan": {"roles": ["skyscan-system"]}, "my.client": {"roles": ["x"]}},
    "groups": ["/icecube", "/icecube/realtime"],
    "scope": "openid profile",
}


@pytest.mark.parametrize(
    ("path", "values"),
    [
        ("realm_access.roles", {"offline_access", "skyscan-user"}),
        ("resource_access.skyscan.roles", {"skyscan-system"}),
        ("resource_access.my.client.roles", {"x"}),  # a client id with a dot
        ("resource_access.other.roles", set()),
        ("groups", {"/icecube", "/icecube/realtime"}),
        ("sub", {"5c1e"}),
        ("realm_access", set()),  # an object is no value
        ("sub.deeper", set()),
        ("missing", set()),
    ],
)
def test_claim_paths(path: str, values: set[str]) -> None:
    assert oidc.claim_values(KEYCLOAK, path) == values


BOTH = {"user": ["skyscan-user"], "system": ["skyscan-system"]}


@pytest.mark.parametrize(
    ("roles_claims", "mapping", "expected"),
    [
        (["realm_access.roles"], BOTH, {"user"}),
        (["resource_access.skyscan.roles"], BOTH, {"system"}),
        (["realm_access.roles", "resource_access.skyscan.roles"], BOTH, {"user", "system"}),
        (["groups"], {"user": ["/icecube/realtime"]}, {"user"}),
        (["groups"], {"user": ["/icecube/other"], "system": ["/icecube"]}, {"system"}),
        (["scope"], {"user": ["openid profile"]}, {"user"}),  # a string claim is one value
        (["realm_access.roles"], {"user": ["skyscan-admin"]}, set()),
    ],
)
def test_role_mapping(roles_claims: list[str], mapping: dict[str, list[str]], expected: set[str]) -> None:
    config = oidc.PeopleIssuerConfig.model_validate(
        {"issuer": ISSUER, "audience": "skyscan", "roles_claims": roles_claims, "roles": mapping}
    )
    assert config.roles_of(KEYCLOAK) == expected


# IceCube's issuer: people who may scan have `users` in one client's roles, the scanners' accounts
# `system` in another's.
ICECUBE_GRANTS = [
    {"claim": "resource_access.skydriver-external.roles", "value": "users", "role": "user"},
    {"claim": "resource_access.skydriver-internal.roles", "value": "system", "role": "system"},
]


@pytest.mark.parametrize(
    ("resource_access", "expected"),
    [
        ({"skydriver-external": {"roles": ["users"]}}, {"user"}),
        ({"skydriver-internal": {"roles": ["system"]}}, {"system"}),
        ({"skydriver-external": {"roles": ["users"]}, "skydriver-internal": {"roles": ["system"]}},
         {"user", "system"}),
        ({"skydriver-external": {"roles": ["system"]}}, set()),  # not pooled: system from its client only
        ({"skydriver-internal": {"roles": ["users"]}}, set()),
        ({"skyscan": {"roles": ["skyscan-user", "skyscan-system"]}}, set()),  # the default values: not here
    ],
)  # fmt: skip
def test_grants_tie_each_role_to_its_own_claim(resource_access: dict[str, Any], expected: set[str]) -> None:
    config = oidc.PeopleIssuerConfig.model_validate(
        {"issuer": ISSUER, "audience": "skyscan", "grants": ICECUBE_GRANTS}
    )
    assert config.roles_of({**KEYCLOAK, "resource_access": resource_access}) == expected


def test_grants_replace_the_pooled_mapping_and_are_not_mixed_with_it() -> None:
    for pooled in ({"roles_claims": ["groups"]}, {"roles": BOTH}):
        with pytest.raises(ValidationError, match="grants replaces roles_claims and roles"):
            oidc.PeopleIssuerConfig.model_validate(
                {"issuer": ISSUER, "audience": "skyscan", "grants": ICECUBE_GRANTS, **pooled}
            )
    bad = [{"claim": "groups", "value": "x", "role": "admin"}, {"claim": "", "value": "x", "role": "user"}]
    for grant in bad:
        with pytest.raises(ValidationError):
            oidc.PeopleIssuerConfig.model_validate(
                {"issuer": ISSUER, "audience": "skyscan", "grants": [grant]}
            )


def test_the_default_mapping_is_keycloak_realm_roles() -> None:
    config = oidc.PeopleIssuerConfig(issuer=ISSUER, audience="skyscan")
    assert config.roles_claims == ["realm_access.roles"]
    assert config.roles_of(KEYCLOAK) == {"user"}
    assert config.discovery == f"{ISSUER}/.well-known/openid-configuration"


@pytest.mark.parametrize(
    "entry",
    [
        {"issuer": "http://keycloak.example/realms/r", "audience": "skyscan"},  # keys in the clear
        {"issuer": ISSUER, "audience": "skyscan", "discovery_url": "http://10.1.2.3/.well-known/x"},
        {"issuer": "keycloak/realms/r", "audience": "skyscan"},
        {"issuer": ISSUER, "audience": "skyscan", "roles": {"admin": ["skyscan-admin"]}},
        {"issuer": ISSUER, "audience": "skyscan", "role_claims": ["groups"]},  # a typo is an error
        {"issuer": ISSUER, "audience": "skyscan", "roles_claims": []},
        {"issuer": ISSUER},
    ],
)
def test_bad_issuer_configurations_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        oidc.PeopleIssuerConfig.model_validate(entry)


def test_http_is_accepted_to_loopback_issuers_only() -> None:
    for url in ("http://127.0.0.1:8080/realms/r", "http://localhost:8080/realms/r", "http://[::1]:80/r"):
        assert oidc.IssuerConfig(issuer=url, audience="a").issuer == url


def test_the_settings_read_issuers_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {
        "issuer": ISSUER,
        "audience": "skyscan",
        "roles_claims": ["realm_access.roles", "groups"],
        "roles": {"user": ["skyscan-user"], "system": ["skyscan-system"]},
        "ca_file": "/etc/skyscan/ca.pem",
    }
    monkeypatch.setenv("SKYSCAN_OIDC_ISSUERS", json.dumps([entry]))
    monkeypatch.setenv("SKYSCAN_OIDC_LEEWAY_SECONDS", "5")
    settings = ShimSettings()
    (issuer,) = settings.oidc_issuers
    assert issuer.ca_file == Path("/etc/skyscan/ca.pem") and issuer.roles_claims[1] == "groups"
    assert settings.oidc_leeway_seconds == 5.0
    (people,) = authenticators(settings)
    assert isinstance(people, auth.OIDCPeople)
    assert people.verifier.leeway == 5.0 and people.verifier.cache_size == 10000


def test_the_same_issuer_twice_is_refused() -> None:
    config = oidc.IssuerConfig(issuer=ISSUER, audience="a")
    with pytest.raises(ValueError, match="twice"):
        oidc.OIDCVerifier([config, config])


def test_static_tokens_and_oidc_work_side_by_side(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    auth.make_token(tokens, "local", ["user"])
    settings = ShimSettings(token_file=tokens, oidc_issuers=[{"issuer": ISSUER, "audience": "skyscan"}])
    assert [type(a) for a in authenticators(settings)] == [auth.StaticTokens, auth.OIDCPeople]
    with pytest.raises(SystemExit, match="SKYSCAN_OIDC_ISSUERS"):
        authenticators(ShimSettings())


# Refusals that need no key: they happen before any fetch (the issuer here does not even resolve).


async def refused_without_fetching(token: str) -> None:
    verifier = oidc.OIDCVerifier([oidc.PeopleIssuerConfig(issuer=ISSUER, audience="skyscan")])
    assert await verifier.claims(token) is None
    assert await auth.OIDCPeople(verifier).authenticate(token) is None
    assert verifier.issuers[ISSUER].fetches == 0


async def test_alg_none_is_refused() -> None:
    await refused_without_fetching(unsigned({"alg": "none", "typ": "JWT", "kid": "k"}, claims()) + ".")


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
async def test_hmac_is_refused_even_keyed_with_the_public_key(alg: str) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(  # what an attacker knows, used as the HMAC secret
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signing_input = unsigned({"alg": alg, "typ": "JWT", "kid": "k"}, claims())
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    mac = hmac.new(pem, signing_input.encode(), digest).digest()
    await refused_without_fetching(f"{signing_input}.{b64(mac)}")


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not-a-jwt",
        "a.b.c",
        unsigned({"alg": "RS256", "kid": "k"}, claims(iss="https://elsewhere.invalid")) + ".c2ln",
        unsigned({"alg": "RS256", "kid": 7}, claims()) + ".c2ln",  # a kid that is no string
        unsigned({"alg": "ES256K", "kid": "k"}, claims()) + ".c2ln",
    ],
)
async def test_malformed_tokens_and_unknown_issuers_are_refused_without_fetching(token: str) -> None:
    await refused_without_fetching(token)


def test_a_key_set_binds_the_tokens_algorithm_only_where_the_key_allows_it() -> None:
    rsa_key = rsa_jwk(kid="r")
    ec_public = ec.generate_private_key(ec.SECP384R1()).public_key()
    ec_key = {**json.loads(ECAlgorithm.to_jwk(ec_public)), "kid": "e"}
    ed_key = json.loads(OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate().public_key()))  # no kid
    hmac_key = {"kty": "oct", "k": b64(b"secret"), "kid": "h"}
    keys = oidc._KeySet.parse({"keys": [rsa_key, ec_key, hmac_key]}, fetched_at=0.0)
    assert not keys.knows("h")  # symmetric keys are dropped
    bound = keys.key("r", "PS256")
    assert isinstance(bound, jwt.PyJWK) and bound.algorithm_name == "PS256"
    assert keys.key("r", "ES384") is None and keys.key("e", "RS256") is None
    assert keys.key("e", "ES256") is None  # a P-384 key signs ES384 only
    assert keys.key("e", "ES384") is not None
    assert keys.key(None, "RS256") is None  # no kid, several keys: which one is not guessed
    only = oidc._KeySet.parse({"keys": [ed_key]}, fetched_at=0.0)
    assert only.knows(None) and only.key(None, "EdDSA") is not None
    with pytest.raises(ValueError):
        oidc._KeySet.parse({"nokeys": []}, fetched_at=0.0)


def test_the_documented_example_is_a_valid_configuration() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    section = page.split("## People (OIDC)", 1)[1]
    example = section.split("```json", 1)[1].split("```", 1)[0]
    (config,) = [oidc.PeopleIssuerConfig.model_validate(entry) for entry in json.loads(example)]
    assert config.roles_of(KEYCLOAK) == {"user", "system"}


class InMemoryIssuer(oidc.Issuer):
    """The subclass hook: keys fetched some other way (here: from memory)."""

    def __init__(self, config: oidc.IssuerConfig, jwks: dict[str, Any]) -> None:
        super().__init__(config, refetch_interval=0.0)
        self.documents = {
            config.discovery: {"issuer": config.issuer, "jwks_uri": f"{config.issuer}/keys"},
            f"{config.issuer}/keys": jwks,
        }
        self.urls: list[str] = []

    async def _get_json(self, url: str) -> Any:
        self.fetches += 1
        self.urls.append(url)
        return self.documents[url]


async def test_an_issuer_instance_fetches_its_own_way() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = {**json.loads(ECAlgorithm.to_jwk(key.public_key())), "kid": "k1"}
    issuer = InMemoryIssuer(oidc.IssuerConfig(issuer=ISSUER, audience="skyscan-scanner"), {"keys": [jwk]})
    verifier = oidc.OIDCVerifier([issuer])
    token = jwt.encode(claims(aud="skyscan-scanner"), key, algorithm="ES256", headers={"kid": "k1"})
    verified = await verifier.claims(token)
    assert verified is not None and verified["aud"] == "skyscan-scanner"
    assert issuer.urls == [f"{ISSUER}/.well-known/openid-configuration", f"{ISSUER}/keys"]
    assert verifier.config(ISSUER) is issuer.config
    people = auth.OIDCPeople(verifier)  # an issuer without a role mapping grants no role
    assert await people.authenticate(token) == auth.Identity("u-1", frozenset())
    assert await verifier.claims(jwt.encode(claims(), key, algorithm="ES256", headers={"kid": "k1"})) is None
