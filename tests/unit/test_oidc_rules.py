"""OIDC verification details that a one-token change would break unseen (`api_shim.oidc`): defaults,
how keys are fetched (headers, TLS trust, size, time limit), when they are fetched again, what is
cached, and each refusal's words. Issuers are stand-ins or a local server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from api_shim import oidc
from skyscan_local import control_plane

ISSUER = "https://issuer.invalid/realms/r"
KEY = ec.generate_private_key(ec.SECP256R1())
JWK = {**json.loads(ECAlgorithm.to_jwk(KEY.public_key())), "kid": "k1"}
DISCOVERY = {"issuer": ISSUER, "jwks_uri": f"{ISSUER}/certs"}


def config(**changes: Any) -> oidc.IssuerConfig:
    return oidc.IssuerConfig(**{"issuer": ISSUER, "audience": "skyscan", **changes})


class Documents(oidc.Issuer):
    """An issuer whose discovery document and JWKS are given, counting its fetches."""

    def __init__(self, documents: Mapping[str, Any] | None = None, **options: Any) -> None:
        super().__init__(config(), **options)
        self.documents = dict(
            documents or {config().discovery: DISCOVERY, DISCOVERY["jwks_uri"]: {"keys": [JWK]}}
        )

    async def _get_json(self, url: str) -> Any:
        self.fetches += 1
        return self.documents[url]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def token(**changes: Any) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": "skyscan", "sub": "u", "exp": now + 300, **changes}
    return jwt.encode(claims, KEY, algorithm="ES256", headers={"kid": "k1"})


def test_the_defaults() -> None:
    issuer = oidc.Issuer(config())
    assert (issuer.refetch_interval, issuer.jwks_max_age) == (30.0, 600.0)
    verifier = oidc.OIDCVerifier([config()])
    assert (verifier.leeway, verifier.cache_size) == (30.0, 10_000)
    made = verifier.issuers[ISSUER]
    assert (made.refetch_interval, made.jwks_max_age) == (30.0, 600.0)
    tuned = oidc.OIDCVerifier([config()], refetch_interval=5.0, jwks_max_age=7.0).issuers[ISSUER]
    assert (tuned.refetch_interval, tuned.jwks_max_age) == (5.0, 7.0)


@pytest.mark.parametrize(
    "url", ["ftp://localhost/x", "ftp://127.0.0.1/x", "http://issuer.example/x", "https:///x"]
)
def test_an_issuer_url_is_https_or_http_to_loopback_only(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        oidc._checked_url(url)
    assert str(refused.value) == f"{url!r}: an issuer URL must be https (http only to a loopback address)"


@pytest.mark.parametrize(
    ("discovery", "message"),
    [
        ([], "the discovery document is not a JSON object"),
        ({"issuer": "https://other.invalid"}, "the discovery document names issuer 'https://other.invalid'"),
        ({"issuer": ISSUER}, "the discovery document has no jwks_uri"),
    ],
)
def test_a_discovery_document_is_refused_saying_why(discovery: Any, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        oidc.Issuer(config())._jwks_uri_of(discovery)
    assert str(refused.value) == message


def test_a_jwks_without_a_list_of_keys_is_refused() -> None:
    with pytest.raises(ValueError) as refused:
        oidc._KeySet.parse({"keys": {}}, 0.0)
    assert str(refused.value) == "a JWKS has a list `keys`"


def test_a_token_without_kid_is_known_to_a_set_of_one_key_whatever_its_kid() -> None:
    assert oidc._KeySet.parse({"keys": [JWK]}, 0.0).knows(None)
    two = {**JWK, "kid": "k2"}
    assert not oidc._KeySet.parse({"keys": [JWK, two]}, 0.0).knows(None)


async def test_keys_are_fetched_once_then_again_only_past_their_max_age() -> None:
    clock = Clock()
    issuer = Documents(clock=clock)
    assert await issuer.key("k1", "ES256") is not None
    assert issuer.fetches == 2  # discovery and JWKS
    clock.t += 40  # past the refetch interval, well within the max age
    assert await issuer.key("k1", "ES256") is not None
    clock.t = 1000 + 600  # exactly the max age: still fresh
    assert await issuer.key("k1", "ES256") is not None
    assert issuer.fetches == 2
    clock.t += 1
    assert await issuer.key("k1", "ES256") is not None
    assert issuer.fetches == 3  # the JWKS again (the discovery document is kept)


async def test_a_token_whose_iss_is_not_a_string_is_refused() -> None:
    verifier = oidc.OIDCVerifier([Documents()])

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    listed = f"{part({'alg': 'ES256', 'kid': 'k1'})}.{part({'iss': [ISSUER], 'aud': 'skyscan'})}.c2ln"
    assert await verifier.claims(listed) is None


async def test_tokens_of_other_issuers_are_remembered_newest_kept() -> None:
    verifier = oidc.OIDCVerifier([Documents()], cache_size=2)
    foreign = [token(iss=f"https://other{i}.invalid") for i in range(3)]
    for t in foreign:
        assert await verifier.claims(t) is None
    assert list(verifier._foreign) == [hashlib.sha256(t.encode()).digest() for t in foreign[1:]]


async def test_a_foreign_token_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = oidc.OIDCVerifier([Documents()])
    parsed = 0
    decode_complete = jwt.decode_complete

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal parsed
        parsed += 1
        return decode_complete(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode_complete", counting)
    other = token(iss="https://other.invalid")
    assert await verifier.claims(other) is None
    assert await verifier.claims(other) is None
    assert parsed == 1


async def test_a_cache_of_one_keeps_one_token() -> None:
    verifier = oidc.OIDCVerifier([Documents()], cache_size=1)
    t = token()
    assert await verifier.claims(t) is not None
    assert await verifier.claims(t) is not None
    assert verifier.verifications == 1


async def test_a_cached_token_is_verified_again_from_its_exp_on() -> None:
    exp = int(time.time()) + 300
    now = Clock(exp - 10.0)
    verifier = oidc.OIDCVerifier([Documents()], now=now)
    t = token(exp=exp)
    assert await verifier.claims(t) is not None
    now.t = exp  # the cache lets it go at its exp; the verifier itself still has its leeway
    assert await verifier.claims(t) is not None
    assert verifier.verifications == 2


# --- fetching through HTTP: the local issuer


class Served:
    """What the local issuer serves at /doc, in parts; the requests' headers."""

    def __init__(self) -> None:
        self.parts: list[bytes] = [b'{"a": ', b"1}"]
        self.headers: list[Mapping[str, str]] = []
        self.stall = False


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Served, str, Path]]:
    """A TLS server on 127.0.0.1 (the local control plane's certificates): its state, its /doc URL and
    its CA file."""
    control_plane.write_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    state, never = Served(), asyncio.Event()

    async def doc(request: web.Request) -> web.StreamResponse:
        state.headers.append(dict(request.headers))
        response = web.StreamResponse()
        await response.prepare(request)
        if state.stall:
            await response.write(b"{")
            await never.wait()
        for part in state.parts:
            await response.write(part)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/doc", doc)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=context)
    yield state, f"https://127.0.0.1:{server.port}/doc", tmp_path / "ca.crt"
    await server.close()


