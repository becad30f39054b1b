"""A local EWMS simulator: the WMS and MQS routes the operator uses, on one host, in memory.

`python -m skyscan_local.wms_simulator --port 8081` (or the `skyscan-wms-simulator` script). The lifecycle
follows the real service with short, configurable delays: message queues activate
`activation_delay` after the request; each taskforce then steps pre-launch -> pending-starter ->
condor-submit (workers IDLE) -> workers RUNNING, one `step_delay` apart; abort/finished move
taskforces to pending-stopper -> condor-rm -> condor-complete. A second deactivation is a 404.
Time is evaluated lazily on every request.

Workers run their task's init command before they work (`run_init_command`, which the local stack
turns on): each taskforce's workers fetch `startup.json` from the URL in `init_args` (the presigned
URL the operator put there) once their condor jobs start. Until one fetch succeeds they stay IDLE,
so a scan completes only when the scanner's sidecar uploaded the file and the URL verifies: a 404
(not uploaded yet) or an unreachable shim is retried every `init_retry_seconds`; any other answer
(a 403: bad or expired signature) fails the workers visibly at once (`COMPLETED: FatalError`, and
`top_task_errors`; a real worker's curl retries until the pilot's init timeout, then fails alike).
Each fetch is logged (`worker fetched startup.json for <workflow> via presigned URL: 200 (N bytes)`)
and listed by `GET /_sim/fetches`. This is the simulator's one background task.

Test hooks live under `/_sim/` (faults, delays, pinned statuses, configuration, inspection, a reset);
an OIDC stub (`/.well-known/openid-configuration`, `/oidc/token`) exercises client-credentials auth.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hmac
import json
import logging
import os
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

STOP_PHASES = ("pending-stopper", "condor-rm", "condor-complete")
FORBIDDEN_PILOT_ENV = {
    "EWMS_PILOT_TASK_IMAGE", "EWMS_PILOT_TASK_ARGS", "EWMS_PILOT_TASK_ENV_JSON",
    "EWMS_PILOT_INIT_IMAGE", "EWMS_PILOT_INIT_ARGS", "EWMS_PILOT_INIT_ENV_JSON",
}  # fmt: skip
WORKFLOW_KEYS = {"public_queue_aliases", "tasks", "priority"}
TASK_REQUIRED = {
    "cluster_locations", "task_image", "task_args", "input_queue_aliases", "output_queue_aliases",
    "worker_config",
}  # fmt: skip
TASK_KEYS = TASK_REQUIRED | {"init_image", "init_args", "n_workers", "pilot_config", "task_env", "init_env"}
WORKER_CONFIG_KEYS = {
    "do_transfer_worker_stdouterr", "max_worker_runtime", "n_cores", "priority", "worker_disk",
    "worker_memory", "condor_requirements",
}  # fmt: skip
PILOT_CONFIG_KEYS = {"tag", "image_source", "environment", "input_files"}
INIT_URL = re.compile(r"'(https?://[^'\s]+)'")  # what the init command curls (see startup_url_of)
log = logging.getLogger("skyscan_local.wms_simulator")


class SimulatorSettings(BaseSettings):
    """Defaults for the command line, from `SKYSCAN_WMS_SIM_*`."""

    model_config = SettingsConfigDict(env_prefix="SKYSCAN_WMS_SIM_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=8081, description="Listen port; 0 picks a free one (printed on start).")
    activation_delay: float = Field(default=2.0, ge=0, description="Seconds until message queues activate.")
    step_delay: float = Field(default=1.0, ge=0, description="Seconds between taskforce phases.")
    page_size: int = Field(default=1000, ge=1, description="Objects per query page (next_after beyond).")
    clusters: list[str] = Field(default=["osg", "sub-2", "local"], description="Known cluster locations.")
    require_auth: bool = Field(
        default=False,
        description="Require a bearer token minted by /oidc/token on the EWMS routes and the test hooks "
        "(/_sim/*), as EWMS does.",
    )
    client_id: str | None = Field(default=None, description="The one client /oidc/token serves; unset: any.")
    client_secret: str | None = Field(
        default=None, description="That client's secret, checked by /oidc/token; unset: not checked."
    )
    run_init_command: bool = Field(
        default=False, description="Workers fetch startup.json from the init command's URL before working."
    )
    init_retry_seconds: float = Field(
        default=1.0, gt=0, description="A fetch answered 404 (or unreachable) is retried after this long."
    )
    state_file: Path | None = Field(
        default=None,
        description="Keep the workflows in this JSON file (written on every change, read on start), so a "
        "restarted simulator remembers them as the real WMS does; unset: in memory only.",
    )


class SimError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def new_id(prefix: str) -> str:
    return f"{prefix}-{int(time.time()):x}-{secrets.token_hex(4)}"


def dig(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def matches(doc: dict[str, Any], query: dict[str, Any]) -> bool:
    """The MongoDB filter subset clients use: dotted-path equality, `$in`, `$eq`, `$ne`."""
    for key, cond in query.items():
        value = dig(doc, key)
        if isinstance(cond, dict) and cond and all(k.startswith("$") for k in cond):
            for op, arg in cond.items():
                if op == "$in" and value not in arg:
                    return False
                if op == "$eq" and value != arg:
                    return False
                if op == "$ne" and value == arg:
                    return False
                if op not in ("$in", "$eq", "$ne"):
                    raise SimError(400, f"unsupported query operator {op}")
        elif value != cond:
            return False
    return True


@dataclass
class Fault:
    status: int
    until: float
    count: int | None
    path_prefix: str
    method: str | None


@dataclass
class Delay:
    seconds: float
    when: str  # "before" the handler runs, or "after" it ran (the answer is late; the effect is not)
    count: int | None
    path_prefix: str
    method: str | None


@dataclass
class Taskforce:
    doc: dict[str, Any]
    created: float
    pinned: bool = False  # statuses set through the hook are not overwritten by the lifecycle
    init_url: str | None = None  # the workers fetch this before they work (None: no init command run)
    init: str = "pending"  # "pending" | "done" | "failed"
    init_error: str = ""
    next_fetch: float = 0.0


@dataclass
class Workflow:
    doc: dict[str, Any]
    created: float
    directive: dict[str, Any]
    mqprofiles: list[dict[str, Any]]
    taskforces: list[Taskforce] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)


class WMS:
    """The simulated service's state and rules; `advance` applies everything time has made due."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.configured = settings
        self.reset()
        self.load()

    def reset(self) -> None:
        """Back to the settings it started with and no state (a test's start, when tests share it)."""
        self.settings = self.configured
        self.workflows: dict[str, Workflow] = {}
        self.tasks: dict[str, str] = {}  # task_id -> workflow_id
        self.faults: list[Fault] = []
        self.delays: list[Delay] = []
        self.requests: list[tuple[str, str]] = []
        self.queries: list[tuple[str, dict[str, Any]]] = []  # (kind, query) of every query route call
        self.tokens: set[str] = set()
        self.fetches: list[dict[str, Any]] = []  # every startup.json fetch by workers, in order
        self.due: dict[str, tuple[Workflow, Taskforce]] = {}  # taskforce uuid -> workers waiting on init

    # --- persistence (`state_file`) ---
    def load(self) -> None:
        path = self.settings.state_file
        if path is None or not path.exists():
            return
        state = json.loads(path.read_text())
        for raw in state["workflows"]:
            taskforces = [Taskforce(**tf) for tf in raw.pop("taskforces")]
            wf = Workflow(**raw, taskforces=taskforces)
            self.workflows[wf.doc["workflow_id"]] = wf
        self.tasks = dict(state["tasks"])

    def save(self) -> None:
        path = self.settings.state_file
        if path is None:
            return
        state = {"workflows": [asdict(wf) for wf in self.workflows.values()], "tasks": self.tasks}
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(state))
        os.replace(partial, path)  # a kill leaves the old state or the new one, never half of one

    # --- lifecycle ---
    def activation_time(self, wf: Workflow) -> float:
        return wf.created + self.settings.activation_delay

    def advance(self, now: float) -> None:
        step = self.settings.step_delay
        for wf in self.workflows.values():
            activated_at = self.activation_time(wf)
            if now >= activated_at and not wf.mqprofiles[0]["is_activated"]:
                for mq in wf.mqprofiles:
                    mq.update(
                        is_activated=True,
                        auth_token=fake_jwt({"mqid": mq["mqid"]}, 86400),
                        broker_type="rabbitmq",
                        broker_address="skyscan-sim@localhost/",
                    )
            deactivated_at = wf.doc["deactivated_ts"]
            for tf in wf.taskforces:
                start = max(activated_at, tf.created)
                if deactivated_at is None:
                    self._launch(wf, tf, now, start, step)
                else:
                    self.due.pop(tf.doc["taskforce_uuid"], None)
                    self._stop(tf, now, deactivated_at, step, wf.doc["deactivated"])

    def _launch(self, wf: Workflow, tf: Taskforce, now: float, start: float, step: float) -> None:
        plan = [("pre-launch", start), ("pending-starter", start + step), ("condor-submit", start + 2 * step)]
        for phase, at in plan:
            self._enter(tf, phase, now, at, "WMS")
        doc, n = tf.doc, tf.doc["n_workers"]
        if doc["phase"] == "condor-submit" and not tf.pinned:
            doc["cluster_id"] = doc["cluster_id"] or secrets.randbelow(10**6)
            started = now >= start + 3 * step  # the condor jobs run: first the init command
            if started and tf.init_url is not None and tf.init == "pending":
                self.due.setdefault(doc["taskforce_uuid"], (wf, tf))
            if started and tf.init == "failed":
                doc["compound_statuses"] = {"COMPLETED": {"FatalError": n}}
                doc["top_task_errors"] = {tf.init_error: n}
            elif started and (tf.init_url is None or tf.init == "done"):
                doc["compound_statuses"] = {"RUNNING": {"Tasking": n}}
            else:
                doc["compound_statuses"] = {"IDLE": {"null": n}}

    async def run_init(self, http: httpx.AsyncClient, wf: Workflow, tf: Taskforce) -> None:
        """The workers' init command: fetch startup.json through the presigned URL (one fetch stands
        for the taskforce's workers)."""
        assert tf.init_url is not None
        wf_id, n = wf.doc["workflow_id"], tf.doc["n_workers"]
        try:
            r = await http.get(tf.init_url)
            status, size, text = r.status_code, len(r.content), r.text[:200]
        except httpx.HTTPError as e:
            status, size, text = 0, 0, repr(e)
        self.fetches.append(
            {"workflow_id": wf_id, "taskforce_uuid": tf.doc["taskforce_uuid"], "status": status,
             "bytes": size, "timestamp": time.time()}
        )  # fmt: skip
        if status == 200:
            tf.init = "done"
            log.info(
                "worker fetched startup.json for %s via presigned URL: 200 (%d bytes; %d workers start)",
                wf_id, size, n,
            )  # fmt: skip
        elif status in (0, 404, 502, 503, 504):  # not uploaded yet, or the shim is unreachable: retry
            tf.next_fetch = time.time() + self.settings.init_retry_seconds
            why = "not uploaded yet" if status == 404 else text
            log.info(
                "worker could not fetch startup.json for %s via presigned URL yet: %s (%s); retrying in %gs",
                wf_id, status or "unreachable", why, self.settings.init_retry_seconds,
            )  # fmt: skip
        else:
            tf.init, tf.init_error = "failed", f"init command failed: curl: HTTP {status}: {text}"
            log.error(
                "worker FAILED to fetch startup.json for %s via presigned URL: %d %s", wf_id, status, text
            )
        self.advance(time.time())
        self.save()

    async def run_workers(self, poll_seconds: float = 0.1) -> None:
        """Start the init command of every taskforce whose workers are due (one fetch at a time each)."""
        running: dict[str, asyncio.Task[None]] = {}
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                now = time.time()
                self.advance(now)
                for key, (wf, tf) in list(self.due.items()):
                    if tf.init != "pending":
                        self.due.pop(key)
                    elif key not in running and now >= tf.next_fetch:
                        running[key] = asyncio.create_task(self.run_init(http, wf, tf))
                for key in [k for k, task in running.items() if task.done()]:
                    if error := running.pop(key).exception():
                        log.error("init command of taskforce %s crashed: %r", key, error)
                await asyncio.sleep(poll_seconds)

    def _stop(self, tf: Taskforce, now: float, at: float, step: float, how: str) -> None:
        doc = tf.doc
        self._enter(tf, "pending-stopper", now, at, "WMS")
        if doc["cluster_id"] is None:
            return  # never submitted: nothing for the TMS to remove
        self._enter(tf, "condor-rm", now, at + step, "TMS")
        self._enter(tf, "condor-complete", now, at + 2 * step, "TMS")
        if doc["phase"] == "condor-complete" and not tf.pinned:
            done = (
                {"COMPLETED": {"Done": doc["n_workers"]}} if how == "FINISHED" else {"REMOVED": {"null": 1}}
            )
            doc["compound_statuses"] = done

    @staticmethod
    def _enter(tf: Taskforce, phase: str, now: float, at: float, who: str) -> None:
        doc = tf.doc
        if now < at or any(e["target_phase"] == phase for e in doc["phase_change_log"]):
            return
        if doc["phase"] in STOP_PHASES and phase not in STOP_PHASES:
            return
        doc["phase"] = phase
        doc["phase_change_log"].append(
            {"target_phase": phase, "timestamp": at, "was_successful": True, "source_event_time": None,
             "source_entity": who, "context": "simulated lifecycle"}
        )  # fmt: skip

    # --- operations ---
    def create_workflow(self, body: Any, now: float) -> dict[str, Any]:
        validate_workflow_request(body, set(self.settings.clusters))
        task = body["tasks"][0]
        wf_id = new_id("WF")
        task_id = new_id("TK")
        mqs = [
            {"mqid": "a" + uuid.uuid4().hex[:20], "workflow_id": wf_id, "timestamp": now, "alias": alias,
             "is_public": True, "is_activated": False, "auth_token": None, "broker_type": None,
             "broker_address": None}
            for alias in body["public_queue_aliases"]
        ]  # fmt: skip
        by_alias = {mq["alias"]: mq["mqid"] for mq in mqs}
        directive = {
            "task_id": task_id, "workflow_id": wf_id, "timestamp": now,
            "cluster_locations": task["cluster_locations"], "task_image": task["task_image"],
            "task_args": task["task_args"], "task_env": task.get("task_env", {}),
            "init_image": task.get("init_image", ""), "init_args": task.get("init_args", ""),
            "init_env": task.get("init_env", {}),
            "input_queues": [by_alias.get(a, a) for a in task["input_queue_aliases"]],
            "output_queues": [by_alias.get(a, a) for a in task["output_queue_aliases"]],
        }  # fmt: skip
        priority = int(body.get("priority", 50))
        doc = {"workflow_id": wf_id, "timestamp": now, "priority": priority, "deactivated": None,
               "deactivated_ts": None}  # fmt: skip
        wf = Workflow(doc=doc, created=now, directive=directive, mqprofiles=mqs, request=body)
        for location in task["cluster_locations"]:
            wf.taskforces.append(
                self._taskforce(wf, location, int(task.get("n_workers") or 1), priority, "USER", now,
                                "Created during initial workflow request.")
            )  # fmt: skip
        self.workflows[wf_id] = wf
        self.tasks[task_id] = wf_id
        return {"workflow": doc, "task_directives": [directive], "taskforces": [t.doc for t in wf.taskforces]}

    def _taskforce(
        self, wf: Workflow, location: str, n_workers: int, priority: int, who: str, now: float, why: str
    ) -> Taskforce:
        task = wf.request["tasks"][0]
        init_url = startup_url_of(wf.directive["init_args"]) if self.settings.run_init_command else None
        doc = {
            "taskforce_uuid": new_id("TF"), "task_id": wf.directive["task_id"],
            "workflow_id": wf.doc["workflow_id"],
            "timestamp": now, "priority": priority, "cluster_location": location, "collector": None,
            "schedd": "sim-submitter.local", "n_workers": n_workers,
            "worker_config": task["worker_config"], "pilot_config": task.get("pilot_config", {}),
            "cluster_id": None, "submit_dict": {}, "job_event_log_fpath": "", "phase": "pre-mq-activation",
            "phase_change_log": [
                {"target_phase": "pre-mq-activation", "timestamp": now, "was_successful": True,
                 "source_event_time": None, "source_entity": who, "context": why}
            ],
            "compound_statuses": {}, "top_task_errors": {},
        }  # fmt: skip
        return Taskforce(doc=doc, created=now, init_url=init_url)

    def workflow(self, wf_id: str) -> Workflow:
        if wf_id not in self.workflows:
            raise SimError(404, f"workflow not found: {wf_id}")
        return self.workflows[wf_id]

    def deactivate(self, wf_id: str, how: str, now: float) -> dict[str, Any]:
        wf = self.workflows.get(wf_id)
        if wf is None or wf.doc["deactivated"] is not None:
            raise SimError(404, "no non-deactivated workflow found")
        wf.doc.update(deactivated=how, deactivated_ts=now)
        for tf in wf.taskforces:
            if tf.doc["phase"] in STOP_PHASES:
                tf.doc["phase_change_log"].append(
                    {"target_phase": "pending-stopper", "timestamp": now, "was_successful": False,
                     "source_event_time": None, "source_entity": "USER", "context": "already stopping"}
                )  # fmt: skip
        return {"workflow_id": wf_id, "n_taskforces": len(wf.taskforces)}

    def add_workers(self, task_id: str, body: Any, now: float) -> dict[str, Any]:
        if not isinstance(body, dict) or not {"cluster_location", "n_workers"} <= body.keys():
            raise SimError(400, "cluster_location and n_workers are required")
        if task_id not in self.tasks:
            raise SimError(404, f"task directive not found: {task_id}")
        wf = self.workflows[self.tasks[task_id]]
        if wf.doc["deactivated"] is not None:
            raise SimError(422, "the workflow has been deactivated")
        if body["cluster_location"] not in self.settings.clusters:
            raise SimError(400, f"unknown cluster location: {body['cluster_location']}")
        if not isinstance(body["n_workers"], int) or body["n_workers"] < 1:
            raise SimError(400, "n_workers must be a positive integer")
        priority = max((t.doc["priority"] for t in wf.taskforces), default=50) + 100
        tf = self._taskforce(wf, body["cluster_location"], body["n_workers"], priority, "user", now,
                             "Created when adding more workers for this task directive.")  # fmt: skip
        wf.taskforces.append(tf)
        return tf.doc

    def find(self, kind: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("query", {}), dict):
            raise SimError(400, "body must be {query: {...}, projection?: [...], after?: str}")
        docs: list[tuple[str, dict[str, Any]]]
        if kind == "workflows":
            docs = [(w.doc["workflow_id"], w.doc) for w in self.workflows.values()]
        elif kind == "taskforces":
            docs = [(t.doc["taskforce_uuid"], t.doc) for w in self.workflows.values() for t in w.taskforces]
        else:
            docs = [(w.directive["task_id"], w.directive) for w in self.workflows.values()]
        query, after = body.get("query", {}), body.get("after")
        self.queries.append((kind, query))
        hits = [(key, doc) for key, doc in docs if matches(doc, query)]
        if after:
            keys = [key for key, _ in hits]
            hits = hits[keys.index(after) + 1 :] if after in keys else []
        page = hits[: self.settings.page_size]
        projection = body.get("projection")
        out = [{k: doc[k] for k in projection if k in doc} if projection else doc for _, doc in page]
        next_after = page[-1][0] if len(hits) > len(page) else None
        return {kind.replace("-", "_"): out, "next_after": next_after}

    def pin_statuses(self, body: dict[str, Any]) -> int:
        by_uuid = {t.doc["taskforce_uuid"]: t for w in self.workflows.values() for t in w.taskforces}
        changed = 0
        for key, field_name in (
            ("compound_statuses_by_taskforce", "compound_statuses"),
            ("top_task_errors_by_taskforce", "top_task_errors"),
        ):
            for tf_uuid, value in (body.get(key) or {}).items():
                if tf_uuid not in by_uuid:
                    raise SimError(404, f"taskforce not found: {tf_uuid}")
                by_uuid[tf_uuid].doc[field_name] = value
                by_uuid[tf_uuid].pinned = True
                changed += 1
        return changed


