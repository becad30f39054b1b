"""Which scan, and which role, a verified scanner token speaks for (`scanner_identity`), and the
authenticator of scanner tokens (`ScannerTokens`) against a stand-in for the API server."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from api_shim import auth, oidc
from api_shim.errors import ApiError
from api_shim.scanner_auth import DISCOVERY_PATH, ClusterIssuer, ScannerTokens, get_json, scanner_identity
from api_shim.wire_names import Names
from skyscan import names
from skyscan.io import kube, kubeconfig
from skyscan.io.kube_errors import KubeError

NAMESPACE, SCAN = "skyscan", "0123456789abcdef0123456789abcdef"


def k8s_claims(**overrides: Any) -> dict[str, Any]:
    claims = {
        "namespace": NAMESPACE,
        "serviceaccount": {"name": names.SCANNER_SERVICE_ACCOUNT},
        "secret": {"name": names.scanner_token_secret_name(SCAN)},
    }
    return {"kubernetes.io": claims | overrides}


def test_a_scanner_token_carries_the_system_role_for_its_own_scan_only() -> None:
    identity = scanner_identity(k8s_claims(), NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert identity is not None
    assert identity.roles == frozenset({auth.SYSTEM}) and identity.scan_id == SCAN


@pytest.mark.parametrize("speaks", list(Names))
def test_a_scanner_is_answered_in_the_names_the_setting_gives(speaks: Names) -> None:
    """IceCube's scanner reads the reference's names (the default); a scanner written to the
    interface's is configured so."""
    assert scanner_identity(k8s_claims(), NAMESPACE, names.SCANNER_SERVICE_ACCOUNT).names is Names.REFERENCE  # type: ignore[union-attr]
    identity = scanner_identity(k8s_claims(), NAMESPACE, names.SCANNER_SERVICE_ACCOUNT, speaks)
    assert identity is not None and identity.names is speaks


def test_a_scanner_token_from_another_namespace_is_refused() -> None:
    claims = k8s_claims(namespace="elsewhere")
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


def test_a_token_of_another_service_account_is_not_a_scanners() -> None:
    claims = k8s_claims(serviceaccount={"name": "default"})
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


def test_a_token_bound_to_a_secret_not_of_a_scanner_is_refused() -> None:
    claims = k8s_claims(secret={"name": f"skyscan-{SCAN}-ewms"})
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None
    assert scanner_identity({}, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


def test_a_scanner_identity_is_named_after_its_scan() -> None:
    identity = scanner_identity(k8s_claims(), NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert identity == auth.Identity(
        f"scanner:{SCAN}", frozenset({auth.SYSTEM}), scan_id=SCAN, names=Names.REFERENCE
    )


def test_a_token_bound_to_no_secret_or_to_a_nameless_one_is_refused() -> None:
    for secret in (None, {}, {"name": None}, {"name": ""}):
        claims = k8s_claims(secret=secret)
        assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None, secret
    claims = k8s_claims(serviceaccount=None)
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


# The authenticator end to end: tokens signed here, the issuer's discovery and keys served by a stand-in
# for the API server client (the shim fetches them through it).

ISSUER = "https://kubernetes.default.svc.cluster.local"
JWKS_PATH = "/openid/v1/jwks"
KEY = ec.generate_private_key(ec.SECP256R1())


class ApiServer(kube.Kube):
    """Answers `read` for the discovery document and the JWKS only, counting what it is asked."""

    def __init__(self, documents: dict[str, bytes | Exception]) -> None:
        super().__init__(kubeconfig.Endpoint("http://unused.invalid"))
        self.documents = documents
        self.asked: list[tuple[str, str, str]] = []

    async def read(self, method: str, path: str, **options: Any) -> bytes:
        self.asked.append((method, path, options.get("accept", "")))
        answer = self.documents.get(path, KubeError(404, "Not Found"))
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    async with ApiServer(issuer_documents()) as server:
        assert isinstance(server, ApiServer)
        yield server


def issuer_documents() -> dict[str, bytes | Exception]:
    jwk = {**json.loads(ECAlgorithm.to_jwk(KEY.public_key())), "kid": "k1", "use": "sig"}
    discovery = {"issuer": ISSUER, "jwks_uri": f"https://10.0.0.1:6443{JWKS_PATH}"}
    return {DISCOVERY_PATH: json.dumps(discovery).encode(), JWKS_PATH: json.dumps({"keys": [jwk]}).encode()}


def scanner_token(namespace: str = NAMESPACE, audience: str = names.SCANNER_TOKEN_AUDIENCE) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": [audience],
        "exp": now + 600,
        "iat": now,
        **k8s_claims(namespace=namespace),
    }
    return jwt.encode(claims, KEY, algorithm="ES256", headers={"kid": "k1"})


async def test_a_scanner_token_signed_by_the_clusters_issuer_speaks_for_its_scan(api: ApiServer) -> None:
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    identity = await tokens.authenticate(scanner_token())
    assert identity == auth.Identity(
        f"scanner:{SCAN}", frozenset({auth.SYSTEM}), scan_id=SCAN, names=Names.REFERENCE
    )
    accept = "application/json, application/jwk-set+json"
    # the issuer's name from discovery, then its keys (through discovery, as any issuer's)
    assert api.asked == [("GET", p, accept) for p in (DISCOVERY_PATH, DISCOVERY_PATH, JWKS_PATH)]
    assert await tokens.authenticate(scanner_token()) == identity
    assert len(api.asked) == 3  # the issuer is learnt once, its keys kept
    interface = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT, Names.INTERFACE)
    assert (await interface.authenticate(scanner_token())) == auth.Identity(
        f"scanner:{SCAN}", frozenset({auth.SYSTEM}), scan_id=SCAN, names=Names.INTERFACE
    )
    issuer = (await tokens.verifier()).issuers[ISSUER]
    assert issuer.config.audience == names.SCANNER_TOKEN_AUDIENCE and issuer.fetches == 2


