"""The dashboard's login at a real OIDC issuer, in a real browser: Keycloak (tools/keycloak/install.sh's,
started here with a realm this test writes: the dashboard's public client with PKCE S256 required, and
people with the realm roles skyscan-user, skyscan-viewer and skyscan-system), a `skyscan-shim serve`
process that verifies its tokens and names it as the dashboard's issuer, and Debian's chromium driven
by Playwright. A person logs in on Keycloak's own form and lands on the scans page under their name, the
token in this tab's session storage only (never the address bar, local storage or the shim's log); the
token is renewed with the refresh token before it expires (the realm's tokens live 20 s); logging out
clears it and ends the Keycloak session too. A viewer sees no Launch link; a person whose token carries
only the system role is refused with the service's words. Screenshots in .skyscan/test-artifacts/."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from api_shim import auth
from skyscan_local.audit_probes import poll
from skyscan_local.processes import free_port
from tests.conftest import Cluster
from tests.e2e.conftest import _create_namespace, _delete_namespace
from tests.e2e.keycloak import Keycloak, installed, keycloak
from tests.e2e.test_dashboard import browser as browser  # the module's chromium (a fixture)
from tests.e2e.test_dashboard import watched_tab
from tests.integration.shim.conftest import start_shim_process

CLIENT = "skyscan-dashboard"
PASSWORD = "correct horse battery staple"
LIFESPAN = 20  # seconds an access token lives: renewed within the test
TOKEN = "skyscan.token"
PEOPLE = {"ada": "skyscan-user", "grace": "skyscan-viewer", "hal": "skyscan-system"}


def realm(shim: str) -> dict[str, Any]:
    """The realm Keycloak imports: the dashboard's client as docs/operating/dashboard.md sets it up."""
    person = [
        {
            "username": name,
            "enabled": True,
            "firstName": name.title(),
            "lastName": "Tester",
            "email": f"{name}@example.org",
            "emailVerified": True,
            "credentials": [{"type": "password", "value": PASSWORD, "temporary": False}],
            "realmRoles": [role],
        }
        for name, role in PEOPLE.items()
    ]
    audience = {  # the shim's issuer configuration asks for aud `skyscan`
        "name": "skyscan-audience",
        "protocol": "openid-connect",
        "protocolMapper": "oidc-audience-mapper",
        "config": {"included.custom.audience": "skyscan", "access.token.claim": "true"},
    }
    return {
        "realm": "skyscan",
        "enabled": True,
        "accessTokenLifespan": LIFESPAN,
        "roles": {"realm": [{"name": role} for role in PEOPLE.values()]},
        "clients": [
            {
                "clientId": CLIENT,
                "publicClient": True,
                "standardFlowEnabled": True,
                "implicitFlowEnabled": False,
                "directAccessGrantsEnabled": False,
                "redirectUris": [f"{shim}/ui/"],
                "webOrigins": [shim],
                "attributes": {
                    "pkce.code.challenge.method": "S256",
                    "post.logout.redirect.uris": f"{shim}/ui/",
                },
                "protocolMappers": [audience],
            }
        ],
        "users": person,
    }


SHIM_PORT = free_port()  # the realm names the shim's address before either starts
SHIM = f"http://127.0.0.1:{SHIM_PORT}"


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keycloak]:
    try:
        home = installed()
    except RuntimeError as e:
        pytest.skip(f"OIDC LOGIN NOT TESTED: no Keycloak ({e}; `make test` installs it)")
    with keycloak(home, tmp_path_factory.mktemp("keycloak"), realm(SHIM)) as server:
        print(f"Keycloak served its realm {server.started_in:.1f} s after its start")
        yield server


