"""The dashboard's login configuration (`GET /ui/config`) and its Content-Security-Policy, with and without
an OIDC issuer, over real HTTP from a real shim; the issuer here is a real HTTP server on loopback that
serves a discovery document (its tokens are the Keycloak test's business, tests/e2e/test_dashboard_oidc.py).
A dashboard issuer the shim does not verify tokens of stops the shim before it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from api_shim.handlers.ui import CSP
from api_shim.plumbing import SERVER_OPTIONS
from api_shim.settings import ShimSettings
from tests.integration.shim.conftest import MakeShim, ShimUnderTest

BASE_CSP = CSP.format(connect="'self'")


class FakeIssuer:
    """A discovery document served over HTTP on loopback; its token endpoint at another origin."""

    def __init__(self, server: TestServer, modes: list[str] | None) -> None:
        self.url = str(server.make_url("")).rstrip("/")
        self.issuer = f"{self.url}/realms/skyscan"
        self.modes = modes
        self.token_origin = "http://127.0.0.2:9443"
        self.asked = 0

    def document(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/protocol/openid-connect/auth",
            "token_endpoint": f"{self.token_origin}/realms/skyscan/protocol/openid-connect/token",
            "end_session_endpoint": f"{self.issuer}/protocol/openid-connect/logout",
            "jwks_uri": f"{self.issuer}/protocol/openid-connect/certs",
        }
        if self.modes is not None:
            found["response_modes_supported"] = self.modes
        return found

    def settings(self, **more: Any) -> dict[str, Any]:
        people = [{"issuer": self.issuer, "audience": "account"}]
        return {
            "oidc_issuers": people,
            "ui_oidc_issuer": self.issuer,
            "ui_oidc_client_id": "dashboard",
            **more,
        }


MakeIssuer = Callable[..., Any]


@pytest.fixture
async def make_issuer() -> AsyncIterator[MakeIssuer]:
    servers: list[TestServer] = []

    async def make(modes: list[str] | None = None) -> FakeIssuer:
        app = web.Application()
        server = TestServer(app, host="127.0.0.1")
        issuer: FakeIssuer | None = None

        async def discovery(request: web.Request) -> web.Response:
            assert issuer is not None
            issuer.asked += 1
            return web.json_response(issuer.document())

        app.router.add_get("/realms/skyscan/.well-known/openid-configuration", discovery)
        await server.start_server(**SERVER_OPTIONS)
        servers.append(server)
        issuer = FakeIssuer(server, modes)
        return issuer

    yield make
    for server in servers:
        await server.close()


async def test_without_oidc_the_page_has_no_issuer_and_connects_to_its_own_origin_only(
    shim: ShimUnderTest, make_shim: MakeShim, tmp_path: Path
) -> None:
    got = await shim.call("GET", "/ui/config", as_=None)
    assert (got.status, got.body) == (200, {"login_links": False, "oidc": None})
    for path in ("/ui/", "/ui/config", "/ui/app.js"):
        answer = await shim.call("GET", path, as_=None)
        assert answer.headers["Content-Security-Policy"] == BASE_CSP, path
    assert "connect-src 'self';" in BASE_CSP
    with_links = await make_shim(ui_login_file=tmp_path / "ui-login.json")
    got = await with_links.call("GET", "/ui/config", as_=None)
    assert got.body == {"login_links": True, "oidc": None}


async def test_with_oidc_the_page_learns_the_issuers_endpoints_and_may_connect_to_its_token_endpoint(
    make_shim: MakeShim, make_issuer: MakeIssuer
) -> None:
    issuer = await make_issuer()
    shim = await make_shim(**issuer.settings())
    page = await shim.call("GET", "/ui/", as_=None)  # first: its CSP already names the token endpoint
    assert page.status == 200
    widened = BASE_CSP.replace("connect-src 'self';", f"connect-src 'self' {issuer.token_origin};")
    assert page.headers["Content-Security-Policy"] == widened  # that origin added, nothing else
    got = await shim.call("GET", "/ui/config", as_=None)
    assert (got.status, got.body) == (
        200,
        {
            "login_links": False,
            "oidc": {
                "issuer": issuer.issuer,
                "authorization_endpoint": f"{issuer.issuer}/protocol/openid-connect/auth",
                "token_endpoint": f"{issuer.token_origin}/realms/skyscan/protocol/openid-connect/token",
                "end_session_endpoint": f"{issuer.issuer}/protocol/openid-connect/logout",
                "client_id": "dashboard",
                "scopes": "openid profile",
                "response_mode": "fragment",  # unlisted: OIDC's default modes, fragment among them
            },
        },
    )
    assert got.headers["Content-Security-Policy"] == widened
    for _ in range(3):
        await shim.call("GET", "/ui/config", as_=None)
    assert issuer.asked == 1  # the discovery document is read once


async def test_an_issuer_that_answers_only_in_the_query_is_asked_to_and_the_scopes_are_the_settings(
    make_shim: MakeShim, make_issuer: MakeIssuer
) -> None:
    issuer = await make_issuer(modes=["query", "form_post"])
    shim = await make_shim(**issuer.settings(ui_oidc_scopes="openid email"))
    got = await shim.call("GET", "/ui/config", as_=None)
    assert (got.body["oidc"]["response_mode"], got.body["oidc"]["scopes"]) == ("query", "openid email")


async def test_an_issuer_out_of_reach_is_said_and_the_page_still_connects_to_its_own_origin_only(
    make_shim: MakeShim, make_issuer: MakeIssuer
) -> None:
    issuer = await make_issuer()
    settings = issuer.settings()
    gone = "http://127.0.0.1:9/realms/skyscan"  # the discard port: nothing listens
    settings["oidc_issuers"] = [{"issuer": gone, "audience": "account"}]
    shim = await make_shim(**{**settings, "ui_oidc_issuer": gone})
    page = await shim.call("GET", "/ui/", as_=None)
    assert (page.status, page.headers["Content-Security-Policy"]) == (200, BASE_CSP)
    got = await shim.call("GET", "/ui/config", as_=None)
    assert (got.status, got.body["reason"]) == (503, "login unavailable")
    assert gone in got.body["message"]
    assert got.headers["Content-Security-Policy"] == BASE_CSP


def test_a_dashboard_issuer_must_be_one_whose_tokens_the_shim_verifies() -> None:
    people = [{"issuer": "https://kc.example/realms/a", "audience": "skyscan"}]
    with pytest.raises(ValidationError, match="is not one of SKYSCAN_OIDC_ISSUERS' issuers"):
        ShimSettings(oidc_issuers=people, ui_oidc_issuer="https://kc.example/realms/b", ui_oidc_client_id="d")
    with pytest.raises(ValidationError, match="needs SKYSCAN_UI_OIDC_CLIENT_ID"):
        ShimSettings(oidc_issuers=people, ui_oidc_issuer="https://kc.example/realms/a")
    fine = ShimSettings(
        oidc_issuers=people, ui_oidc_issuer="https://kc.example/realms/a", ui_oidc_client_id="d"
    )
    assert fine.ui_oidc_scopes == "openid profile"


def test_the_shim_refuses_to_start_with_a_dashboard_issuer_it_does_not_verify(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SKYSCAN_TOKEN_FILE": str(tmp_path / "tokens.json"),
        "SKYSCAN_OIDC_ISSUERS": json.dumps([{"issuer": "https://kc.example/realms/a", "audience": "s"}]),
        "SKYSCAN_UI_OIDC_ISSUER": "https://kc.example/realms/other",
        "SKYSCAN_UI_OIDC_CLIENT_ID": "dashboard",
    }
    done = subprocess.run(
        [sys.executable, "-m", "api_shim.app", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "SKYSCAN_UI_OIDC_ISSUER 'https://kc.example/realms/other' is not one of SKYSCAN_OIDC_ISSUERS'" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


async def test_a_token_endpoint_whose_origin_is_no_plain_host_loosens_nothing(
    make_shim: MakeShim, make_issuer: MakeIssuer
) -> None:
    issuer = await make_issuer()
    issuer.token_origin = "https://kc.example;script-src *"  # no origin: a CSP directive smuggled in
    shim = await make_shim(**issuer.settings())
    page = await shim.call("GET", "/ui/", as_=None)
    assert page.headers["Content-Security-Policy"] == BASE_CSP
    got = await shim.call("GET", "/ui/config", as_=None)
    assert (got.status, got.body["reason"]) == (503, "login unavailable")
