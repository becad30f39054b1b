"""The aiohttp application: factory, per-route guard (auth, roles, redirects), and the CLI.

`skyscan-shim serve` runs it; `skyscan-shim make-token` adds a token to the static token file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NoReturn, TypedDict

from aiohttp import web
from aiohttp.web_urldispatcher import _InfoDict
from pydantic import ValidationError

from api_shim import auth, oidc, openapi
from api_shim.access import LOGGER, AccessLogger, refused_requests_in_brief
from api_shim.bodies import BODIES, BodyBudget, body_of
from api_shim.errors import ApiError, error_response
from api_shim.handlers import ui
from api_shim.handlers.events import STREAMS, EventStreams, close_streams
from api_shim.handlers.scanner_log import LOG_STREAMS, LogStreams, close_log_streams
from api_shim.metrics import CATCH_ALL, METRICS, METRICS_PATH, ShimMetrics, Tally
from api_shim.plumbing import (
    FOUND,
    IDENTITY,
    NAMES,
    ROUTE_TABLE,
    SERVER_OPTIONS,
    SHIM,
    Handler,
    Route,
    Shim,
    body_flag,
    query_bool,
    refuse_encoded_body,
    unvouched,
)
from api_shim.repository import Scans
from api_shim.routes import ROUTES, SCAN_ID
from api_shim.scanner_auth import ScannerTokens
from api_shim.settings import ShimSettings
from api_shim.wire_names import Names
from skyscan import logs
from skyscan.io import kube
from skyscan.io.archive import Archive
from skyscan.scan_record import ScanRecord
from skyscan.tags import TagCatalog

AUTHENTICATORS = web.AppKey("authenticators", list[auth.Authenticator])
# What scanners and clients poll: aiohttp tries the routes under /scan in the order they were added.
POLLED = ("/scan/{scan_id}/status", "/scan/{scan_id}/manifest")
log = logging.getLogger(__name__)


def redirect_location(request: web.Request, old: str, new: str) -> str:
    """The request's path and query with the scan id swapped. Relative, as the reference sends it:
    nothing of the Location comes from headers a client controls (Host, X-Forwarded-*)."""
    path = request.rel_url.raw_path.replace(old, new, 1)
    query = request.rel_url.raw_query_string
    return path + (f"?{query}" if query else "")


def guard(route: Route, metrics: ShimMetrics) -> Handler:
    """The handler aiohttp calls for `route`, all a request passes through in one coroutine (the app has
    no middleware: aiohttp would add a coroutine and a wrapper a request for one). From the outside in:
    the answer is counted and timed (`api_shim.metrics`; scrapes of /metrics are not), what was raised
    is answered in the error body's shape (`api_shim.errors`; a redirection is raised again, for aiohttp
    to answer), a write is answered with the Scan version it wrote (`api_shim.repository.versions`); then the
    checks in their order: an encoded body refused, the caller authenticated, its roles, a scanner's
    confinement, the body's room, freshness and a replaced scan's redirect."""
    handler, roles, method = route.handler, route.roles, route.method
    tallies: dict[int, Tally] | None = None if route.path == METRICS_PATH else {}  # by status

    async def guarded(request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        status = 500  # what a request cut short (cancelled) is counted as
        try:
            with Scans.noting_writes() as written:
                try:
                    refuse_encoded_body(request)
                    identity = None if roles is None else await _identify(request, route, roles)
                    async with request.app[BODIES].room(request):  # after auth: only callers' bodies are read
                        if identity is not None and _to_check(request, route, identity):
                            await _check(request, route, identity)
                        response = await handler(request)
                except Exception as e:
                    response = error_response(request, e)  # a redirection is raised again
                else:
                    written.answer(response)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            if tallies is not None:
                if (tally := tallies.get(status)) is None:
                    tally = tallies[status] = metrics.bind(route.path, method, status)
                tally.add(request, time.monotonic() - started)

    guarded.__name__ = route.handler.__name__
    return guarded


class CatchAll(web.Resource):
    """Every path, "*" (`OPTIONS *`) among them: the resource of what no other route takes. Indexed
    under "/" (its template's part before "{"), the last of the router's tries for any path."""

    @property
    def canonical(self) -> str:
        return CATCH_ALL

    def _match(self, path: str) -> dict[str, str]:
        return {}

    def raw_match(self, path: str) -> bool:
        return False  # a name for no path

    def get_info(self) -> _InfoDict:
        return {"formatter": CATCH_ALL}

    def url_for(self, **kwargs: str) -> NoReturn:
        raise RuntimeError("no URL is made for the catch-all")

    def add_prefix(self, prefix: str) -> None:
        raise RuntimeError("the catch-all takes no prefix")


def unmatched(metrics: ShimMetrics) -> Handler:
    """The handler of every request no route takes: 404, or 405 naming the methods the path's routes
    take, in the error body's shape, counted as the route `unmatched` (the path is never a label)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        started, allowed, catch_all = time.monotonic(), set[str](), request.match_info.route.resource
        for resource in request.app.router.resources():
            if resource is not catch_all:
                allowed |= (await resource.resolve(request))[1]
        refused = web.HTTPMethodNotAllowed(request.method, allowed) if allowed else web.HTTPNotFound()
        response = error_response(request, refused)
        metrics.observe(request, response.status, time.monotonic() - started)
        return response

    return answer


def answer_unmatched(app: web.Application, metrics: ShimMetrics) -> None:
    """Route what no route of `app` takes to `unmatched` (after all of them)."""
    catch_all = CatchAll()
    app.router.register_resource(catch_all)
    catch_all.add_route("*", unmatched(metrics))


async def _identify(request: web.Request, route: Route, roles: frozenset[str]) -> auth.Identity:
    """The caller, authenticated and allowed the route (401, 403; 503 while the shim cannot vouch for
    its copy of the Scans), noted on the request with the wire names its answer speaks."""
    if stale := unvouched(request.app[SHIM]):
        raise ApiError(503, "kubernetes API unavailable", stale)
    identity = await _caller(request)
    if identity is None:
        raise ApiError(
            401, "authentication failed", "Send a valid bearer token.", {"WWW-Authenticate": "Bearer"}
        )
    if not identity.roles & roles:
        raise ApiError(403, "authorization failed", f"This route needs one of: {', '.join(sorted(roles))}.")
    if identity.scan_id is not None:
        _confine(request, identity.scan_id, route)
    request[IDENTITY] = identity
    request[NAMES] = route.names or identity.names
    return identity


async def _caller(request: web.Request) -> auth.Identity | None:
    return await auth.identify(request.app[AUTHENTICATORS], request.headers.get("Authorization"))


def _page_actions(routes: tuple[Route, ...]) -> dict[str, frozenset[str]]:
    """The roles each of the dashboard's actions needs, as the route table declares them."""
    by_route = {(r.method, r.path): r.roles or frozenset() for r in routes}
    return {
        "launch": by_route["POST", "/scan"],
        "abort": by_route["DELETE", SCAN_ID],
        "rescan": by_route["POST", SCAN_ID + "/actions/rescan"],
        "add_workers": by_route["POST", SCAN_ID + "/actions/add-workers"],
    }


def _to_check(request: web.Request, route: Route, identity: auth.Identity) -> bool:
    """Whether a caller's request waits for freshness or may be redirected: a read of a live scan that
    was not replaced, the most common, is known by one lookup."""
    if Scans.asks_version(request):
        return True
    if not route.redirect or not identity.is_person:
        return False
    return not request.app[SHIM].scans.live_and_current(request.match_info["scan_id"])


async def _check(request: web.Request, route: Route, identity: auth.Identity) -> None:
    """After auth (only callers may make the shim read): wait for the version asked for, redirect a
    person's request about a replaced scan."""
    if Scans.asks_version(request):
        await request.app[SHIM].scans.reach(request)
    if route.redirect and identity.is_person:
        await _maybe_redirect(request, route)


def _confine(request: web.Request, scan_id: str, route: Route) -> None:
    """A scanner's credential acts on its own scan only, and only while that scanner may act; it reads
    and reports (the writes that are the system's alone), never acts as a person (rescan, delete...)."""
    if route.method != "GET" and route.roles != frozenset({auth.SYSTEM}):
        raise ApiError(403, "authorization failed", "A scanner's credential cannot act for a person.")
    if request.match_info.get("scan_id") != scan_id:
        raise ApiError(403, "authorization failed", f"This credential is valid for scan {scan_id} only.")
    scan = request.app[SHIM].scans.live(scan_id)
    if scan is None or not ScanRecord(scan).scanner_may_act:
        raise ApiError(403, "authorization failed", f"The scanner credential of scan {scan_id} is revoked.")


async def _maybe_redirect(request: web.Request, route: Route) -> None:
    old = request.match_info["scan_id"]
    scans = request.app[SHIM].scans
    if scans.is_live(old):  # known without unpacking the Scan, which a kept form never needs
        new = scans.replaced_by(old)
    else:
        scan = await scans.get(old)
        if scan is None:
            return
        request[FOUND] = scan  # the handler reads the same copy (one archive query per request)
        new = ScanRecord(scan).replaced_by
    if not new:
        return
    if query_bool(request, "no_redirect") or (
        request.can_read_body and body_flag(await body_of(request), "no_redirect")
    ):
        return
    location = redirect_location(request, old, new)
    if route.method == "GET":
        raise web.HTTPFound(location)
    raise web.HTTPTemporaryRedirect(location)


class VerifierOptions(TypedDict):
    leeway: float
    refetch_interval: float
    jwks_max_age: float
    cache_size: int


def verifier_options(settings: ShimSettings) -> VerifierOptions:
    """How a JWT verifier is tuned: the same for people's tokens (OIDC) and scanners' (the cluster's)."""
    return {
        "leeway": settings.oidc_leeway_seconds,
        "refetch_interval": settings.oidc_jwks_refetch_seconds,
        "jwks_max_age": settings.oidc_jwks_max_age_seconds,
        "cache_size": settings.oidc_token_cache_size,
    }


def authenticators(settings: ShimSettings) -> list[auth.Authenticator]:
    """Static tokens (local use) first, a dictionary lookup; then people's OIDC JWTs."""
    if settings.auth_disabled:
        return [auth.AllowAll()]
    found: list[auth.Authenticator] = []
    if settings.token_file is not None:
        found.append(auth.StaticTokens.load(settings.token_file))
    if settings.oidc_issuers:
        verifier = oidc.OIDCVerifier(settings.oidc_issuers, **verifier_options(settings))
        found.append(auth.OIDCPeople(verifier))
    if not found:
        raise SystemExit(
            "set SKYSCAN_OIDC_ISSUERS, SKYSCAN_TOKEN_FILE (local use; see `skyscan-shim make-token`)"
            " or SKYSCAN_AUTH_DISABLED=true"
        )
    return found


def dashboard_login(settings: ShimSettings, found: list[auth.Authenticator]) -> ui.OIDCLogin | None:
    """The dashboard's OIDC client (SKYSCAN_UI_OIDC_*), sharing its issuer's discovery with the verifier
    of people's tokens where that verifies the issuer's tokens."""
    if settings.ui_oidc_issuer is None or settings.ui_oidc_client_id is None:
        return None
    for authenticator in found:
        if isinstance(authenticator, auth.OIDCPeople):
            issuer = authenticator.verifier.issuers.get(settings.ui_oidc_issuer)
            if issuer is not None:
                return ui.OIDCLogin(issuer, settings.ui_oidc_client_id, settings.ui_oidc_scopes)
    config = next(i for i in settings.oidc_issuers if i.issuer == settings.ui_oidc_issuer)
    issuer = oidc.Issuer(config, refetch_interval=settings.oidc_jwks_refetch_seconds)
    return ui.OIDCLogin(issuer, settings.ui_oidc_client_id, settings.ui_oidc_scopes)


async def create_app(
    settings: ShimSettings, authenticators_: list[auth.Authenticator] | None = None
) -> web.Application:
    metrics = ShimMetrics()
    app = web.Application(client_max_size=settings.max_body_bytes)  # no middleware: `guard` serves
    app[METRICS] = metrics
    app[BODIES] = BodyBudget(settings.body_bytes_at_once, settings.max_body_bytes, settings.body_wait_seconds)
    app[STREAMS] = EventStreams(settings)
    app.on_shutdown.append(close_streams)
    app[LOG_STREAMS] = LogStreams(settings)
    app.on_shutdown.append(close_log_streams)
    app[AUTHENTICATORS] = authenticators_ if authenticators_ is not None else authenticators(settings)
    app[ROUTE_TABLE] = ROUTES
    # Stable: a path's methods stay together (one resource), the rest in the route table's order.
    for route in sorted(ROUTES, key=lambda r: POLLED.index(r.path) if r.path in POLLED else len(POLLED)):
        app.router.add_route(route.method, route.path, guard(route, metrics))
    # Before the catch-all, which answers any other path.
    ui.add_routes(
        app,
        settings.ui_login_file,
        _caller,
        _page_actions(ROUTES),
        dashboard_login(settings, app[AUTHENTICATORS]),
    )
    answer_unmatched(app, metrics)

    async def kubernetes(app: web.Application) -> AsyncIterator[None]:
        api = await kube.connect(settings.kubeconfig)
        if not any(isinstance(a, auth.AllowAll) for a in app[AUTHENTICATORS]):
            # Scanners' own tokens, verified against the cluster's service-account issuer.
            app[AUTHENTICATORS].append(
                ScannerTokens(
                    api,
                    settings.namespace,
                    settings.scanner_service_account,
                    settings.scanner_names,
                    **verifier_options(settings),
                )
            )
        archive = None if settings.archive_dsn is None else await Archive.connect(settings.archive_dsn)
        scans = await Scans.connect(
            api,
            settings.namespace,
            watch_timeout=settings.watch_timeout,
            timeout=settings.write_timeout,
            archive=archive,
        )
        app[METRICS].watch(scans)
        app[SHIM] = Shim(
            settings=settings,
            api=api,
            scans=scans,
            writes=scans.writes(settings.add_workers_timeout),
            tags=TagCatalog(settings.tag_catalog_dir, settings.tags),
        )
        yield
        await scans.close()
        await api.close()

    app.cleanup_ctx.append(kubernetes)
    return app


def server_tls(settings: ShimSettings) -> ssl.SSLContext | None:
    """The HTTPS context of SKYSCAN_TLS_CERT_FILE and SKYSCAN_TLS_KEY_FILE (both or neither)."""
    if settings.tls_cert_file is None and settings.tls_key_file is None:
        return None
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise SystemExit("set both SKYSCAN_TLS_CERT_FILE and SKYSCAN_TLS_KEY_FILE, or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


def shim_runner(app: web.Application) -> web.AppRunner:
    """How the shim serves `app`: a line a request in its own access log (aiohttp's own, with the path
    and query asked for, is never written), signals left to `serve`."""
    return web.AppRunner(
        app,
        handle_signals=False,
        access_log=logging.getLogger(LOGGER),
        access_log_class=AccessLogger,
        **SERVER_OPTIONS,
    )


async def serve(settings: ShimSettings) -> None:
    """Serve until SIGTERM or SIGINT, then `shutdown_delay_seconds` more (a rollout's requests still
    reach a deleted Pod for a moment; refused, they would fail a scanner's poll), then close: the
    port first, then in-flight requests and event streams, as aiohttp's shutdown does."""
    runner = shim_runner(await create_app(settings))
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, ssl_context=server_tls(settings))
        await site.start()
        stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
        await stopping.wait()
        log.info("stopping: serving %g s more, then closing", settings.shutdown_delay_seconds)
        await asyncio.sleep(settings.shutdown_delay_seconds)
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyscan-shim", description="The Skyscan REST shim.")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("serve", help="serve the REST interface (configured by SKYSCAN_* variables)")
    make = sub.add_parser("make-token", help="add a bearer token to a static token file and print it")
    make.add_argument("--file", type=Path, required=True)
    make.add_argument("--name", required=True)
    make.add_argument("--roles", default="user", help="comma-separated: user,system,viewer")
    make.add_argument(
        "--names",
        type=Names,
        default=Names.INTERFACE,
        choices=list(Names),
        help="the wire names its answers speak",
    )
    sub.add_parser("openapi", help="print the OpenAPI document")
    args = parser.parse_args(argv)
    if args.command == "make-token":
        print(auth.make_token(args.file, args.name, [r for r in args.roles.split(",") if r], args.names))
        return 0
    if args.command == "openapi":
        json.dump(openapi.document(ROUTES), sys.stdout, indent=2)
        return 0
    try:
        settings = ShimSettings()
    except ValidationError as e:  # one line a setting, naming it: no traceback
        raise SystemExit(f"skyscan-shim: the settings are not valid: {e}") from None
    logs.configure(settings.log_format, settings.log_level, batched=True)  # a line a request: off the loop
    logging.getLogger("aiohttp.server").addFilter(refused_requests_in_brief)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
