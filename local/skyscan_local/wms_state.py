"""The simulated WMS's state and its rules over it: workflows, their task directives, taskforces and
mq-profiles, how they move on (the WMS's own daemons, lazily), what a user and the task manager may do
to them, and the file that keeps them across a restart (`state_file`). The test controls' state (faults,
delays, the request log, the tokens minted) lives here too, so that `/_sim/reset` clears it all."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from skyscan_local import ewms_schema as schema
from skyscan_local.wms_controls import Delay, Fault, SimulatorSettings
from skyscan_local.wms_rules import (
    ROLE_TMS,
    SimError,
    check_partial_request,
    check_request,
    fake_jwt,
    matches,
    new_id,
    phase_change,
    resolve_pilot_tag,
    validate_workflow_request,
)

DEFAULT_PRIORITY, MAX_PRIORITY = 50, 100  # the WMS's names; it stores max(p, MAX_PRIORITY)
TMS_ACTION_RETRIES = 2  # a taskforce whose submit (or rm) failed more often is not offered again


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
