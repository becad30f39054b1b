"""The dashboard (`/ui/`): its files, from the package's `ui_assets`, and the local stack's login links.

Every answer under /ui/ carries a Content-Security-Policy that lets the page run this origin's scripts
and styles only (no inline script, no other host, no framing), `nosniff` and no referrer. The files
are read once, at start, and served from memory.

A login link (`make up` prints one) holds a one-time code: `POST /ui/login` exchanges it, once and before
it expires, for the token the local stack made for its user. `SKYSCAN_UI_LOGIN_FILE` holds each code's
SHA-256 with its token and expiry (read at each exchange, so a new link needs no restart); without it
there are no login links. Codes are spent in this process's memory, so each works once per replica.

`GET /ui/config` (public) tells the page how people log in: whether login links exist here, and,
with SKYSCAN_UI_OIDC_ISSUER, the issuer's authorization and token endpoints (from its discovery
document), the dashboard's public client id and scopes, for the authorization-code flow with PKCE the
page runs itself (`login.js`). The CSP's `connect-src` then names the token endpoint's origin too, so
the page may exchange its code there; nothing else is loosened.

`GET /ui/session` tells the page who its token is and which actions the route table lets it take, so
the page offers no button the service would refuse. It refuses what is not a person's token (a
scanner's credential, the system's), with 403: the page is for people.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StringConstraints

from api_shim import oidc
from api_shim.auth import Identity, token_hash
from api_shim.errors import ApiError, error_response, not_found
from api_shim.plumbing import ok, parse_body

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src {connect}; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP.format(connect="'self'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
INDEX = "index.html"


class LoginBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    code: Annotated[str, StringConstraints(min_length=1, max_length=128)]


def assets() -> dict[str, tuple[bytes, str]]:
    """The dashboard's files by name, with their content types."""
    folder = resources.files("api_shim") / "ui_assets"
    found = {}
    for item in folder.iterdir():
        kind = TYPES.get(Path(item.name).suffix)
        if kind is not None:
            found[item.name] = (item.read_bytes(), kind)
    return found


class LoginCodes:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.spent: dict[str, float] = {}  # code hash -> its expiry (forgotten once past it)

    def exchange(self, code: str) -> str:
        """The token of a valid, unspent, unexpired code; 401 otherwise (404: no login links here)."""
        if self.path is None:
            raise not_found("login link")
        now = time.time()
        self.spent = {h: t for h, t in self.spent.items() if t > now}
        try:
            codes = json.loads(self.path.read_text()).get("codes", {})
        except (OSError, ValueError, AttributeError):
            codes = {}
        entry = codes.get(hash_ := token_hash(code))
        if not isinstance(entry, dict) or hash_ in self.spent or not entry.get("expires_at", 0) > now:
            raise ApiError(
                401, "login link not valid", "The link was used, has expired or is unknown: run `make up`."
            )
        self.spent[hash_] = float(entry["expires_at"])
        return str(entry["token"])


# An origin a CSP source names as it is: a host name, an IPv4 or a bracketed IPv6 address, a port.
ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]+)?")


