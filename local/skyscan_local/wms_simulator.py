"""A local EWMS simulator: the WMS and MQS routes on one host, in memory, held to EWMS's own schema.

`python -m skyscan_local.wms_simulator --port 8081` (or the `skyscan-wms-simulator` script). It plays
the WMS at commit 079f9e1 and the MQS at commit 7ccfa14 (`ewms_schema` models their OpenAPI
documents): every request is checked against the model and refused with a 400 naming the field, as
EWMS refuses it, and every answer is checked too (an answer the real schema does not allow is a loud
500 and an error in the log, never sent). Where the real services do something particular, so does
this one: a missing or bad token is a 403; an unknown workflow's public mq-profiles are an empty
list; a workflow's priority is stored as max(p, 100) (the WMS's own `max`); the pilot tag is resolved
against a simulated CVMFS directory (`pilot_tags`: "latest" is the newest X.Y.Z, "1" or "1.1" the
newest under it; an unknown tag is a 400) and `image_source` stored as "cvmfs"; a taskforce names
its cluster by `schedd` (there is no `cluster_location` field); an abort's or finish's `n_taskforces`
counts the taskforces it moved to pending-stopper; a second deactivation is a 404; a request without
`n_workers` is a 500 (the real WMS's KeyError).

Clusters are the real WMS's: `osg` (schedd `grid-submitter.icecube.wisc.edu`), reached also by its
aliases `sub-2` and `OSG`; `ci_clusters` adds the two the real WMS knows in its CI mode only,
`test-alpha` (`SCHEDD1`) and `test-beta` (`SCHEDD2`). There are no simulator-only cluster names:
any other name, `local` included, is refused with a 400.

Lifecycle, with short configurable delays, evaluated lazily on every request: message queues activate
`activation_delay` after the request and the taskforces go to pre-launch (the WMS's MQ activator),
then to pending-starter one `step_delay` later (its launch control). There they wait for a task
manager, as in EWMS: the simulated one (`task_manager_simulator`, run in this process unless
`task_manager` is off) drives them through the real `/v1/tms/*` routes (condor-submit, statuses,
condor-rm, condor-complete), and plays the workers, who run their init command first
(`run_init_command`). Abort and finished move taskforces to pending-stopper at once.

Test hooks live under `/_sim/` (faults, delays, pinned statuses, configuration, inspection, a reset);
an OIDC stub (`/.well-known/openid-configuration`, `/oidc/token`) exercises client-credentials auth:
the configured client gets the WMS's `user` role, the task manager's client `system-tms`. A status
pinned through `/_sim/statuses` is not overwritten by the task manager's reports.
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

from aiohttp import web
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from skyscan_local import ewms_schema as schema
from skyscan_local import task_manager_simulator as tms

FORBIDDEN_PILOT_ENV = (
    "EWMS_PILOT_TASK_IMAGE", "EWMS_PILOT_TASK_ARGS", "EWMS_PILOT_TASK_ENV_JSON",
    "EWMS_PILOT_INIT_IMAGE", "EWMS_PILOT_INIT_ARGS", "EWMS_PILOT_INIT_ENV_JSON",
)  # fmt: skip
REAL_CLUSTERS = {"osg": "grid-submitter.icecube.wisc.edu"}  # the WMS's config at 079f9e1
REAL_ALIASES = {"sub-2": "osg", "OSG": "osg"}
CI_CLUSTERS = {"test-alpha": "SCHEDD1", "test-beta": "SCHEDD2"}  # the real WMS's, with its CI flag only
DEFAULT_PRIORITY, MAX_PRIORITY = 50, 100  # the WMS's names; it stores max(p, MAX_PRIORITY)
TMS_ACTION_RETRIES = 2  # a taskforce whose submit (or rm) failed more often is not offered again
ROLE_USER, ROLE_TMS = "user", "system-tms"
log = logging.getLogger("skyscan_local.wms_simulator")


class SimulatorSettings(BaseSettings):
    """Defaults for the command line, from `SKYSCAN_WMS_SIM_*`."""

    model_config = SettingsConfigDict(env_prefix="SKYSCAN_WMS_SIM_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=8081, description="Listen port; 0 picks a free one (printed on start).")
    activation_delay: float = Field(default=2.0, ge=0, description="Seconds until message queues activate.")
    step_delay: float = Field(
        default=1.0, ge=0, description="Seconds between taskforce phases (and the task manager's polls)."
    )
    page_size: int = Field(default=1000, ge=1, description="Objects per query page (next_after beyond).")
    ci_clusters: bool = Field(
        default=False,
        description="Also know the real WMS's CI-only clusters test-alpha and test-beta (besides osg, "
        "and its aliases sub-2 and OSG).",
    )
    pilot_tags: list[str] = Field(
        default=["1.0.5", "1.1.1", "1.1.2", "1.2.0"],
        description="The ewms-pilot X.Y.Z tags on the simulated CVMFS, which pilot_config.tag resolves to.",
    )
    require_auth: bool = Field(
        default=False,
        description="Require a bearer token minted by /oidc/token on the EWMS routes and the test hooks "
        "(/_sim/*), as EWMS does (`make up NODE=real`: true).",
    )
    client_id: str | None = Field(default=None, description="The one client /oidc/token serves; unset: any.")
    client_secret: str | None = Field(
        default=None, description="That client's secret, checked by /oidc/token; unset: not checked."
    )
    tms_client_id: str = Field(
        default="ewms-tms-simulator",
        description="The task manager's client (role system-tms) at /oidc/token.",
    )
    tms_client_secret: str | None = Field(
        default=None,
        description="Its secret; unset: a new random one per process (the embedded one knows it).",
    )
    task_manager: bool = Field(
        default=True, description="Run the simulated task manager in this process (off: taskforces wait)."
    )
    run_init_command: bool = Field(
        default=False,
        description="Workers fetch startup.json from the init command's URL before working (404 or "
        "unreachable: retried; other errors fail them, `FatalError`).",
    )
    init_retry_seconds: float = Field(
        default=1.0, gt=0, description="A fetch answered 404 (or unreachable) is retried after this long."
    )
    state_file: Path | None = Field(
        default=None,
        description="Keep the workflows in this JSON file (written on every change, read on start), so a "
        "restarted simulator remembers them as the real WMS does; unset: in memory only.",
    )

    def schedds(self) -> dict[str, str]:
        """Cluster location -> schedd, aliases included."""
        known = {**REAL_CLUSTERS, **(CI_CLUSTERS if self.ci_clusters else {})}
        return {**known, **{alias: known[name] for alias, name in REAL_ALIASES.items()}}


class SimError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AnswerError(Exception):
    """The simulator was about to answer something EWMS's schema does not allow: its own bug."""