def startup_url_of(init_args: str) -> str | None:
    """The URL the init command curls (`bash -c "curl ... -o ... '<url>'"`), if it has one."""
    match = INIT_URL.search(init_args or "")
    return match.group(1) if match else None


def validate_workflow_request(body: Any, clusters: set[str]) -> None:
    """The POST /v1/workflows shape the real WMS enforces (required keys, no extras, known clusters)."""

    def check(obj: Any, where: str, required: set[str], allowed: set[str]) -> None:
        if not isinstance(obj, dict):
            raise SimError(400, f"{where} must be an object")
        if missing := required - obj.keys():
            raise SimError(400, f"{where}: missing {sorted(missing)}")
        if extra := obj.keys() - allowed:
            raise SimError(400, f"{where}: additional properties not allowed: {sorted(extra)}")

    check(body, "body", {"tasks", "public_queue_aliases"}, WORKFLOW_KEYS)
    if not isinstance(body["tasks"], list) or not body["tasks"]:
        raise SimError(400, "tasks must be a non-empty list")
    for i, task in enumerate(body["tasks"]):
        check(task, f"tasks[{i}]", TASK_REQUIRED, TASK_KEYS)
        locations = task["cluster_locations"]
        if not isinstance(locations, list) or not locations or len(set(locations)) != len(locations):
            raise SimError(400, f"tasks[{i}].cluster_locations must be a non-empty list of unique names")
        if unknown := set(locations) - clusters:
            raise SimError(400, f"unknown cluster location(s): {sorted(unknown)}")
        check(task["worker_config"], f"tasks[{i}].worker_config", WORKER_CONFIG_KEYS, WORKER_CONFIG_KEYS)
        if "pilot_config" in task:
            pilot = task["pilot_config"]
            check(pilot, f"tasks[{i}].pilot_config", PILOT_CONFIG_KEYS, PILOT_CONFIG_KEYS)
            if bad := FORBIDDEN_PILOT_ENV & set(pilot["environment"]):
                raise SimError(400, f"pilot_config.environment may not set {sorted(bad)}")


