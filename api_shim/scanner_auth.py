"""The scanners' credentials: each scan's own service-account token, verified as an OIDC token of the
cluster's service-account issuer and confined to that scan.

The operator mints the token with the TokenRequest API for the `skyscan-scanner` ServiceAccount,
audience `skyscan-scanner`, bound to the per-scan Secret `skyscan-<scan_id>-scanner`. Its claims
name that Secret, so the scan is read from a verified claim, never from the request. Verification is
local (the issuer's JWKS, fetched through the API server the shim already talks to, with its TLS and
credentials, whatever URL the issuer names) and cached until the token expires, so a request costs no
API call. Revocation does not wait for expiry: `app.guard` honours a scanner identity only while its
scan is not deleted, its credential not revoked and its Job not ended (`ScanRecord.scanner_may_act`),
which the watch cache tells at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from api_shim import auth, oidc
from api_shim.errors import ApiError
from api_shim.wire_names import Names
from skyscan import names
from skyscan.io import kube
from skyscan.io.kube_errors import KubeError

DISCOVERY_PATH = "/.well-known/openid-configuration"


class ClusterIssuer(oidc.Issuer):
    """The cluster's service-account issuer, reached through the Kubernetes API client."""

    def __init__(self, api: kube.Kube, issuer: str, **kwargs: Any) -> None:
        config = oidc.IssuerConfig(issuer=issuer, audience=names.SCANNER_TOKEN_AUDIENCE)
        super().__init__(config, **kwargs)
        self._api = api

    async def _get_json(self, url: str) -> Any:
        self.fetches += 1
        try:
            return await get_json(self._api, urlsplit(url).path)
        except aiohttp.ClientError as e:  # the API server away: keep the keys known so far
            raise OSError(f"{url}: {e!r}") from e


async def get_json(api: kube.Kube, path: str) -> Any:
    """GET a non-resource path of the API server (discovery, JWKS) with the client's credentials."""
    try:
        body = await api.read("GET", path, accept="application/json, application/jwk-set+json")
    except KubeError as e:
        raise ValueError(f"{path}: HTTP {e.status}") from e
    if len(body) > oidc.MAX_DOCUMENT_BYTES:
        raise ValueError(f"{path}: larger than {oidc.MAX_DOCUMENT_BYTES} bytes")
    return json.loads(body)


def scanner_identity(
    claims: Mapping[str, Any], namespace: str, account: str, speaks: Names = Names.REFERENCE
) -> auth.Identity | None:
    """The scan a verified scanner token speaks for, from the claims Kubernetes wrote into it."""
    k8s = claims.get("kubernetes.io")
    if not isinstance(k8s, Mapping) or k8s.get("namespace") != namespace:
        return None
    if (k8s.get("serviceaccount") or {}).get("name") != account:
        return None
    scan_id = names.scan_id_of_scanner_secret(str((k8s.get("secret") or {}).get("name") or ""))
    if scan_id is None:
        return None
    # The system role only: a scanner reports on its scan; rescans, workers and deletes are people's.
    return auth.Identity(
        name=f"scanner:{scan_id}", roles=frozenset({auth.SYSTEM}), scan_id=scan_id, names=speaks
    )


class ScannerTokens:
    """An `auth.Authenticator` for scanner tokens; the issuer is learnt from the API server's own
    discovery document on first use."""

    def __init__(
        self, api: kube.Kube, namespace: str, account: str, speaks: Names = Names.REFERENCE, **verifier: Any
    ) -> None:
        self._api, self._namespace, self._account, self._speaks = api, namespace, account, speaks
        self._options = verifier
        self._verifier: oidc.OIDCVerifier | None = None

    async def verifier(self) -> oidc.OIDCVerifier:
        if self._verifier is None:
            issuer = (await get_json(self._api, DISCOVERY_PATH))["issuer"]
            cluster = ClusterIssuer(self._api, issuer)
            self._verifier = oidc.OIDCVerifier([cluster], **self._options)
        return self._verifier

    async def authenticate(self, token: str) -> auth.Identity | None:
        if token.count(".") != 2:  # not a JWT: not a scanner's token
            return None
        try:
            verifier = await self.verifier()
        except (ValueError, KeyError, OSError, aiohttp.ClientError) as e:
            # The API server is away: the token may well be good, so say "try again", not "invalid".
            oidc.log.warning("the cluster's service-account issuer is not reachable: %r", e)
            raise ApiError(
                503, "authentication unavailable", "The cluster's token issuer cannot be reached; retry."
            ) from e
        claims = await verifier.claims(token)
        return scanner_identity(claims, self._namespace, self._account, self._speaks) if claims else None