def new_id(prefix: str, base: str | None = None) -> str:
    """The WMS's ids: WF-<hex epoch>-<8 hex>; a task's and a taskforce's extend their parent's."""
    return f"{prefix}-{base or f'{int(time.time()):x}'}-{secrets.token_hex(4)}"


def dig(doc: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def matches(doc: dict[str, Any], query: dict[str, Any]) -> bool:
    """The MongoDB filter subset clients use: dotted-path equality, `$in`, `$nin`, `$eq`, `$ne`."""
    ops: dict[str, Callable[[Any, Any], bool]] = {
        "$in": lambda v, a: v in a, "$nin": lambda v, a: v not in a,
        "$eq": lambda v, a: v == a, "$ne": lambda v, a: v != a,
    }  # fmt: skip
    for key, cond in query.items():
        value = dig(doc, key)
        if isinstance(cond, dict) and cond and all(k.startswith("$") for k in cond):
            for op, arg in cond.items():
                if op not in ops:
                    raise SimError(400, f"unsupported query operator {op}")
                if not ops[op](value, arg):
                    return False
        elif value != cond:
            return False
    return True


def resolve_pilot_tag(tag: str, catalog: list[str]) -> str:
    """As the WMS resolves pilot_config.tag on CVMFS: an existing tag is itself, "latest" the newest
    X.Y.Z; anything else is a 400. (Its resolver also takes "X" and "X.Y", which the schema refuses.)"""
    if tag in catalog:
        return tag
    semver = [t for t in catalog if re.fullmatch(r"\d+\.\d+\.\d+", t)]
    if tag == "latest" and semver:
        return max(semver, key=lambda t: tuple(int(p) for p in t.split(".")))
    raise SimError(
        400,
        "Pilot image tag not found. It is possible that the image has not finished uploading to its "
        "registry. If this error persists, contact an EWMS admin.",
    )


def phase_change(phase: str, at: float, who: str, context: str = "", ok: bool = True) -> dict[str, Any]:
    return {"target_phase": phase, "timestamp": at, "was_successful": ok, "source_event_time": None,
            "source_entity": who, "context": context}  # fmt: skip


def validate_workflow_request(body: Any, clusters: set[str] | dict[str, str]) -> schema.WorkflowRequest:
    """POST /v1/workflows as the WMS checks it: the schema, the reserved pilot env, known clusters."""
    try:
        request = schema.WorkflowRequest.model_validate(schema.check(schema.WorkflowRequest, body))
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None
    for i, task in enumerate(request.tasks):
        env = task.pilot_config.environment if task.pilot_config else {}
        for name in FORBIDDEN_PILOT_ENV:
            if name in env:
                raise SimError(
                    400, f"tasks[{i}].pilot_config.environment cannot include the attribute '{name}'"
                )
        for location in task.cluster_locations:
            if location not in clusters:
                raise SimError(400, f"condor cluster location not found: {location}")
    return request


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
    pinned: bool = False  # statuses set through the hook are not overwritten by the task manager


@dataclass
class Workflow:
    doc: dict[str, Any]
    created: float
    directives: list[dict[str, Any]]
    mqprofiles: list[dict[str, Any]]
    taskforces: list[Taskforce] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)


