"""The simulated WMS over HTTP: `Simulator`, its handlers, and `route_table`, the one list of what
answers where (EWMS's WMS and MQS routes, the OIDC stub, the test hooks under `/_sim/`)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from skyscan_local import ewms_schema as schema
from skyscan_local import task_manager_simulator as tms
from skyscan_local.wms_controls import Delay, Fault, SimulatorSettings, take
from skyscan_local.wms_rules import ROLE_TMS, ROLE_USER, SimError, fake_jwt, roles_for
from skyscan_local.wms_state import WMS

log = logging.getLogger("skyscan_local.wms_simulator")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROLE_KEY = web.RequestKey("ewms_role", str)
FROM_TMS_KEY = web.RequestKey("from_tms", bool)


class AnswerError(Exception):
    """The simulator was about to answer something EWMS's schema does not allow: its own bug."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "error": message}, status=status)


def reply(model: type[BaseModel], doc: Any, status: int = 200) -> web.Response:
    """An answer, once EWMS's schema allows it: an answer it does not allow is the simulator's bug."""
    try:
        schema.check(model, doc)
    except schema.SchemaError as e:
        raise AnswerError(f"{model.__name__}: {e}") from None
    return web.json_response(doc, status=status)


def ok() -> web.Response:
    return web.json_response({"ok": True})


async def body_of(request: web.Request) -> Any:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError:
        raise SimError(400, "requests body is not JSON-encoded") from None
    if not isinstance(body, dict):
        raise SimError(400, "JSON-encoded requests body must be a 'dict'")
    return body


def schedd_of(request: web.Request) -> str:
    if "schedd" not in request.query:
        raise SimError(400, "Missing argument: schedd")
    return request.query["schedd"]


def own_address(request: web.Request, host: str) -> str:
    """Where this process reaches itself: the port a request came in on, at loopback when listening
    on every address (a Pod's own Service may not route back to it)."""
    port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{local}]' if ':' in local else local}:{port}"