def _origin(url: str) -> str | None:
    """The origin of `url`, if it is a plain host name or address (with a port or not)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    return origin if ORIGIN.fullmatch(origin) else None


class OIDCLogin:
    """The dashboard's OIDC client: where the page sends people to log in and exchanges their code, read
    from the issuer's discovery document (fetched once, on the first need)."""

    def __init__(self, issuer: oidc.Issuer, client_id: str, scopes: str) -> None:
        self.issuer, self.client_id, self.scopes = issuer, client_id, scopes
        self.token_origin: str | None = None  # the token endpoint's, once known: the CSP lets the page in

    async def config(self) -> dict[str, str]:
        """What the page needs for the authorization-code flow; 503 while the issuer cannot tell."""
        document = await self.issuer.discovery()
        endpoints = {
            name: oidc.document_url(document, name) if document is not None else None
            for name in ("authorization_endpoint", "token_endpoint", "end_session_endpoint")
        }
        authorize, exchange = endpoints["authorization_endpoint"], endpoints["token_endpoint"]
        origin = _origin(exchange) if exchange is not None else None
        if authorize is None or exchange is None or origin is None:
            raise ApiError(
                503,
                "login unavailable",
                f"The OIDC issuer {self.issuer.config.issuer} cannot be reached or names no authorization "
                "and token endpoints: try again in a minute.",
            )
        self.token_origin = origin
        # The code in the fragment never reaches a server's access log; an issuer that cannot answer
        # there answers in the query, which the page removes at once. Unlisted: OIDC's default, both.
        modes = document.get("response_modes_supported", ["query", "fragment"]) if document else []
        found = {
            "issuer": self.issuer.config.issuer,
            "authorization_endpoint": authorize,
            "token_endpoint": exchange,
            "client_id": self.client_id,
            "scopes": self.scopes,
            "response_mode": "fragment" if "fragment" in modes else "query",
        }
        if endpoints["end_session_endpoint"] is not None:
            found["end_session_endpoint"] = endpoints["end_session_endpoint"]
        return found

    def headers(self) -> dict[str, str]:
        """The security headers, the token endpoint's origin among those the page may connect to."""
        if self.token_origin is None:
            return SECURITY_HEADERS
        return {
            **SECURITY_HEADERS,
            "Content-Security-Policy": CSP.format(connect=f"'self' {self.token_origin}"),
        }


Handler = Callable[[web.Request], Awaitable[web.Response]]
Identify = Callable[[web.Request], Awaitable[Identity | None]]


def session(identity: Identity | None, actions: dict[str, frozenset[str]]) -> dict[str, object]:
    """What the page may show `identity`: its name, its roles and the actions (by name) it may take."""
    if identity is None:
        raise ApiError(
            401, "authentication failed", "Send a valid bearer token.", {"WWW-Authenticate": "Bearer"}
        )
    if not identity.is_person:
        raise ApiError(
            403,
            "authorization failed",
            "The dashboard is for people: this token is a scanner's, or has neither the user nor the viewer "
            "role.",
        )
    may = sorted(name for name, roles in actions.items() if roles & identity.roles)
    return {"name": identity.name, "roles": sorted(identity.roles), "may": may}


def add_routes(
    app: web.Application,
    login_file: Path | None,
    identify: Identify,
    actions: dict[str, frozenset[str]],
    people: OIDCLogin | None = None,
) -> None:
    """The dashboard's routes; `actions`: the roles each of the page's actions needs (the route table's);
    `people`: the dashboard's OIDC client, if people log in at an issuer."""
    files, codes = assets(), LoginCodes(login_file)

    def _secured(handler: Handler) -> Handler:
        """`handler` with its refusals as the interface's Error bodies, and every answer's security
        headers."""

        async def secured(request: web.Request) -> web.Response:
            try:
                response = await handler(request)
            except ApiError as e:
                response = error_response(request, e)
            response.headers.update(people.headers() if people is not None else SECURITY_HEADERS)
            return response

        return secured

    async def page(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or INDEX
        if name not in files:
            raise not_found("file")
        if name == INDEX and people is not None and people.token_origin is None:
            with contextlib.suppress(ApiError):  # the page's CSP names the token endpoint, once known
                await people.config()
        body, kind = files[name]
        return web.Response(body=body, content_type=kind, charset="utf-8")

    async def config(request: web.Request) -> web.Response:
        return ok({"login_links": login_file is not None, "oidc": await people.config() if people else None})

    async def login(request: web.Request) -> web.Response:
        body = await parse_body(request, LoginBody)
        return ok({"token": codes.exchange(body.code)})

    async def who(request: web.Request) -> web.Response:
        return ok(session(await identify(request), actions))

    async def to_page(request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/ui/", headers=SECURITY_HEADERS)

    app.router.add_get("/ui", to_page)
    app.router.add_get("/ui/", _secured(page))
    app.router.add_get("/ui/session", _secured(who))  # before /ui/{name}, which would take it
    app.router.add_get("/ui/config", _secured(config))
    app.router.add_get("/ui/{name}", _secured(page))
    app.router.add_post("/ui/login", _secured(login))