class WMS:
    """The simulated service's state and rules; `advance` applies what the WMS's own daemons (the MQ
    activator, launch control) have made due by now. The task manager's part comes through `tms_*`."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.configured = settings
        self.fetches: list[dict[str, Any]] = []  # the task manager's workers' startup.json fetches
        self.address: str | None = None  # this server's own URL, learnt from its first request
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
        self.tokens: dict[str, str] = {}  # bearer token -> role
        self.fetches.clear()  # in place: the task manager appends to this very list

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

    # --- the WMS's own daemons ---
    def advance(self, now: float) -> None:
        for wf in self.workflows.values():
            activated_at = wf.created + self.settings.activation_delay
            if now < activated_at or (wf.doc["deactivated"] and not wf.mqprofiles[0]["is_activated"]):
                continue  # (a workflow stopped before its activation never activates)
            if not wf.mqprofiles[0]["is_activated"]:
                for mq in wf.mqprofiles:
                    mq.update(
                        is_activated=True,
                        auth_token=fake_jwt({"mqid": mq["mqid"]}, 86400),
                        broker_type="rabbitmq",
                        broker_address="skyscan-sim@localhost/",
                    )
            for tf in wf.taskforces:
                self._launch(tf.doc, now, activated_at)

    def _launch(self, doc: dict[str, Any], now: float, activated_at: float) -> None:
        if doc["phase"] == "pre-mq-activation":  # a taskforce added later joins its activated siblings
            late = doc["timestamp"] > activated_at
            why = "Auto-advanced because workflow has already been mq-activated." if late else ""
            at = max(activated_at, doc["timestamp"])
            doc["phase"] = "pre-launch"
            doc["phase_change_log"].append(phase_change("pre-launch", at, "Workflow MQ Activator", why))
        if doc["phase"] == "pre-launch":
            at = doc["phase_change_log"][-1]["timestamp"] + self.settings.step_delay
            if now >= at:
                doc["phase"] = "pending-starter"
                doc["phase_change_log"].append(
                    phase_change("pending-starter", at, "Taskforce Launch Control")
                )

    # --- user operations ---
    def create_workflow(self, body: Any, now: float) -> dict[str, Any]:
        schedds = self.settings.schedds()
        request = validate_workflow_request(body, schedds)
        wf_id = new_id("WF")
        priority = max(DEFAULT_PRIORITY if request.priority is None else request.priority, MAX_PRIORITY)
        aliases = sorted(
            {a for t in request.tasks for a in (*t.input_queue_aliases, *t.output_queue_aliases)}
        )
        mqs = [
            {"mqid": "a" + uuid.uuid4().hex[:20], "workflow_id": wf_id, "timestamp": now, "alias": alias,
             "is_public": alias in request.public_queue_aliases, "is_activated": False, "auth_token": None,
             "broker_type": None, "broker_address": None}
            for alias in aliases
        ]  # fmt: skip
        doc = {"workflow_id": wf_id, "timestamp": now, "priority": priority, "deactivated": None,
               "deactivated_ts": None}  # fmt: skip
        wf = Workflow(doc=doc, created=now, directives=[], mqprofiles=mqs, request=body)
        for task, raw in zip(request.tasks, body["tasks"], strict=True):
            pilot = raw.get("pilot_config", {})
            tag = resolve_pilot_tag(pilot.get("tag", "latest"), self.settings.pilot_tags)
            if "n_workers" not in raw:
                raise SimError(500, "KeyError: 'n_workers' (the real WMS fails so without it)")
            directive = self._directive(wf, task, now)
            wf.directives.append(directive)
            stored_pilot = {"tag": tag, "environment": pilot.get("environment", {}),
                            "input_files": pilot.get("input_files", []), "image_source": "cvmfs"}  # fmt: skip
            for location in task.cluster_locations:
                wf.taskforces.append(
                    self._taskforce(directive, schedds[location], stored_pilot, raw["worker_config"],
                                    raw["n_workers"], priority, "USER", now,
                                    "Created during initial workflow request.")
                )  # fmt: skip
        self.workflows[wf_id] = wf
        for directive in wf.directives:
            self.tasks[directive["task_id"]] = wf_id
        return {
            "workflow": doc,
            "task_directives": wf.directives,
            "taskforces": [t.doc for t in wf.taskforces],
        }

    @staticmethod
    def _directive(wf: Workflow, task: schema.TaskRequest, now: float) -> dict[str, Any]:
        by_alias = {mq["alias"]: mq["mqid"] for mq in wf.mqprofiles}
        wf_id = wf.doc["workflow_id"]
        return {
            "task_id": new_id("TK", wf_id.removeprefix("WF-")), "workflow_id": wf_id, "timestamp": now,
            "cluster_locations": task.cluster_locations, "task_image": task.task_image,
            "task_args": task.task_args, "task_env": task.task_env or {},
            "init_image": task.init_image or "", "init_args": task.init_args or "",
            "init_env": task.init_env or {},
            "input_queues": [by_alias[a] for a in task.input_queue_aliases],
            "output_queues": [by_alias[a] for a in task.output_queue_aliases],
        }  # fmt: skip

    @staticmethod
    def _taskforce(
        directive: dict[str, Any], schedd: str, pilot: dict[str, Any], worker: dict[str, Any],
        n_workers: int | None, priority: int, who: str, now: float, why: str,
    ) -> Taskforce:  # fmt: skip
        doc = {
            "taskforce_uuid": new_id("TF", directive["task_id"].removeprefix("TK-")),
            "task_id": directive["task_id"], "workflow_id": directive["workflow_id"], "timestamp": now,
            "priority": priority, "collector": None, "schedd": schedd, "n_workers": n_workers,
            "worker_config": worker, "pilot_config": pilot,
            "cluster_id": None, "submit_dict": {}, "job_event_log_fpath": "", "phase": "pre-mq-activation",
            "phase_change_log": [phase_change("pre-mq-activation", now, who, why)],
            "compound_statuses": {}, "top_task_errors": {},
        }  # fmt: skip
        return Taskforce(doc=schema.check(schema.TaskforceObject, doc), created=now)

    def workflow(self, wf_id: str) -> Workflow:
        if wf_id not in self.workflows:
            raise SimError(404, f"no workflow found with id: {wf_id}")
        return self.workflows[wf_id]

    def public_mq_profiles(self, wf_id: str) -> list[dict[str, Any]]:
        """As the MQS answers: the workflow's public profiles, an empty list for an unknown workflow."""
        wf = self.workflows.get(wf_id)
        return [mq for mq in wf.mqprofiles if mq["is_public"]] if wf else []

    def deactivate(self, wf_id: str, how: str, now: float) -> dict[str, Any]:
        """`n_taskforces` counts the taskforces moved to pending-stopper (those not already ending)."""
        wf = self.workflows.get(wf_id)
        if wf is None or wf.doc["deactivated"] is not None:
            raise SimError(404, f"no non-deactivated workflow found with workflow_id='{wf_id}'")
        wf.doc.update(deactivated=how, deactivated_ts=now)
        moved = 0
        for tf in wf.taskforces:
            doc = tf.doc
            if doc["phase"] in schema.ENDING_PHASES:
                why = f"User deactivated ({how}) workflow but taskforce is already ending/finished"
                doc["phase_change_log"].append(phase_change("pending-stopper", now, "User", why, ok=False))
            else:
                doc["phase"] = "pending-stopper"
                doc["phase_change_log"].append(
                    phase_change("pending-stopper", now, "User", f"User deactivated ({how}) workflow")
                )
                moved += 1
        return {"workflow_id": wf_id, "n_taskforces": moved}

    def add_workers(self, task_id: str, body: Any, now: float, role: str) -> dict[str, Any]:
        request = schema.AddWorkersRequest.model_validate(check_request(schema.AddWorkersRequest, body))
        if task_id not in self.tasks:  # the real WMS's find_one raises, unhandled
            raise SimError(500, f"DocumentNotFoundException: no taskforce with task_id {task_id}")
        wf = self.workflows[self.tasks[task_id]]
        existing = next(t.doc for t in wf.taskforces if t.doc["task_id"] == task_id)
        if wf.doc["deactivated"] is not None:
            raise SimError(422, f"cannot add a taskforce to a deactivated workflow ({wf.doc['workflow_id']})")
        schedd = self.settings.schedds().get(request.cluster_location)
        if schedd is None:
            raise SimError(400, f"condor cluster location not found: {request.cluster_location}")
        directive = next(d for d in wf.directives if d["task_id"] == task_id)
        tf = self._taskforce(directive, schedd, existing["pilot_config"], existing["worker_config"],
                             request.n_workers, existing["priority"] + MAX_PRIORITY,
                             "TMS" if role == ROLE_TMS else "USER", now,
                             "Created when adding more workers for this task directive.")  # fmt: skip
        wf.taskforces.append(tf)
        return tf.doc

    def find(self, kind: str, body: Any, log: bool = True) -> dict[str, Any]:
        request = schema.FindRequest.model_validate(check_request(schema.FindRequest, body))
        docs: list[tuple[str, dict[str, Any]]]
        if kind == "workflows":
            docs = [(w.doc["workflow_id"], w.doc) for w in self.workflows.values()]
        elif kind == "taskforces":
            docs = [(t.doc["taskforce_uuid"], t.doc) for w in self.workflows.values() for t in w.taskforces]
        else:
            docs = [(d["task_id"], d) for w in self.workflows.values() for d in w.directives]
        if log:
            self.queries.append((kind, request.query))
        hits = [(key, doc) for key, doc in docs if matches(doc, request.query)]
        if request.after:
            keys = [key for key, _ in hits]
            hits = hits[keys.index(request.after) + 1 :] if request.after in keys else []
        page = hits[: self.settings.page_size]
        projection = request.projection
        out = [{k: doc[k] for k in projection if k in doc} if projection else doc for _, doc in page]
        next_after = page[-1][0] if len(hits) > len(page) else None
        return {kind.replace("-", "_"): out, "next_after": next_after}

    # --- the task manager's routes (/v1/tms/*) ---
    def _by_uuid(self, tf_uuid: str) -> Taskforce | None:
        return next(
            (t for w in self.workflows.values() for t in w.taskforces if t.doc["taskforce_uuid"] == tf_uuid),
            None,
        )

    @staticmethod
    def _failures(doc: dict[str, Any], phase: str) -> int:
        return sum(
            1 for e in doc["phase_change_log"] if e["target_phase"] == phase and not e["was_successful"]
        )

    def tms_pending_starter(self, schedd: str) -> dict[str, Any]:
        """The next taskforce to start at `schedd` (highest priority, fewest failures, oldest), with
        its task directive and mq-profiles; `{}` if none. Its phase changes only on condor-submit."""
        waiting = [
            (w, t.doc) for w in self.workflows.values() for t in w.taskforces
            if t.doc["schedd"] == schedd and t.doc["phase"] == "pending-starter"
            and self._failures(t.doc, "condor-submit") <= TMS_ACTION_RETRIES
        ]  # fmt: skip
        if not waiting:
            return {}
        wf, doc = min(
            waiting,
            key=lambda p: (-p[1]["priority"], self._failures(p[1], "condor-submit"), p[1]["timestamp"]),
        )
        directive = next(d for d in wf.directives if d["task_id"] == doc["task_id"])
        queues = set(directive["input_queues"] + directive["output_queues"])
        return {"taskforce": doc, "task_directive": directive,
                "mqprofiles": [mq for mq in wf.mqprofiles if mq["mqid"] in queues]}  # fmt: skip

    def tms_pending_stopper(self, schedd: str) -> dict[str, Any]:
        """The oldest taskforce to stop at `schedd` that was submitted (has a cluster id); `{}` if none."""
        waiting = [
            t.doc for w in self.workflows.values() for t in w.taskforces
            if t.doc["schedd"] == schedd and t.doc["phase"] == "pending-stopper"
            and t.doc["cluster_id"] is not None and self._failures(t.doc, "condor-rm") <= TMS_ACTION_RETRIES
        ]  # fmt: skip
        return min(waiting, key=lambda d: d["timestamp"]) if waiting else {}

    def tms_phase(self, tf_uuid: str, phase: str, body: Any, failed: bool, now: float) -> dict[str, Any]:
        """condor-submit (only from pending-starter), condor-rm and condor-complete (from any phase),
        or a failed attempt at one (`failed`: the phase stays, the log says why)."""
        tf = self._by_uuid(tf_uuid)
        submit = phase == "condor-submit"
        if tf is None or (submit and tf.doc["phase"] != "pending-starter"):
            adjective = "'pending-starter' " if submit else ""
            raise SimError(404, f"no {adjective}taskforce found with uuid: {tf_uuid}")
        doc = tf.doc
        if failed:
            error = schema.TMSErrorRequest.model_validate(check_request(schema.TMSErrorRequest, body)).error
            if error is None:
                raise SimError(400, "Missing argument: error")
            doc["phase_change_log"].append(phase_change(phase, now, "TMS", f"ERROR: {error}", ok=False))
            return {"taskforce_uuid": tf_uuid}
        entry = phase_change(phase, now, "TMS")
        if submit:
            check_partial_request(schema.TaskforceObject, body)
            fields = ("cluster_id", "n_workers", "submit_dict", "job_event_log_fpath")
            if missing := [k for k in fields if k not in body]:
                raise SimError(400, f"Missing argument: {missing[0]}")
            doc.update({k: body[k] for k in fields})
        elif phase == "condor-complete":
            ts = schema.CondorCompleteRequest.model_validate(
                check_request(schema.CondorCompleteRequest, body)
            )
            entry["source_event_time"] = int(ts.condor_complete_ts)
        doc["phase"] = phase
        doc["phase_change_log"].append(entry)
        return {"taskforce_uuid": tf_uuid}

    def tms_statuses(self, body: Any) -> tuple[int, dict[str, Any]]:
        """Statuses reported by the task manager; 207 when some taskforce is unknown. A pinned
        taskforce's statuses are kept (a test hook's), the report still answered "updated"."""
        request = schema.StatusesRequest.model_validate(check_request(schema.StatusesRequest, body))
        errors, statuses = (
            request.top_task_errors_by_taskforce or {},
            request.compound_statuses_by_taskforce or {},
        )
        results, missing = [], []
        for tf_uuid in sorted(set(errors) | set(statuses)):
            tf = self._by_uuid(tf_uuid)
            if tf is None:
                missing.append({"uuid": tf_uuid, "status": "failed", "error": "no taskforce found with uuid"})
                continue
            if not tf.pinned:
                if tf_uuid in errors:
                    tf.doc["top_task_errors"] = body["top_task_errors_by_taskforce"][tf_uuid]
                if tf_uuid in statuses:
                    tf.doc["compound_statuses"] = body["compound_statuses_by_taskforce"][tf_uuid]
            results.append({"uuid": tf_uuid, "status": "updated"})
        return (207 if missing else 200), {"results": missing + results}

    def pin_statuses(self, body: dict[str, Any]) -> int:
        changed = 0
        for key, field_name in (
            ("compound_statuses_by_taskforce", "compound_statuses"),
            ("top_task_errors_by_taskforce", "top_task_errors"),
        ):
            for tf_uuid, value in (body.get(key) or {}).items():
                tf = self._by_uuid(tf_uuid)
                if tf is None:
                    raise SimError(404, f"taskforce not found: {tf_uuid}")
                tf.doc[field_name] = value
                tf.pinned = True
                changed += 1
        return changed