class Simulator:
    """One simulated WMS served over HTTP: its state (`wms`), the task manager's client secret, and a
    handler for each route of `route_table`."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.wms = WMS(settings)
        self.tms_secret = settings.tms_client_secret or secrets.token_urlsafe(24)

    def route_table(self) -> tuple[tuple[str, str, Handler], ...]:
        return (
            # EWMS's WMS and MQS, each answer checked against its model
            ("POST", "/v1/workflows", self.post_workflow),
            ("GET", "/v1/workflows/{wf}", self.get_workflow),
            ("POST", "/v1/workflows/{wf}/actions/{how:abort|finished}", self.deactivate),
            ("POST", "/v1/query/{kind:workflows|taskforces|task-directives}", self.query),
            ("POST", "/v1/task-directives/{task_id}/actions/add-workers", self.add_workers),
            ("GET", "/v1/mqs/workflows/{wf}/mq-profiles/public", self.mq_profiles),
            # the task manager's
            ("GET", "/v1/tms/pending-starter/taskforces", self.pending_starter),
            ("GET", "/v1/tms/pending-stopper/taskforces", self.pending_stopper),
            ("POST", "/v1/tms/{phase:condor-submit|condor-rm|condor-complete}/taskforces/{uuid}",
             self.tms_phase),
            ("POST", "/v1/tms/{phase:condor-submit|condor-rm}/taskforces/{uuid}/failed", self.tms_failed),
            ("POST", "/v1/tms/statuses/taskforces", self.tms_statuses),
            # the OIDC stub
            ("GET", "/.well-known/openid-configuration", self.discovery),
            ("POST", "/oidc/token", self.token),
            # the test hooks
            ("POST", "/_sim/faults", self.add_fault),
            ("POST", "/_sim/delays", self.add_delay),
            ("POST", "/_sim/clear", self.clear),
            ("POST", "/_sim/reset", self.reset),
            ("POST", "/_sim/statuses", self.pin_statuses),
            ("PATCH", "/_sim/config", self.configure),
            ("GET", "/_sim/workflows", self.all_workflows),
            ("GET", "/_sim/queries", self.queries),
            ("GET", "/_sim/fetches", self.fetches),
            ("GET", "/_sim/requests", self.requests),
        )  # fmt: skip

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self.simulate])
        app.add_routes([web.route(method, path, handler) for method, path, handler in self.route_table()])
        app.cleanup_ctx.append(self.task_manager)
        return app

    async def task_manager(self, app: web.Application) -> AsyncIterator[None]:
        """The simulated task manager, a client of this server's /v1/tms/* routes like the real one."""
        if not self.wms.settings.task_manager:
            yield
            return
        wms = self.wms
        manager = tms.TaskManager(
            lambda: wms.address,
            schedds=lambda: sorted(set(wms.settings.schedds().values())),
            settings=lambda: wms.settings,
            client=(wms.settings.tms_client_id, self.tms_secret) if wms.settings.require_auth else None,
            fetches=wms.fetches,
        )
        task = asyncio.create_task(manager.run())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @web.middleware
    async def simulate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Request log, auth, injected faults and delays; only the EWMS routes are affected."""
        wms = self.wms
        wms.address = wms.address or own_address(request, wms.settings.host)  # for the task manager
        ewms, hook = request.path.startswith("/v1/"), request.path.startswith("/_sim/")
        # The task manager's calls are neither logged nor faulted: tests count and fault the operator's.
        from_tms = request[FROM_TMS_KEY] = request.headers.get(tms.CLIENT_HEADER) == tms.CLIENT_NAME
        if ewms and not from_tms:
            wms.requests.append((request.method, request.path))
        request[ROLE_KEY] = ROLE_USER  # auth off: the first role, as the real WMS's CI mode does
        if wms.settings.require_auth and (ewms or hook):
            role = wms.tokens.get(request.headers.get("Authorization", "").removeprefix("Bearer "))
            if role is None:
                return error(403, "authentication failed")  # as EWMS answers a missing or bad token
            if ewms and role not in roles_for(request.path, request.method):
                return error(403, "authorization failed")
            request[ROLE_KEY] = role
        if not ewms:
            return await handler(request)
        now = time.time()
        if fault := None if from_tms else take(wms.faults, request.method, request.path, now):
            return error(fault.status, "injected fault")
        delay = None if from_tms else take(wms.delays, request.method, request.path, now)
        if delay and delay.when == "before":
            await asyncio.sleep(delay.seconds)
        try:
            wms.advance(time.time())
            response = await handler(request)
        except SimError as e:
            if e.status < 500:
                log.info("refused %s %s: %s %s", request.method, request.path, e.status, e)
            response = error(e.status, str(e))
        except AnswerError as e:
            log.error(
                "BUG: the simulator's answer to %s %s breaks EWMS's schema: %s",
                request.method,
                request.path,
                e,
            )
            response = error(500, f"simulator answer violates the EWMS schema: {e}")
        if request.method != "GET":
            wms.save()
        if delay and delay.when == "after":
            await asyncio.sleep(delay.seconds)
        return response

    # --- EWMS ---
    async def post_workflow(self, request: web.Request) -> web.Response:
        created = self.wms.create_workflow(await body_of(request), time.time())
        return reply(schema.WorkflowCreated, created)

    async def get_workflow(self, request: web.Request) -> web.Response:
        return reply(schema.WorkflowObject, self.wms.workflow(request.match_info["wf"]).doc)

    async def deactivate(self, request: web.Request) -> web.Response:
        how = "ABORTED" if request.match_info["how"] == "abort" else "FINISHED"
        out = self.wms.deactivate(request.match_info["wf"], how, time.time())
        return reply(schema.Deactivated, out)

    async def query(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        found = self.wms.find(kind, await body_of(request), log=not request[FROM_TMS_KEY])
        try:
            return web.json_response(schema.check_query_answer(kind, found))
        except schema.SchemaError as e:
            raise AnswerError(f"query {kind}: {e}") from None

    async def add_workers(self, request: web.Request) -> web.Response:
        body = await body_of(request)
        tf = self.wms.add_workers(request.match_info["task_id"], body, time.time(), request[ROLE_KEY])
        return reply(schema.TaskforceObject, tf)

    async def mq_profiles(self, request: web.Request) -> web.Response:
        profiles = self.wms.public_mq_profiles(request.match_info["wf"])
        return reply(schema.PublicMQProfiles, {"mqprofiles": profiles})

    async def pending_starter(self, request: web.Request) -> web.Response:
        found = self.wms.tms_pending_starter(schedd_of(request))
        return reply(schema.PendingStarter if found else schema.Empty, found)

    async def pending_stopper(self, request: web.Request) -> web.Response:
        found = self.wms.tms_pending_stopper(schedd_of(request))
        return reply(schema.TaskforceObject if found else schema.Empty, found)

    async def tms_phase(self, request: web.Request) -> web.Response:
        info = request.match_info
        out = self.wms.tms_phase(info["uuid"], info["phase"], await body_of(request), False, time.time())
        return reply(schema.TaskforceUUID, out)

    async def tms_failed(self, request: web.Request) -> web.Response:
        info = request.match_info
        out = self.wms.tms_phase(info["uuid"], info["phase"], await body_of(request), True, time.time())
        return reply(schema.TaskforceUUID, out)

    async def tms_statuses(self, request: web.Request) -> web.Response:
        status, out = self.wms.tms_statuses(await body_of(request))
        return reply(schema.StatusesAnswer, out, status)

    # --- OIDC ---
    async def discovery(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        return web.json_response({"issuer": base, "token_endpoint": f"{base}/oidc/token"})

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "client_credentials" or not form.get("client_id"):
            return error(400, "client_credentials grant with a client_id expected")
        client_id = str(form["client_id"])
        role = self.client_role(client_id, str(form.get("client_secret", "")))
        if role is None:
            return error(401, "unknown client or wrong secret")
        jwt = fake_jwt({"sub": client_id, "ewms_role": role}, 300)
        self.wms.tokens[jwt] = role
        return web.json_response({"access_token": jwt, "token_type": "Bearer", "expires_in": 300})

    def client_role(self, client_id: str, secret: str) -> str | None:
        """The client credentials grant's check: the task manager's client, or the one configured client."""
        settings = self.wms.settings
        if client_id == settings.tms_client_id:
            return ROLE_TMS if hmac.compare_digest(secret, self.tms_secret) else None
        if settings.client_id is not None and not hmac.compare_digest(client_id, settings.client_id):
            return None
        if settings.client_secret is not None and not hmac.compare_digest(secret, settings.client_secret):
            return None
        return ROLE_USER

    # --- the test hooks ---
    async def add_fault(self, request: web.Request) -> web.Response:
        b = await request.json()
        self.wms.faults.append(
            Fault(status=int(b.get("status", 503)), until=time.time() + float(b.get("seconds", 3600)),
                  count=b.get("count"), path_prefix=b.get("path_prefix", "/v1/"), method=b.get("method"))
        )  # fmt: skip
        return ok()

    async def add_delay(self, request: web.Request) -> web.Response:
        b = await request.json()
        self.wms.delays.append(
            Delay(seconds=float(b["seconds"]), when=b.get("when", "before"), count=b.get("count"),
                  path_prefix=b.get("path_prefix", "/v1/"), method=b.get("method"))
        )  # fmt: skip
        return ok()

    async def clear(self, request: web.Request) -> web.Response:
        self.wms.faults.clear()
        self.wms.delays.clear()
        return ok()

    async def reset(self, request: web.Request) -> web.Response:
        tokens = dict(self.wms.tokens)
        self.wms.reset()
        self.wms.tokens.update(tokens)  # the task manager's (and the test's) token stays good
        return ok()

    async def pin_statuses(self, request: web.Request) -> web.Response:
        try:
            changed = self.wms.pin_statuses(await request.json())
            self.wms.save()
            return web.json_response({"changed": changed})
        except SimError as e:
            return error(e.status, str(e))

    async def configure(self, request: web.Request) -> web.Response:
        wms = self.wms
        wms.settings = wms.settings.model_copy(update=await request.json())
        return web.json_response(
            wms.settings.model_dump(mode="json", exclude={"client_secret", "tms_client_secret"})
        )

    async def all_workflows(self, request: web.Request) -> web.Response:
        self.wms.advance(time.time())
        return web.json_response(
            {"workflows": [
                {**w.doc, "request": w.request, "taskforces": [t.doc for t in w.taskforces],
                 "mqprofiles": w.mqprofiles}
                for w in self.wms.workflows.values()
            ]}
        )  # fmt: skip

    async def queries(self, request: web.Request) -> web.Response:
        return web.json_response({"queries": self.wms.queries})

    async def fetches(self, request: web.Request) -> web.Response:
        return web.json_response({"fetches": self.wms.fetches})

    async def requests(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.wms.requests})