@pytest.fixture(scope="module")
def shim(cluster: Cluster, issuer: Keycloak, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A shim whose dashboard logs people in at `issuer`, on SHIM, in a namespace of its own; yields its
    log. Module-scoped, so it starts before the browser (whose sync API holds this thread's loop)."""
    workdir, namespace = tmp_path_factory.mktemp("shim"), f"oidc-{secrets.token_hex(4)}"
    asyncio.run(_create_namespace(cluster.kubeconfig, namespace))
    log, tokens = workdir / "shim.log", workdir / "tokens.json"
    auth.make_token(tokens, "alice", ["user"])
    settings = {
        "SKYSCAN_PORT": str(SHIM_PORT),
        "SKYSCAN_OIDC_ISSUERS": json.dumps([{"issuer": issuer.issuer, "audience": "skyscan"}]),
        "SKYSCAN_UI_OIDC_ISSUER": issuer.issuer,
        "SKYSCAN_UI_OIDC_CLIENT_ID": CLIENT,
    }
    process, _ = start_shim_process(cluster, namespace, tokens, log, **settings)
    try:

        def serving() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"{SHIM}/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        assert poll(serving, 60), f"the shim does not serve after 60 s: {log.read_text()}"
        yield log
    finally:
        process.terminate()
        process.wait(10)
        asyncio.run(_delete_namespace(cluster.kubeconfig, namespace))


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A tab; the shim's pages may log no error (Keycloak's own pages are not this test's)."""

    def problem(message: ConsoleMessage) -> bool:
        url = str(message.location.get("url", ""))
        # Chromium logs every 4xx answer to a fetch as an error: the session's refusal of a token that
        # is not a person's is the page's to show (the second test checks that it does).
        refused = url == f"{SHIM}/ui/session" and "status of 403" in message.text
        return url.startswith(SHIM) and not refused

    with watched_tab(browser, request, problem) as opened:
        yield opened


def log_in(page: Page, issuer: Keycloak, name: str) -> None:
    """From the logged-out page: Log in, Keycloak's form, and back."""
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{issuer.issuer}/protocol/openid-connect/auth?*")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.press("input[name=password]", "Enter")
    page.wait_for_url(f"{SHIM}/ui/**")


def log_out(page: Page, issuer: Keycloak) -> None:
    """Log out, confirmed on Keycloak's page, and back to the logged-out page."""
    page.click("#logout")
    page.wait_for_url(f"{issuer.issuer}/protocol/openid-connect/logout?*")
    page.click("#kc-logout")
    page.wait_for_url(f"{SHIM}/ui/**")
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    assert page.evaluate(f"sessionStorage.getItem('{TOKEN}')") is None


@pytest.mark.timeout(900)  # Keycloak's start (bounded at 420 s) comes first
def test_a_person_logs_in_at_keycloak_their_token_is_renewed_and_logging_out_ends_it(
    issuer: Keycloak, shim: Path, page: Page
) -> None:
    answer = page.goto(f"{SHIM}/ui/")
    assert answer is not None
    csp = answer.headers["content-security-policy"]
    assert f"connect-src 'self' {issuer.url};" in csp and "unsafe-inline" not in csp  # the token endpoint's
    log_in(page, issuer, "ada")
    expect(page.locator("#who")).to_have_text("ada")
    expect(page.get_by_role("heading", name="Scans")).to_be_visible()
    expect(page.locator("#launch-link")).to_be_visible()  # a user may launch
    # The code and state left the address bar; the token is this tab's, in session storage only.
    assert page.evaluate("location.search") == ""
    assert page.evaluate("location.hash") == "#/scans"
    first = page.evaluate(f"sessionStorage.getItem('{TOKEN}')")
    assert isinstance(first, str) and first.count(".") == 2  # a JWT
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("sessionStorage.getItem('skyscan.oidc.flow')") is None  # the round trip's, spent

    # Renewed before it expires, with no reload; the new token is the service's too.
    page.wait_for_function(
        f"t => sessionStorage.getItem('{TOKEN}') !== t", arg=first, timeout=3 * LIFESPAN * 1000
    )
    renewed = page.evaluate(f"sessionStorage.getItem('{TOKEN}')")
    assert renewed and renewed != first
    page.click("a[href='#/backlog']")
    expect(page.get_by_role("heading", name="Backlog")).to_be_visible()
    expect(page.locator("#who")).to_have_text("ada")
    shim_log = shim.read_text()
    assert first not in shim_log and renewed not in shim_log and "code=" not in shim_log

    log_out(page, issuer)
    assert page.evaluate("sessionStorage.length") == 0
    # The Keycloak session ended too: logging in again asks for the password.
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("input[name=password]")).to_be_visible()


@pytest.mark.timeout(900)
def test_a_viewer_sees_no_launch_link_and_a_system_token_is_refused_with_the_services_words(
    issuer: Keycloak, shim: Path, page: Page
) -> None:
    page.goto(f"{SHIM}/ui/")
    log_in(page, issuer, "grace")
    expect(page.locator("#who")).to_have_text("grace")
    expect(page.get_by_role("heading", name="Scans")).to_be_visible()
    expect(page.locator("#launch-link")).to_be_hidden()
    log_out(page, issuer)

    log_in(page, issuer, "hal")
    refusal = (
        "The dashboard is for people: this token is a scanner's, or has neither the user nor the viewer role."
    )
    expect(page.get_by_text(refusal)).to_be_visible()
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    expect(page.locator("#who")).to_be_hidden()
    assert page.evaluate(f"sessionStorage.getItem('{TOKEN}')") is None