def fake_jwt(claims: dict[str, Any], lifetime: float) -> str:
    """A syntactically valid, unsigned JWT (clients only read its `exp`)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({**claims, 'exp': int(time.time() + lifetime)})}.sig"


# --- HTTP ---

WMS_KEY = web.AppKey("wms", WMS)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "error": message}, status=status)


def _take(rules: list[Any], request: web.Request, now: float) -> Any:
    for rule in rules:
        if getattr(rule, "until", now + 1) <= now or rule.count == 0:
            continue
        if request.path.startswith(rule.path_prefix) and rule.method in (None, request.method):
            if rule.count is not None:
                rule.count -= 1
            return rule
    return None


def _client_known(settings: SimulatorSettings, client_id: str, secret: str) -> bool:
    """The client credentials grant's check, when the simulator is given its one client."""
    if settings.client_id is not None and not hmac.compare_digest(client_id, settings.client_id):
        return False
    return settings.client_secret is None or hmac.compare_digest(secret, settings.client_secret)


@web.middleware
async def simulate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request log, auth, injected faults and delays; only the EWMS routes are affected."""
    wms = request.app[WMS_KEY]
    ewms, hook = request.path.startswith("/v1/"), request.path.startswith("/_sim/")
    if ewms:
        wms.requests.append((request.method, request.path))
    if wms.settings.require_auth and (ewms or hook):
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in wms.tokens:
            return error(403, "missing or invalid bearer token")  # as EWMS answers it
    if not ewms:
        return await handler(request)
    now = time.time()
    if fault := _take(wms.faults, request, now):
        return error(fault.status, "injected fault")
    delay = _take(wms.delays, request, now)
    if delay and delay.when == "before":
        await asyncio.sleep(delay.seconds)
    try:
        wms.advance(time.time())
        response = await handler(request)
    except SimError as e:
        response = error(e.status, str(e))
    if request.method != "GET":
        wms.save()
    if delay and delay.when == "after":
        await asyncio.sleep(delay.seconds)
    return response


async def body_of(request: web.Request) -> Any:
    if not request.can_read_body:
        return {}
    try:
        return await request.json()
    except json.JSONDecodeError as e:
        raise SimError(400, f"invalid JSON: {e}") from e


def routes() -> web.RouteTableDef:
    r = web.RouteTableDef()

    @r.post("/v1/workflows")
    async def post_workflow(request: web.Request) -> web.Response:
        return web.json_response(request.app[WMS_KEY].create_workflow(await body_of(request), time.time()))

    @r.get("/v1/workflows/{wf}")
    async def get_workflow(request: web.Request) -> web.Response:
        return web.json_response(request.app[WMS_KEY].workflow(request.match_info["wf"]).doc)

    @r.post("/v1/workflows/{wf}/actions/{how:abort|finished}")
    async def deactivate(request: web.Request) -> web.Response:
        how = "ABORTED" if request.match_info["how"] == "abort" else "FINISHED"
        return web.json_response(request.app[WMS_KEY].deactivate(request.match_info["wf"], how, time.time()))

    @r.post("/v1/query/{kind:workflows|taskforces|task-directives}")
    async def query(request: web.Request) -> web.Response:
        return web.json_response(
            request.app[WMS_KEY].find(request.match_info["kind"], await body_of(request))
        )

    @r.post("/v1/task-directives/{task_id}/actions/add-workers")
    async def add_workers(request: web.Request) -> web.Response:
        wms = request.app[WMS_KEY]
        return web.json_response(
            wms.add_workers(request.match_info["task_id"], await body_of(request), time.time())
        )

    @r.get("/v1/mqs/workflows/{wf}/mq-profiles/public")
    async def mq_profiles(request: web.Request) -> web.Response:
        wf = request.app[WMS_KEY].workflow(request.match_info["wf"])
        return web.json_response({"mqprofiles": wf.mqprofiles})

    # --- OIDC stub ---
    @r.get("/.well-known/openid-configuration")
    async def discovery(request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        return web.json_response({"issuer": base, "token_endpoint": f"{base}/oidc/token"})

    @r.post("/oidc/token")
    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "client_credentials" or not form.get("client_id"):
            return error(400, "client_credentials grant with a client_id expected")
        settings = request.app[WMS_KEY].settings
        if not _client_known(settings, str(form["client_id"]), str(form.get("client_secret", ""))):
            return error(401, "unknown client or wrong secret")
        jwt = fake_jwt({"sub": str(form["client_id"]), "ewms_role": "user"}, 300)
        request.app[WMS_KEY].tokens.add(jwt)
        return web.json_response({"access_token": jwt, "token_type": "Bearer", "expires_in": 300})

    # --- test hooks ---
    @r.post("/_sim/faults")
    async def faults(request: web.Request) -> web.Response:
        b = await request.json()
        request.app[WMS_KEY].faults.append(
            Fault(status=int(b.get("status", 503)), until=time.time() + float(b.get("seconds", 3600)),
                  count=b.get("count"), path_prefix=b.get("path_prefix", "/v1/"), method=b.get("method"))
        )  # fmt: skip
        return web.json_response({"ok": True})

    @r.post("/_sim/delays")
    async def delays(request: web.Request) -> web.Response:
        b = await request.json()
        request.app[WMS_KEY].delays.append(
            Delay(seconds=float(b["seconds"]), when=b.get("when", "before"), count=b.get("count"),
                  path_prefix=b.get("path_prefix", "/v1/"), method=b.get("method"))
        )  # fmt: skip
        return web.json_response({"ok": True})

    @r.post("/_sim/clear")
    async def clear(request: web.Request) -> web.Response:
        wms = request.app[WMS_KEY]
        wms.faults.clear()
        wms.delays.clear()
        return web.json_response({"ok": True})

    @r.post("/_sim/reset")
    async def reset(request: web.Request) -> web.Response:
        request.app[WMS_KEY].reset()
        return web.json_response({"ok": True})

    @r.post("/_sim/statuses")
    async def statuses(request: web.Request) -> web.Response:
        try:
            changed = request.app[WMS_KEY].pin_statuses(await request.json())
            request.app[WMS_KEY].save()
            return web.json_response({"changed": changed})
        except SimError as e:
            return error(e.status, str(e))

    @r.patch("/_sim/config")
    async def config(request: web.Request) -> web.Response:
        wms = request.app[WMS_KEY]
        wms.settings = wms.settings.model_copy(update=await request.json())
        return web.json_response(wms.settings.model_dump(exclude={"client_secret"}))

    @r.get("/_sim/workflows")
    async def all_workflows(request: web.Request) -> web.Response:
        wms = request.app[WMS_KEY]
        wms.advance(time.time())
        return web.json_response(
            {"workflows": [
                {**w.doc, "request": w.request, "taskforces": [t.doc for t in w.taskforces],
                 "mqprofiles": w.mqprofiles}
                for w in wms.workflows.values()
            ]}
        )  # fmt: skip

    @r.get("/_sim/queries")
    async def queries(request: web.Request) -> web.Response:
        return web.json_response({"queries": request.app[WMS_KEY].queries})

    @r.get("/_sim/fetches")
    async def fetches(request: web.Request) -> web.Response:
        return web.json_response({"fetches": request.app[WMS_KEY].fetches})

    @r.get("/_sim/requests")
    async def requests(request: web.Request) -> web.Response:
        return web.json_response({"requests": request.app[WMS_KEY].requests})

    return r


def make_app(settings: SimulatorSettings | None = None) -> web.Application:
    app = web.Application(middlewares=[simulate])
    app[WMS_KEY] = WMS(settings or SimulatorSettings())
    app.add_routes(routes())

    async def workers(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(app[WMS_KEY].run_workers())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app.cleanup_ctx.append(workers)
    return app


async def serve(settings: SimulatorSettings) -> None:
    runner = web.AppRunner(make_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"skyscan WMS simulator listening on http://{settings.host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    defaults = SimulatorSettings()
    parser = argparse.ArgumentParser(description="Local EWMS simulator (defaults from SKYSCAN_WMS_SIM_*).")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--activation-delay", type=float, default=defaults.activation_delay)
    parser.add_argument("--step-delay", type=float, default=defaults.step_delay)
    parser.add_argument("--page-size", type=int, default=defaults.page_size)
    parser.add_argument("--require-auth", action="store_true", default=defaults.require_auth)
    parser.add_argument("--run-init-command", action="store_true", default=defaults.run_init_command)
    parser.add_argument("--state-file", type=Path, default=defaults.state_file)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = defaults.model_copy(update={k: v for k, v in vars(args).items()})
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