def https_issuer(ca_file: Path | None, token_file: Path | None = None) -> oidc.Issuer:
    return oidc.Issuer(config(ca_file=ca_file, token_file=token_file))


async def test_documents_are_fetched_trusting_the_issuers_ca_with_its_token(
    served: tuple[Served, str, Path], tmp_path: Path
) -> None:
    state, url, ca = served
    (tmp_path / "token").write_text("t0k\n")
    issuer = https_issuer(ca, tmp_path / "token")
    assert await issuer._get_json(url) == {"a": 1}  # its parts, joined
    assert await issuer._get_json(url) == {"a": 1}
    assert issuer.fetches == 2
    assert state.headers[0]["Accept"] == "application/json, application/jwk-set+json"
    assert state.headers[0]["Authorization"] == "Bearer t0k"
    with pytest.raises(httpx.ConnectError):
        await https_issuer(None)._get_json(url)  # the system's CAs do not know this one


def test_the_connection_is_the_system_trust_without_a_ca_file_and_headers_as_configured(
    tmp_path: Path,
) -> None:
    assert https_issuer(None)._connection() == (
        True,
        {"Accept": "application/json, application/jwk-set+json"},
    )
    (tmp_path / "token").write_text(" t0k \n")
    headers = https_issuer(None, tmp_path / "token")._connection()[1]
    assert headers == {"Accept": "application/json, application/jwk-set+json", "Authorization": "Bearer t0k"}


