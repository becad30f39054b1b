"""Who a bearer token is (`api_shim.auth`): static tokens for the local stack, people's OIDC claims
mapped to roles, and the order in which authenticators are asked."""

from __future__ import annotations

import json
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from api_shim import auth, oidc
from api_shim.wire_names import Names

ISSUER = "https://keycloak.invalid/realms/icecube"
JWT = "header.payload.signature"


class Verifier(oidc.OIDCVerifier):
    """Claims without signatures: `claims` answers from `by_token` (the same object for the same token,
    as the real verifier does while it caches a token)."""

    def __init__(self, by_token: Mapping[str, Mapping[str, Any] | None], cache_size: int = 10) -> None:
        super().__init__([oidc.PeopleIssuerConfig(issuer=ISSUER, audience="skyscan")], cache_size=cache_size)
        self.by_token = by_token
        self.asked: list[str] = []

    async def claims(self, token: str) -> Mapping[str, Any] | None:
        self.asked.append(token)
        return self.by_token.get(token)


def person(**claims: Any) -> dict[str, Any]:
    return {"iss": ISSUER, "sub": "u-1", "realm_access": {"roles": ["skyscan-user"]}, **claims}


class Named:
    """An authenticator that knows one token."""

    def __init__(self, token: str, name: str) -> None:
        self.token, self.name, self.asked = token, name, 0

    async def authenticate(self, token: str) -> auth.Identity | None:
        self.asked += 1
        return auth.Identity(self.name, frozenset({auth.USER})) if token == self.token else None


async def test_a_bearer_header_is_read_whatever_its_cases_and_spaces() -> None:
    alice = Named("t0k", "alice")
    for header in ("Bearer t0k", "bearer t0k", "BEARER   t0k  "):
        identity = await auth.identify([alice], header)
        assert identity is not None and identity.name == "alice", header


async def test_without_a_bearer_token_no_authenticator_but_allow_all_is_asked() -> None:
    alice = Named("", "alice")  # would take an empty token
    for header in (None, "", "Basic dXNlcjpwdw==", "Bearer ", "Bearertok"):
        assert await auth.identify([alice], header) is None, header
    assert alice.asked == 0
    anonymous = await auth.identify([alice, auth.AllowAll()], None)
    assert anonymous == auth.Identity("anonymous", frozenset({auth.USER, auth.SYSTEM, auth.VIEWER}))


async def test_authenticators_are_asked_in_order_until_one_knows_the_token() -> None:
    alice, bob = Named("a", "alice"), Named("b", "bob")
    assert (await auth.identify([alice, bob], "Bearer b")) == auth.Identity("bob", frozenset({auth.USER}))
    assert (alice.asked, bob.asked) == (1, 1)
    assert (await auth.identify([alice, bob], "Bearer a")) == auth.Identity("alice", frozenset({auth.USER}))
    assert (alice.asked, bob.asked) == (2, 1)  # bob was not asked
    assert await auth.identify([alice, bob], "Bearer c") is None