def check_request(model: type[BaseModel], body: Any) -> Any:
    """A request body the model allows, else a 400 naming the field (as EWMS's validation answers)."""
    try:
        return schema.check(model, body)
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None


def check_partial_request(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise SimError(400, "JSON-encoded requests body must be a 'dict'")
    try:
        return schema.check_partial(model, body)
    except schema.SchemaError as e:
        raise SimError(400, str(e)) from None


def startup_url_of(init_args: str) -> str | None:
    """The URL the init command curls (`bash -c "curl ... -o ... '<url>'"`), if it has one."""
    return tms.startup_url_of(init_args)


def fake_jwt(claims: dict[str, Any], lifetime: float) -> str:
    """A syntactically valid, unsigned JWT (clients only read its `exp`)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({**claims, 'exp': int(time.time() + lifetime)})}.sig"


# --- HTTP ---

WMS_KEY = web.AppKey("wms", WMS)
TMS_SECRET_KEY = web.AppKey("tms_secret", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROLE_KEY = web.RequestKey("ewms_role", str)
FROM_TMS_KEY = web.RequestKey("from_tms", bool)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "error": message}, status=status)


def reply(model: type[BaseModel], doc: Any, status: int = 200) -> web.Response:
    """An answer, once EWMS's schema allows it: an answer it does not allow is the simulator's bug."""
    try:
        schema.check(model, doc)
    except schema.SchemaError as e:
        raise AnswerError(f"{model.__name__}: {e}") from None
    return web.json_response(doc, status=status)


def roles_for(path: str, method: str) -> tuple[str, ...]:
    """The roles the real route admits (its auth decorator): the TMS's routes take system-tms, a few
    take either role, the rest a user."""
    if path.startswith("/v1/tms/") and method == "POST":
        return (ROLE_TMS,)
    either = ("/v1/query/workflows", "/v1/query/taskforces", "/v1/tms/", "/v1/taskforces/")
    if path.startswith(either) or path.endswith("/actions/add-workers"):
        return (ROLE_USER, ROLE_TMS)
    return (ROLE_USER,)


def _take(rules: list[Any], request: web.Request, now: float) -> Any:
    for rule in rules:
        if getattr(rule, "until", now + 1) <= now or rule.count == 0:
            continue
        if request.path.startswith(rule.path_prefix) and rule.method in (None, request.method):
            if rule.count is not None:
                rule.count -= 1
            return rule
    return None


def _client_role(settings: SimulatorSettings, tms_secret: str, client_id: str, secret: str) -> str | None:
    """The client credentials grant's check: the task manager's client, or the one configured client."""
    if client_id == settings.tms_client_id:
        return ROLE_TMS if hmac.compare_digest(secret, tms_secret) else None
    if settings.client_id is not None and not hmac.compare_digest(client_id, settings.client_id):
        return None
    if settings.client_secret is not None and not hmac.compare_digest(secret, settings.client_secret):
        return None
    return ROLE_USER


@web.middleware
async def simulate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request log, auth, injected faults and delays; only the EWMS routes are affected."""
    wms = request.app[WMS_KEY]
    wms.address = wms.address or own_address(request, wms.settings.host)  # for the task manager
    ewms, hook = request.path.startswith("/v1/"), request.path.startswith("/_sim/")
    # The task manager's calls are neither logged nor faulted: tests count and fault the operator's.
    request[FROM_TMS_KEY] = request.headers.get(tms.CLIENT_HEADER) == tms.CLIENT_NAME
    if ewms and not request[FROM_TMS_KEY]:
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
    if fault := None if request[FROM_TMS_KEY] else _take(wms.faults, request, now):
        return error(fault.status, "injected fault")
    delay = None if request[FROM_TMS_KEY] else _take(wms.delays, request, now)
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
            "BUG: the simulator's answer to %s %s breaks EWMS's schema: %s", request.method, request.path, e
        )
        response = error(500, f"simulator answer violates the EWMS schema: {e}")
    if request.method != "GET":
        wms.save()
    if delay and delay.when == "after":
        await asyncio.sleep(delay.seconds)
    return response


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


