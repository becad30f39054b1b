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
import logging
from pathlib import Path

from aiohttp import web

# The `as` imports: what in-process tests reach through this module besides make_app and WMS_KEY
# (the settings it takes, the state behind the key, what they inject into it, the rules they check).
from skyscan_local.wms_controls import Delay as Delay
from skyscan_local.wms_controls import Fault as Fault
from skyscan_local.wms_controls import SimulatorSettings as SimulatorSettings
from skyscan_local.wms_routes import Simulator
from skyscan_local.wms_rules import SimError as SimError
from skyscan_local.wms_rules import fake_jwt as fake_jwt
from skyscan_local.wms_rules import matches as matches
from skyscan_local.wms_state import WMS as WMS

WMS_KEY = web.AppKey("wms", WMS)


def make_app(settings: SimulatorSettings | None = None) -> web.Application:
    simulator = Simulator(settings or SimulatorSettings())
    app = simulator.application()
    app[WMS_KEY] = simulator.wms
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
