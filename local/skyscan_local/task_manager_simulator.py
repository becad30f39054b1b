"""A simulated EWMS task manager (TMS): it drives taskforces through the WMS's `/v1/tms/*` routes,
as the real TMS does, and plays the HTCondor workers it would submit.

Each poll (every `step_delay`, at most a second apart) and for each schedd it serves, it asks `GET
/v1/tms/pending-starter/taskforces?schedd=` for the next taskforce to start and "submits" it (`POST
/v1/tms/condor-submit/taskforces/{uuid}` with a cluster id, the worker count, the submit dict and the
job event log path), and `GET /v1/tms/pending-stopper/taskforces?schedd=` for one to stop (`POST
…/condor-rm/…`). Its watcher reports the workers' states (`POST /v1/tms/statuses/taskforces`, only when
they changed): IDLE once submitted; RUNNING one `step_delay` later, after the workers' init command
fetched startup.json from the URL in the task directive's `init_args` when `run_init_command` is on (a
404 or an unreachable host is retried every `init_retry_seconds`; any other answer fails them at once:
`COMPLETED: FatalError` and `top_task_errors`). Once removed, the jobs end one `step_delay` later (an
aborted workflow's are REMOVED; a finished one's drained their queue and are COMPLETED Done) and it
reports `POST …/condor-complete/…`. On start it adopts the submitted taskforces of its schedds (a real
TMS reads them back from HTCondor), so a restarted simulator carries on.

The WMS simulator runs one in its own process (`task_manager`); `python -m
skyscan_local.task_manager_simulator --wms URL` runs one on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

INIT_URL = re.compile(r"'(https?://[^'\s]+)'")  # what the init command curls (see startup_url_of)
CLIENT_HEADER, CLIENT_NAME = (
    "X-Simulated-Client",
    "task-manager",
)  # so the WMS simulator tells its calls apart
PER_TICK = 50  # taskforces started (and stopped) per schedd per poll at most
RETRIED = (0, 404, 502, 503, 504)  # not uploaded yet, or the shim is unreachable: the workers retry
log = logging.getLogger("skyscan_local.task_manager_simulator")


class Timing(Protocol):
    step_delay: float
    run_init_command: bool
    init_retry_seconds: float


@dataclass
class Job:
    """One taskforce's HTCondor cluster as this task manager sees it."""

    uuid: str
    workflow_id: str
    n_workers: int
    submitted: float
    init_url: str | None
    init: str = "pending"  # "pending" | "done" | "failed"
    init_error: str = ""
    next_fetch: float = 0.0
    removed: float | None = None
    reported: dict[str, Any] = field(default_factory=dict)  # the last statuses sent


def startup_url_of(init_args: str) -> str | None:
    """The URL the init command curls (`bash -c "curl ... -o ... '<url>'"`), if it has one."""
    match = INIT_URL.search(init_args or "")
    return match.group(1) if match else None


def statuses_of(job: Job, now: float, step: float, finished: bool) -> dict[str, Any]:
    """The workers' compound statuses and top errors at `now` (pure)."""
    n = job.n_workers
    if job.removed is not None and now >= job.removed + step:
        return {"compound_statuses": {"COMPLETED": {"Done": n}} if finished else {"REMOVED": {"null": n}}}
    if job.init == "failed":
        return {"compound_statuses": {"COMPLETED": {"FatalError": n}}, "top_task_errors": {job.init_error: n}}
    started = now >= job.submitted + step
    if started and (job.init_url is None or job.init == "done"):
        return {"compound_statuses": {"RUNNING": {"Tasking": n}}}
    return {"compound_statuses": {"IDLE": {"null": n}}}