def ewms_routes(r: web.RouteTableDef) -> None:
    """The WMS's and MQS's routes, each answer checked against its model."""

    @r.post("/v1/workflows")
    async def post_workflow(request: web.Request) -> web.Response:
        created = request.app[WMS_KEY].create_workflow(await body_of(request), time.time())
        return reply(schema.WorkflowCreated, created)

    @r.get("/v1/workflows/{wf}")
    async def get_workflow(request: web.Request) -> web.Response:
        return reply(schema.WorkflowObject, request.app[WMS_KEY].workflow(request.match_info["wf"]).doc)

    @r.post("/v1/workflows/{wf}/actions/{how:abort|finished}")
    async def deactivate(request: web.Request) -> web.Response:
        how = "ABORTED" if request.match_info["how"] == "abort" else "FINISHED"
        out = request.app[WMS_KEY].deactivate(request.match_info["wf"], how, time.time())
        return reply(schema.Deactivated, out)

    @r.post("/v1/query/{kind:workflows|taskforces|task-directives}")
    async def query(request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        found = request.app[WMS_KEY].find(kind, await body_of(request), log=not request[FROM_TMS_KEY])
        try:
            return web.json_response(schema.check_query_answer(kind, found))
        except schema.SchemaError as e:
            raise AnswerError(f"query {kind}: {e}") from None

    @r.post("/v1/task-directives/{task_id}/actions/add-workers")
    async def add_workers(request: web.Request) -> web.Response:
        wms = request.app[WMS_KEY]
        body = await body_of(request)
        tf = wms.add_workers(request.match_info["task_id"], body, time.time(), request[ROLE_KEY])
        return reply(schema.TaskforceObject, tf)

    @r.get("/v1/mqs/workflows/{wf}/mq-profiles/public")
    async def mq_profiles(request: web.Request) -> web.Response:
        profiles = request.app[WMS_KEY].public_mq_profiles(request.match_info["wf"])
        return reply(schema.PublicMQProfiles, {"mqprofiles": profiles})

    @r.get("/v1/tms/pending-starter/taskforces")
    async def pending_starter(request: web.Request) -> web.Response:
        found = request.app[WMS_KEY].tms_pending_starter(schedd_of(request))
        return reply(schema.PendingStarter if found else schema.Empty, found)

    @r.get("/v1/tms/pending-stopper/taskforces")
    async def pending_stopper(request: web.Request) -> web.Response:
        found = request.app[WMS_KEY].tms_pending_stopper(schedd_of(request))
        return reply(schema.TaskforceObject if found else schema.Empty, found)

    @r.post("/v1/tms/{phase:condor-submit|condor-rm|condor-complete}/taskforces/{uuid}")
    async def tms_phase(request: web.Request) -> web.Response:
        wms, info = request.app[WMS_KEY], request.match_info
        out = wms.tms_phase(info["uuid"], info["phase"], await body_of(request), False, time.time())
        return reply(schema.TaskforceUUID, out)

    @r.post("/v1/tms/{phase:condor-submit|condor-rm}/taskforces/{uuid}/failed")
    async def tms_failed(request: web.Request) -> web.Response:
        wms, info = request.app[WMS_KEY], request.match_info
        out = wms.tms_phase(info["uuid"], info["phase"], await body_of(request), True, time.time())
        return reply(schema.TaskforceUUID, out)

    @r.post("/v1/tms/statuses/taskforces")
    async def tms_statuses(request: web.Request) -> web.Response:
        status, out = request.app[WMS_KEY].tms_statuses(await body_of(request))
        return reply(schema.StatusesAnswer, out, status)


def oidc_routes(r: web.RouteTableDef) -> None:
    @r.get("/.well-known/openid-configuration")
    async def discovery(request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        return web.json_response({"issuer": base, "token_endpoint": f"{base}/oidc/token"})

    @r.post("/oidc/token")
    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "client_credentials" or not form.get("client_id"):
            return error(400, "client_credentials grant with a client_id expected")
        wms, client_id = request.app[WMS_KEY], str(form["client_id"])
        role = _client_role(
            wms.settings, request.app[TMS_SECRET_KEY], client_id, str(form.get("client_secret", ""))
        )
        if role is None:
            return error(401, "unknown client or wrong secret")
        jwt = fake_jwt({"sub": client_id, "ewms_role": role}, 300)
        wms.tokens[jwt] = role
        return web.json_response({"access_token": jwt, "token_type": "Bearer", "expires_in": 300})


def hook_routes(r: web.RouteTableDef) -> None:
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
        wms = request.app[WMS_KEY]
        tokens = dict(wms.tokens)
        wms.reset()
        wms.tokens.update(tokens)  # the task manager's (and the test's) token stays good
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
        return web.json_response(
            wms.settings.model_dump(mode="json", exclude={"client_secret", "tms_client_secret"})
        )

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


def routes() -> web.RouteTableDef:
    r = web.RouteTableDef()
    ewms_routes(r)
    oidc_routes(r)
    hook_routes(r)
    return r


def make_app(settings: SimulatorSettings | None = None) -> web.Application:
    app = web.Application(middlewares=[simulate])
    wms = WMS(settings or SimulatorSettings())
    app[WMS_KEY] = wms
    app[TMS_SECRET_KEY] = wms.settings.tms_client_secret or secrets.token_urlsafe(24)
    app.add_routes(routes())

    async def task_manager(app: web.Application) -> AsyncIterator[None]:
        """The simulated task manager, a client of this server's /v1/tms/* routes like the real one."""
        if not wms.settings.task_manager:
            yield
            return
        task = asyncio.create_task(_run_task_manager(app))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app.cleanup_ctx.append(task_manager)
    return app


async def _run_task_manager(app: web.Application) -> None:
    wms = app[WMS_KEY]
    manager = tms.TaskManager(
        lambda: wms.address,
        schedds=lambda: sorted(set(wms.settings.schedds().values())),
        settings=lambda: wms.settings,
        client=(wms.settings.tms_client_id, app[TMS_SECRET_KEY]) if wms.settings.require_auth else None,
        fetches=wms.fetches,
    )
    await manager.run()


def own_address(request: web.Request, host: str) -> str:
    """Where this process reaches itself: the port a request came in on, at loopback when listening
    on every address (a Pod's own Service may not route back to it)."""
    port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
    local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{local}]' if ':' in local else local}:{port}"


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
    parser.add_argument("--ci-clusters", action="store_true", default=defaults.ci_clusters)
    parser.add_argument(
        "--task-manager", action=argparse.BooleanOptionalAction, default=defaults.task_manager,
        help="Run the simulated task manager in this process.",
    )  # fmt: skip
    parser.add_argument("--state-file", type=Path, default=defaults.state_file)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = defaults.model_copy(update=dict(vars(args)))
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