async def test_a_document_of_exactly_the_limit_is_read_and_one_byte_more_refused(
    served: tuple[Served, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url, ca = served
    monkeypatch.setattr(oidc, "MAX_DOCUMENT_BYTES", 10)
    state.parts = [b'"1234', b'5678"']  # 10 bytes
    assert await https_issuer(ca)._get_json(url) == "12345678"
    state.parts = [b'"1234', b'56789"']
    with pytest.raises(ValueError) as refused:
        await https_issuer(ca)._get_json(url)
    assert str(refused.value) == f"{url}: larger than 10 bytes"


async def test_a_fetch_that_stalls_ends_at_the_fetch_timeout(
    served: tuple[Served, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url, ca = served
    state.stall = True
    monkeypatch.setattr(oidc, "FETCH_TIMEOUT", 0.2)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await https_issuer(ca)._get_json(url)
    assert time.monotonic() - started < 2.0  # httpx's own default would be 5 s


# --- the discovery document, which the dashboard's login reads too (api_shim.handlers.ui)


class Flaky(Documents):
    """An issuer whose fetches fail (OSError) while `failing`, each taking one turn of the loop, or until
    `held` is set when one is given."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.failing = True
        self.held: asyncio.Event | None = None

    async def _get_json(self, url: str) -> Any:
        self.fetches += 1
        if self.held is not None:
            await self.held.wait()
        await asyncio.sleep(0)
        if self.failing:
            raise OSError("unreachable")
        return self.documents[url]


async def test_the_discovery_document_is_fetched_once_read_only_and_shared_with_the_keys() -> None:
    issuer = Documents(clock=Clock())
    document = await issuer.discovery()
    assert document is not None and dict(document) == DISCOVERY and issuer.fetches == 1
    assert await issuer.discovery() is document and issuer.fetches == 1
    with pytest.raises(TypeError):
        document["issuer"] = "https://elsewhere.invalid"  # type: ignore[index]
    assert await issuer.key("k1", "ES256") is not None
    assert issuer.fetches == 2  # the JWKS only
    keys_first = Documents(clock=Clock())
    assert await keys_first.key("k1", "ES256") is not None
    assert dict(await keys_first.discovery() or {}) == DISCOVERY
    assert keys_first.fetches == 2  # discovery and JWKS, once each


async def test_a_discovery_document_not_had_is_asked_for_again_once_per_refetch_interval() -> None:
    clock = Clock()
    issuer = Flaky(clock=clock)
    assert await issuer.discovery() is None and issuer.fetches == 1
    clock.t += 29.9
    assert await issuer.discovery() is None and issuer.fetches == 1  # not yet
    issuer.failing = False
    assert await issuer.discovery() is None and issuer.fetches == 1
    clock.t = 1000 + 30  # exactly the interval
    assert dict(await issuer.discovery() or {}) == DISCOVERY and issuer.fetches == 2


async def test_a_discovery_document_naming_another_issuer_is_not_had() -> None:
    other = {config().discovery: {**DISCOVERY, "issuer": "https://other.invalid"}}
    issuer = Documents(other, clock=Clock())
    assert await issuer.discovery() is None and issuer.fetches == 1
    assert await issuer.discovery() is None and issuer.fetches == 1


@pytest.mark.parametrize("failing", [False, True])
async def test_tasks_asking_at_once_share_one_fetch_whatever_it_brings(failing: bool) -> None:
    issuer = Flaky(clock=Clock())
    issuer.failing, issuer.held = failing, asyncio.Event()
    asking = [asyncio.create_task(issuer.discovery()) for _ in range(3)]
    await asyncio.sleep(0)
    issuer.held.set()
    found = await asyncio.gather(*asking)
    assert issuer.fetches == 1
    assert found == [None] * 3 if failing else all(dict(f or {}) == DISCOVERY for f in found)


def test_a_documents_url_is_had_only_when_https_or_http_to_loopback() -> None:
    document = {
        "secure": "https://kc.example/token",
        "loopback": "http://127.0.0.1:8080/token",
        "plain": "http://kc.example/token",
        "number": 5,
    }
    assert oidc.document_url(document, "secure") == "https://kc.example/token"
    assert oidc.document_url(document, "loopback") == "http://127.0.0.1:8080/token"
    for name in ("plain", "number", "absent"):
        assert oidc.document_url(document, name) is None, name