class TaskManager:
    def __init__(
        self,
        wms_url: Callable[[], str | None],
        schedds: Callable[[], list[str]],
        settings: Callable[[], Timing],
        client: tuple[str, str] | None = None,
        fetches: list[dict[str, Any]] | None = None,
    ) -> None:
        self.wms_url, self.schedds, self.settings, self.client = wms_url, schedds, settings, client
        self.fetches = fetches if fetches is not None else []
        self.jobs: dict[str, Job] = {}
        self.fetching: dict[str, asyncio.Task[None]] = {}
        self.token: str | None = None
        self.adopted = False

    # --- the WMS ---
    async def call(self, http: httpx.AsyncClient, method: str, path: str, **kw: Any) -> httpx.Response:
        if self.client and self.token is None:
            form = {
                "grant_type": "client_credentials",
                "client_id": self.client[0],
                "client_secret": self.client[1],
            }
            r = await http.post("/oidc/token", data=form)
            r.raise_for_status()
            self.token = r.json()["access_token"]
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        r = await http.request(method, path, headers=headers, **kw)
        if r.status_code == 403:
            self.token = None  # expired or the WMS forgot it: mint another next time
        return r

    async def run(self) -> None:
        while (url := self.wms_url()) is None:  # noqa: ASYNC110 (a value another task sets, polled)
            await asyncio.sleep(0.05)  # the embedded one learns its server's address from a request
        async with (
            httpx.AsyncClient(base_url=url, timeout=30, headers={CLIENT_HEADER: CLIENT_NAME}) as http,
            httpx.AsyncClient(timeout=30) as workers,
        ):
            while True:
                try:
                    await self.tick(http, workers)
                except (httpx.HTTPError, KeyError, ValueError) as e:
                    log.warning("task manager tick failed (will retry): %r", e)
                # At most a second apart whatever the step: a step changed through /_sim/config (a
                # test holding workers back for an hour, then letting them go) is seen at once.
                await asyncio.sleep(min(max(self.settings().step_delay, 0.05), 1.0))

    async def tick(self, http: httpx.AsyncClient, workers: httpx.AsyncClient) -> None:
        if not self.adopted:
            await self.adopt(http)
        for schedd in self.schedds():
            for _ in range(PER_TICK):  # one taskforce per call, as the routes answer; all due ones now
                if not await self.start_one(http, schedd):
                    break
            for _ in range(PER_TICK):
                if not await self.stop_one(http, schedd):
                    break
        self.start_fetches(workers)
        await self.watch(http)

    async def adopt(self, http: httpx.AsyncClient) -> None:
        """Taskforces submitted before this task manager started (HTCondor remembers them)."""
        query = {"schedd": {"$in": self.schedds()}, "cluster_id": {"$ne": None},
                 "phase": {"$in": ["condor-submit", "pending-stopper", "condor-rm"]}}  # fmt: skip
        r = await self.call(http, "POST", "/v1/query/taskforces", json={"query": query})
        r.raise_for_status()
        for tf in r.json()["taskforces"]:
            submitted = next(
                e["timestamp"] for e in tf["phase_change_log"] if e["target_phase"] == "condor-submit"
            )
            removed = time.time() if tf["phase"] != "condor-submit" else None
            self.jobs[tf["taskforce_uuid"]] = Job(
                tf["taskforce_uuid"],
                tf["workflow_id"],
                tf["n_workers"] or 0,
                submitted,
                None,
                "done",
                removed=removed,
            )
        self.adopted = True

    async def start_one(self, http: httpx.AsyncClient, schedd: str) -> bool:
        """Submit the next taskforce pending at `schedd`; False when there is none."""
        r = await self.call(http, "GET", "/v1/tms/pending-starter/taskforces", params={"schedd": schedd})
        r.raise_for_status()
        found = r.json()
        if not found:
            return False
        tf, directive = found["taskforce"], found["task_directive"]
        cluster_id = secrets.randbelow(10**7)
        n = tf["n_workers"] or 1
        body = {
            "cluster_id": cluster_id,
            "n_workers": n,
            "submit_dict": {"executable": "ewms-pilot", "request_cpus": tf["worker_config"]["n_cores"]},
            "job_event_log_fpath": f"/scratch/ewms/tms/{cluster_id}.log",
        }
        r = await self.call(
            http, "POST", f"/v1/tms/condor-submit/taskforces/{tf['taskforce_uuid']}", json=body
        )
        if r.status_code == 404:
            return True  # stopped meanwhile
        r.raise_for_status()
        init_url = startup_url_of(directive["init_args"]) if self.settings().run_init_command else None
        self.jobs[tf["taskforce_uuid"]] = Job(
            tf["taskforce_uuid"], tf["workflow_id"], n, time.time(), init_url
        )
        return True

    async def stop_one(self, http: httpx.AsyncClient, schedd: str) -> bool:
        """Remove the next taskforce to stop at `schedd`; False when there is none."""
        r = await self.call(http, "GET", "/v1/tms/pending-stopper/taskforces", params={"schedd": schedd})
        r.raise_for_status()
        tf = r.json()
        if not tf:
            return False
        r = await self.call(http, "POST", f"/v1/tms/condor-rm/taskforces/{tf['taskforce_uuid']}")
        r.raise_for_status()
        job = self.jobs.setdefault(
            tf["taskforce_uuid"],
            Job(tf["taskforce_uuid"], tf["workflow_id"], tf["n_workers"] or 0, time.time(), None, "done"),
        )
        job.removed = time.time()
        return True

    async def watch(self, http: httpx.AsyncClient) -> None:
        """Report changed statuses; end the jobs of removed taskforces (condor-complete)."""
        if not self.jobs:
            return
        now, step = time.time(), self.settings().step_delay
        ended = [j for j in self.jobs.values() if j.removed is not None and now >= j.removed + step]
        finished = await self.finished_workflows(http, {j.workflow_id for j in ended})
        changed = {j.uuid: statuses_of(j, now, step, j.workflow_id in finished) for j in self.jobs.values()}
        changed = {u: s for u, s in changed.items() if s != self.jobs[u].reported}
        if changed:
            body: dict[str, Any] = {
                "compound_statuses_by_taskforce": {u: s["compound_statuses"] for u, s in changed.items()}
            }
            if errors := {u: s["top_task_errors"] for u, s in changed.items() if "top_task_errors" in s}:
                body["top_task_errors_by_taskforce"] = errors
            r = await self.call(http, "POST", "/v1/tms/statuses/taskforces", json=body)
            r.raise_for_status()
            gone = {x["uuid"] for x in r.json()["results"] if x["status"] != "updated"}
            for u, s in changed.items():
                self.jobs[u].reported = s
            for u in gone:  # the WMS forgot it (a reset): so does HTCondor here
                self.jobs.pop(u, None)
        for job in ended:
            if job.uuid in self.jobs:
                path = f"/v1/tms/condor-complete/taskforces/{job.uuid}"
                r = await self.call(http, "POST", path, json={"condor_complete_ts": int(now)})
                if r.status_code not in (200, 404):
                    r.raise_for_status()
                self.jobs.pop(job.uuid, None)

    async def finished_workflows(self, http: httpx.AsyncClient, ids: set[str]) -> set[str]:
        if not ids:
            return set()
        r = await self.call(
            http, "POST", "/v1/query/workflows", json={"query": {"workflow_id": {"$in": sorted(ids)}}}
        )
        r.raise_for_status()
        return {w["workflow_id"] for w in r.json()["workflows"] if w["deactivated"] == "FINISHED"}

    # --- the workers' init command ---
    def start_fetches(self, workers: httpx.AsyncClient) -> None:
        now = time.time()
        for key in [k for k, task in self.fetching.items() if task.done()]:
            if error := self.fetching.pop(key).exception():
                log.error("init command of taskforce %s crashed: %r", key, error)
        for job in self.jobs.values():
            due = job.init_url is not None and job.init == "pending" and job.removed is None
            if due and now >= job.submitted + self.settings().step_delay and now >= job.next_fetch:
                if job.uuid not in self.fetching:
                    self.fetching[job.uuid] = asyncio.create_task(self.run_init(workers, job))

    async def run_init(self, workers: httpx.AsyncClient, job: Job) -> None:
        """Fetch startup.json through the presigned URL (one fetch stands for the taskforce's workers)."""
        assert job.init_url is not None
        try:
            r = await workers.get(job.init_url)
            status, size, text = r.status_code, len(r.content), r.text[:200]
        except httpx.HTTPError as e:
            status, size, text = 0, 0, repr(e)
        self.fetches.append(
            {"workflow_id": job.workflow_id, "taskforce_uuid": job.uuid, "status": status, "bytes": size,
             "timestamp": time.time()}
        )  # fmt: skip
        if status == 200:
            job.init = "done"
            log.info(
                "worker fetched startup.json for %s via presigned URL: 200 (%d bytes; %d workers start)",
                job.workflow_id, size, job.n_workers,
            )  # fmt: skip
        elif status in RETRIED:
            retry = self.settings().init_retry_seconds
            job.next_fetch = time.time() + retry
            why = "not uploaded yet" if status == 404 else text
            log.info(
                "worker could not fetch startup.json for %s via presigned URL yet: %s (%s); retrying in %gs",
                job.workflow_id, status or "unreachable", why, retry,
            )  # fmt: skip
        else:
            job.init, job.init_error = "failed", f"init command failed: curl: HTTP {status}: {text}"
            log.error(
                "worker FAILED to fetch startup.json for %s via presigned URL: %d %s",
                job.workflow_id,
                status,
                text,
            )


@dataclass
class StandaloneTiming:
    step_delay: float
    run_init_command: bool
    init_retry_seconds: float


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A simulated EWMS task manager for a WMS at --wms.")
    parser.add_argument("--wms", required=True, help="The WMS's address, e.g. http://127.0.0.1:8081.")
    parser.add_argument("--schedd", action="append", default=None, help="A schedd to serve (repeatable).")
    parser.add_argument("--step-delay", type=float, default=1.0)
    parser.add_argument("--run-init-command", action="store_true")
    parser.add_argument("--init-retry-seconds", type=float, default=1.0)
    parser.add_argument("--client-id", help="The task manager's client at the WMS's /oidc/token.")
    parser.add_argument("--client-secret", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    timing = StandaloneTiming(args.step_delay, args.run_init_command, args.init_retry_seconds)
    schedds = args.schedd or ["grid-submitter.icecube.wisc.edu"]
    client = (args.client_id, args.client_secret) if args.client_id else None
    manager = TaskManager(lambda: args.wms, lambda: schedds, lambda: timing, client)
    try:
        asyncio.run(manager.run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