async def test_a_scanner_token_from_another_namespace_is_refused_by_the_authenticator(api: ApiServer) -> None:
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert await tokens.authenticate(scanner_token(namespace="elsewhere")) is None


async def test_a_token_for_another_audience_is_not_a_scanners(api: ApiServer) -> None:
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert await tokens.authenticate(scanner_token(audience="https://kubernetes.default.svc")) is None


async def test_a_token_that_is_not_a_jwt_costs_no_request(api: ApiServer) -> None:
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert await tokens.authenticate("static-token") is None
    assert await tokens.authenticate("a.b") is None
    assert api.asked == []


async def test_an_unreachable_issuer_answers_503_retry_not_invalid(api: ApiServer) -> None:
    for failure in (KubeError(500, "Internal Server Error"), aiohttp.ClientConnectionError("refused")):
        api.documents = {DISCOVERY_PATH: failure}
        tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
        with pytest.raises(ApiError) as unavailable:
            await tokens.authenticate(scanner_token())
        assert unavailable.value.status == 503
        assert unavailable.value.reason == "authentication unavailable"
        assert unavailable.value.message == "The cluster's token issuer cannot be reached; retry."
        api.documents = issuer_documents()  # back: the next token is verified
        assert (await tokens.authenticate(scanner_token())) is not None


async def test_a_key_set_the_api_server_cannot_give_refuses_the_token_and_keeps_the_shim_up(
    api: ApiServer,
) -> None:
    api.documents[JWKS_PATH] = aiohttp.ClientConnectionError("reset")
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert await tokens.authenticate(scanner_token()) is None


async def test_an_api_server_document_is_read_as_json_up_to_its_size_limit(api: ApiServer) -> None:
    exactly = b'"' + b"x" * (oidc.MAX_DOCUMENT_BYTES - 2) + b'"'
    api.documents = {"/big": exactly, "/bigger": exactly + b" ", "/gone": KubeError(403, "Forbidden")}
    assert await get_json(api, "/big") == "x" * (oidc.MAX_DOCUMENT_BYTES - 2)
    with pytest.raises(ValueError, match=f"^/bigger: larger than {oidc.MAX_DOCUMENT_BYTES} bytes$"):
        await get_json(api, "/bigger")
    with pytest.raises(ValueError, match=r"^/gone: HTTP 403$"):
        await get_json(api, "/gone")


async def test_the_verifiers_options_and_the_issuers_fetch_options_are_the_callers(api: ApiServer) -> None:
    tokens = ScannerTokens(api, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT, cache_size=7, leeway=5.0)
    verifier = await tokens.verifier()
    assert (verifier.cache_size, verifier.leeway) == (7, 5.0)
    issuer = ClusterIssuer(api, ISSUER, refetch_interval=3.0, jwks_max_age=9.0)
    assert (issuer.refetch_interval, issuer.jwks_max_age) == (3.0, 9.0)


async def test_an_api_server_away_is_an_os_error_naming_the_url(api: ApiServer) -> None:
    api.documents = {JWKS_PATH: aiohttp.ClientConnectionError("reset")}
    issuer = ClusterIssuer(api, ISSUER)
    with pytest.raises(
        OSError, match=r"^https://10\.0\.0\.1:6443/openid/v1/jwks: ClientConnectionError\('reset'\)$"
    ):
        await issuer._get_json(f"https://10.0.0.1:6443{JWKS_PATH}")
    assert issuer.fetches == 1