async def test_a_static_token_file_grants_only_known_roles_and_a_missing_file_no_token(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.json"
    assert await auth.StaticTokens.load(path).authenticate("anything") is None
    path.write_text(json.dumps({auth.token_hash("t"): {"name": "carol", "roles": ["user", "admin"]}}))
    identity = await auth.StaticTokens.load(path).authenticate("t")
    assert identity == auth.Identity("carol", frozenset({auth.USER}))


async def test_static_tokens_found_are_remembered_as_their_own_and_no_more_than_the_bound() -> None:
    alice, bob = auth.Identity("alice", frozenset({auth.USER})), auth.Identity("op", frozenset({auth.SYSTEM}))
    entries = {auth.token_hash("a"): alice, auth.token_hash("b"): bob, auth.token_hash("c"): alice}
    tokens = auth.StaticTokens(entries, remember=2)
    assert await tokens.authenticate("x") is None and tokens.remembered == 0  # a token not found: never
    for _ in range(2):  # the second time from what was remembered: the same answers
        answers = [await tokens.authenticate(t) for t in ("a", "b", "x", "a ", "A")]
        assert answers == [alice, bob, None, None, None]
    assert tokens.remembered == 2
    assert await tokens.authenticate("c") == alice and tokens.remembered == 2  # past the bound: hashed
    assert await tokens.authenticate("c") == alice and await tokens.authenticate("b") == bob
    many = auth.StaticTokens({auth.token_hash(str(i)): alice for i in range(1025)})
    assert [await many.authenticate(str(i)) for i in range(1025)] == [alice] * 1025
    assert many.remembered == 1024  # by default


async def test_a_remembered_token_is_answered_without_hashing_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alice = auth.Identity("alice", frozenset({auth.USER}))
    tokens = auth.StaticTokens({auth.token_hash("a"): alice})
    hashed: list[str] = []
    real_hash = auth.token_hash
    monkeypatch.setattr(auth, "token_hash", lambda t: hashed.append(t) or real_hash(t))
    assert [await tokens.authenticate("a") for _ in range(3)] == [alice] * 3
    assert await tokens.authenticate("b") is None and await tokens.authenticate("b") is None
    assert hashed == ["a", "b", "b"]  # a found token once; one not found each time


def test_a_new_token_is_stored_only_as_its_hash_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    first = auth.make_token(path, "alice", ["user"])
    second = auth.make_token(path, "bob", ["system", "user", "system"])
    assert len(first) == len(second) == 43 and first != second  # 32 random bytes, url-safe base64
    entries = json.loads(path.read_text())
    assert path.read_text() == json.dumps(entries, indent=2) + "\n"  # for a person to read
    assert entries == {
        auth.token_hash(first): {"name": "alice", "roles": ["user"]},
        auth.token_hash(second): {"name": "bob", "roles": ["system", "user"]},
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match=r"unknown roles: \['admin'\] \(known: user, system, viewer\)"):
        auth.make_token(path, "eve", ["user", "admin"])
    assert len(json.loads(path.read_text())) == 2


async def test_a_token_that_is_not_a_jwt_is_never_verified() -> None:
    verifier = Verifier({})
    people = auth.OIDCPeople(verifier)
    for token in ("plain", "a.b", "a.b.c.d"):
        assert await people.authenticate(token) is None
    assert verifier.asked == []
    assert await people.authenticate(JWT) is None and verifier.asked == [JWT]  # unverified: no one


async def test_a_person_is_named_by_preferred_username_else_sub_and_unnamed_is_refused() -> None:
    people = auth.OIDCPeople(Verifier({}))
    assert people.identity(person(preferred_username="alice")) == auth.Identity(
        "alice", frozenset({auth.USER})
    )
    assert people.identity(person(preferred_username="")) == auth.Identity("u-1", frozenset({auth.USER}))
    assert people.identity(person(sub="")) is None
    assert people.identity(person(sub=42)) is None
    assert people.identity({"iss": ISSUER}) is None


async def test_a_persons_roles_are_their_issuers_mapping_and_nothing_else() -> None:
    people = auth.OIDCPeople(Verifier({}))
    both = person(realm_access={"roles": ["skyscan-user", "skyscan-system", "admin"]})
    assert people.identity(both) == auth.Identity("u-1", frozenset({auth.USER, auth.SYSTEM}))
    nothing = people.identity(person(realm_access={"roles": ["admin"]}))
    assert nothing == auth.Identity("u-1", frozenset())


async def test_an_issuer_without_a_role_mapping_grants_no_role() -> None:
    verifier = Verifier({})
    verifier.issuers[ISSUER].config = oidc.IssuerConfig(issuer=ISSUER, audience="skyscan")
    assert auth.OIDCPeople(verifier).identity(person()) == auth.Identity("u-1", frozenset())


async def test_a_persons_answers_speak_the_names_their_issuer_says() -> None:
    verifier = Verifier({})
    assert auth.OIDCPeople(verifier).identity(person()).names is Names.INTERFACE  # type: ignore[union-attr]
    verifier.issuers[ISSUER].config = oidc.PeopleIssuerConfig(
        issuer=ISSUER, audience="s", names=Names.REFERENCE
    )
    assert auth.OIDCPeople(verifier).identity(person()) == auth.Identity(
        "u-1", frozenset({auth.USER}), names=Names.REFERENCE
    )
    verifier.issuers[ISSUER].config = oidc.IssuerConfig(issuer=ISSUER, audience="skyscan")
    assert auth.OIDCPeople(verifier).identity(person()).names is Names.INTERFACE  # type: ignore[union-attr]


async def test_a_static_tokens_answers_speak_the_names_it_was_made_with(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    plain = auth.make_token(path, "alice", ["user"])
    icecube = auth.make_token(path, "bob", ["user"], Names.REFERENCE)
    assert json.loads(path.read_text())[auth.token_hash(icecube)]["names"] == "reference"
    tokens = auth.StaticTokens.load(path)
    assert await tokens.authenticate(plain) == auth.Identity("alice", frozenset({auth.USER}))
    assert await tokens.authenticate(icecube) == auth.Identity(
        "bob", frozenset({auth.USER}), names=Names.REFERENCE
    )


async def test_a_tokens_identity_is_mapped_once_while_its_claims_are_cached() -> None:
    claims = person(preferred_username="alice")
    verifier = Verifier({JWT: claims, "other.jwt.token": person(preferred_username="bob")})
    people = auth.OIDCPeople(verifier)
    mapped: list[str] = []
    identity = people.identity

    def counting(c: Mapping[str, Any]) -> auth.Identity | None:
        mapped.append(c["preferred_username"])
        return identity(c)

    people.identity = counting  # type: ignore[method-assign]
    first = await people.authenticate(JWT)
    assert first is not None and first.name == "alice"
    assert await people.authenticate(JWT) is first
    assert (await people.authenticate("other.jwt.token")) == auth.Identity("bob", frozenset({auth.USER}))
    assert mapped == ["alice", "bob"]
    verifier.by_token = {JWT: dict(claims)}  # new claims (the verifier's cache let the token go): mapped anew
    assert await people.authenticate(JWT) == first
    assert mapped == ["alice", "bob", "alice"]


async def test_the_identities_kept_are_as_many_as_the_verifier_keeps_tokens() -> None:
    tokens = {f"t.{i}.x": person(preferred_username=f"p{i}") for i in range(4)}
    people = auth.OIDCPeople(Verifier(tokens, cache_size=2))
    for token in tokens:
        await people.authenticate(token)
    assert len(people._identities) == 2
    kept = [identity.name for _, identity in people._identities.values() if identity]
    assert kept == ["p2", "p3"]  # the least recently mapped went first
