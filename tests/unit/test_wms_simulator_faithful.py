"""The WMS simulator against EWMS's own rules (WMS 079f9e1, MQS 7ccfa14), over real HTTP: it refuses
what the real WMS refuses, accepts what it accepts, answers as it answers, checks its own answers,
and leaves taskforces at pending-starter until a task manager acts."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from skyscan_local import ewms_schema
from skyscan_local import wms_simulator as simulator
from tests.helpers import eventually


async def _serve(settings: simulator.SimulatorSettings) -> tuple[web.AppRunner, web.Application, str]:
    app = simulator.make_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, app, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def sim() -> AsyncIterator[tuple[web.Application, httpx.AsyncClient]]:
    runner, app, url = await _serve(simulator.SimulatorSettings(activation_delay=0.05, step_delay=0.05))
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield app, http
    await runner.cleanup()


@pytest.fixture
async def no_tms() -> AsyncIterator[httpx.AsyncClient]:
    settings = simulator.SimulatorSettings(activation_delay=0.05, step_delay=0.05, task_manager=False)
    runner, _, url = await _serve(settings)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        yield http
    await runner.cleanup()


def workflow(**task: Any) -> dict[str, Any]:
    """A request as SkyDriver's init container (and Skyscan's operator) sends it."""
    body: dict[str, Any] = {
        "public_queue_aliases": ["to-client-queue", "from-client-queue"],
        "tasks": [
            {
                "cluster_locations": ["osg"],
                "input_queue_aliases": ["to-client-queue"],
                "output_queue_aliases": ["from-client-queue"],
                "task_image": "/cvmfs/icecube.opensciencegrid.org/containers/realtime/skymap_scanner:4.2.0",
                "task_args": "python -m skymap_scanner.client --infile {{INFILE}} --outfile {{OUTFILE}}",
                "init_image": "/cvmfs/icecube.opensciencegrid.org/containers/realtime/skymap_scanner:4.2.0",
                "init_args": "bash -c \"curl -o {{DATA_HUB}}/startup.json 'http://x/startup.json'\"",
                "n_workers": 4,
                "pilot_config": {
                    "tag": "latest",
                    "image_source": "auto",
                    "environment": {"EWMS_PILOT_TASK_TIMEOUT": 600, "EWMS_PILOT_CONTAINER_DEBUG": "True"},
                    "input_files": [],
                },
                "worker_config": {
                    "do_transfer_worker_stdouterr": True,
                    "max_worker_runtime": 86400,
                    "n_cores": 1,
                    "priority": 0,
                    "worker_disk": 1_000_000_000,
                    "worker_memory": "8GB",
                    "condor_requirements": "HAS_CVMFS_icecube_opensciencegrid_org",
                },
            }
        ],
    }
    body["tasks"][0].update(task)
    return body


def changed(path: list[Any], value: Any) -> dict[str, Any]:
    body = workflow()
    into = body
    for key in path[:-1]:
        into = into[key]
    into[path[-1]] = value
    return body


ENV = ["tasks", 0, "pilot_config", "environment", "EWMS_PILOT_TASK_TIMEOUT"]
REFUSED = {
    "n_workers as a string": (changed(["tasks", 0, "n_workers"], "4"), "n_workers"),
    "n_workers as a boolean": (changed(["tasks", 0, "n_workers"], True), "n_workers"),
    "priority as a string": ({**workflow(), "priority": "4"}, "priority"),
    "worker priority as a string": (changed(["tasks", 0, "worker_config", "priority"], "4"), "priority"),
    "pilot tag 1.2": (changed(["tasks", 0, "pilot_config", "tag"], "1.2"), "tag"),
    "pilot tag v1.2.0": (changed(["tasks", 0, "pilot_config", "tag"], "v1.2.0"), "tag"),
    "image_source docker": (changed(["tasks", 0, "pilot_config", "image_source"], "docker"), "image_source"),
    "float env value": (changed(ENV, 1.5), "EWMS_PILOT_TASK_TIMEOUT"),
    "boolean env value": (changed(ENV, True), "EWMS_PILOT_TASK_TIMEOUT"),
    "null env value": (changed(ENV, None), "EWMS_PILOT_TASK_TIMEOUT"),
    "duplicate input files": (
        changed(["tasks", 0, "pilot_config", "input_files"], ["/a", "/a"]),
        "input_files",
    ),
    "duplicate tasks": ({**workflow(), "tasks": workflow()["tasks"] * 2}, "tasks"),
    "duplicate cluster locations": (
        changed(["tasks", 0, "cluster_locations"], ["osg", "osg"]),
        "cluster_locations",
    ),
    "cluster local": (changed(["tasks", 0, "cluster_locations"], ["local"]), "local"),
    "an extra key": (changed(["tasks", 0, "cluster_location"], "osg"), "'cluster_location' was unexpected"),
    "a reserved pilot env": (
        changed(["tasks", 0, "pilot_config", "environment", "EWMS_PILOT_TASK_IMAGE"], "x"),
        "EWMS_PILOT_TASK_IMAGE",
    ),
    "a pilot tag not on CVMFS": (changed(["tasks", 0, "pilot_config", "tag"], "9.9.9"), "Pilot image tag"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_refuses_what_the_real_wms_refuses(
    sim: tuple[web.Application, httpx.AsyncClient], case: str
) -> None:
    app, http = sim
    body, named = REFUSED[case]
    r = await http.post("/v1/workflows", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == 400 and named in r.json()["error"]
    assert app[simulator.WMS_KEY].workflows == {}


@pytest.mark.parametrize("location", ["osg", "OSG", "sub-2"])
async def test_accepts_the_real_cluster_names_and_aliases(
    sim: tuple[web.Application, httpx.AsyncClient], location: str
) -> None:
    _, http = sim
    r = await http.post("/v1/workflows", json=workflow(cluster_locations=[location]))
    assert r.status_code == 200, r.text
    (tf,) = r.json()["taskforces"]
    assert tf["schedd"] == "grid-submitter.icecube.wisc.edu" and "cluster_location" not in tf
    assert r.json()["task_directives"][0]["cluster_locations"] == [location]  # kept as sent


async def test_the_ci_only_clusters_need_the_ci_setting() -> None:
    runner, _, url = await _serve(simulator.SimulatorSettings(ci_clusters=True, task_manager=False))
    async with httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/v1/workflows", json=workflow(cluster_locations=["test-alpha", "test-beta"]))
    await runner.cleanup()
    assert [tf["schedd"] for tf in r.json()["taskforces"]] == ["SCHEDD1", "SCHEDD2"]


async def test_an_integral_float_is_an_integer_as_in_json_schema(
    sim: tuple[web.Application, httpx.AsyncClient],
) -> None:
    _, http = sim
    r = await http.post("/v1/workflows", json=changed(ENV, 600.0))
    assert r.status_code == 200, r.text


async def test_without_n_workers_the_real_wms_fails(sim: tuple[web.Application, httpx.AsyncClient]) -> None:
    _, http = sim
    body = workflow()
    del body["tasks"][0]["n_workers"]
    assert (await http.post("/v1/workflows", json=body)).status_code == 500


async def test_priority_tag_and_image_source_as_the_real_wms_stores_them(
    sim: tuple[web.Application, httpx.AsyncClient],
) -> None:
    _, http = sim
    created = (await http.post("/v1/workflows", json={**workflow(), "priority": 7})).json()
    assert created["workflow"]["priority"] == 100  # max(7, 100)
    (tf,) = created["taskforces"]
    assert tf["priority"] == 100 and tf["pilot_config"]["tag"] == "1.2.0"  # "latest", resolved
    assert tf["pilot_config"]["image_source"] == "cvmfs"
    assert (await http.post("/v1/workflows", json={**workflow(), "priority": 250})).json()["workflow"][
        "priority"
    ] == 250
    older = (
        await http.post("/v1/workflows", json=changed(["tasks", 0, "pilot_config", "tag"], "1.1.2"))
    ).json()
    assert older["taskforces"][0]["pilot_config"]["tag"] == "1.1.2"


async def test_unknown_workflow_answers(sim: tuple[web.Application, httpx.AsyncClient]) -> None:
    _, http = sim
    r = await http.get("/v1/mqs/workflows/WF-nope/mq-profiles/public")
    assert r.status_code == 200 and r.json() == {"mqprofiles": []}
    assert (await http.get("/v1/workflows/WF-nope")).status_code == 404
    assert (await http.post("/v1/workflows/WF-nope/actions/abort")).status_code == 404


async def test_requests_to_other_routes_are_held_to_the_schema(
    sim: tuple[web.Application, httpx.AsyncClient],
) -> None:
    _, http = sim
    wf_id = (await http.post("/v1/workflows", json=workflow())).json()["workflow"]["workflow_id"]
    assert (await http.post("/v1/query/taskforces", json={"query": {}, "limit": 1})).status_code == 400
    assert (await http.post("/v1/query/workflows", json={"projection": ["workflow_id"]})).status_code == 400
    (td,) = (await http.post("/v1/query/task-directives", json={"query": {"workflow_id": wf_id}})).json()[
        "task_directives"
    ]
    add = f"/v1/task-directives/{td['task_id']}/actions/add-workers"
    assert (await http.post(add, json={"cluster_location": "osg", "n_workers": "2"})).status_code == 400
    assert (await http.post(add, json={"cluster_location": "osg"})).status_code == 400
    assert (await http.post(add, json={"cluster_location": "local", "n_workers": 2})).status_code == 400
    added = await http.post(add, json={"cluster_location": "OSG", "n_workers": 2})
    assert added.status_code == 200 and added.json()["priority"] == 200  # the taskforce's + 100


async def test_taskforces_wait_at_pending_starter_without_a_task_manager(no_tms: httpx.AsyncClient) -> None:
    http = no_tms
    wf_id = (await http.post("/v1/workflows", json=workflow())).json()["workflow"]["workflow_id"]

    async def phase() -> str | None:
        (tf,) = (await http.post("/v1/query/taskforces", json={"query": {"workflow_id": wf_id}})).json()[
            "taskforces"
        ]
        return str(tf["phase"]) if tf["phase"] == "pending-starter" else None

    assert await eventually(phase, timeout=5) == "pending-starter"
    schedd = {"schedd": "grid-submitter.icecube.wisc.edu"}
    assert (await http.get("/v1/tms/pending-starter/taskforces")).status_code == 400  # schedd is required
    assert (await http.get("/v1/tms/pending-starter/taskforces", params={"schedd": "elsewhere"})).json() == {}
    found = (await http.get("/v1/tms/pending-starter/taskforces", params=schedd)).json()
    uuid = found["taskforce"]["taskforce_uuid"]
    assert found["task_directive"]["workflow_id"] == wf_id and len(found["mqprofiles"]) == 2
    assert (await phase()) == "pending-starter"  # a look is not a start
    submit = f"/v1/tms/condor-submit/taskforces/{uuid}"
    assert (await http.post(submit, json={"cluster_id": "7", "n_workers": 4})).status_code == 400
    assert (
        await http.post(submit, json={"cluster_id": 7, "n_workers": 4})
    ).status_code == 400  # fields missing
    body = {"cluster_id": 7, "n_workers": 4, "submit_dict": {}, "job_event_log_fpath": "/x.log"}
    assert (await http.post(submit, json=body)).status_code == 200
    assert (await http.post(submit, json=body)).status_code == 404  # no longer pending-starter
    # Abort counts only the taskforces it moved to pending-stopper.
    r = await http.post(f"/v1/workflows/{wf_id}/actions/abort")
    assert r.json() == {"workflow_id": wf_id, "n_taskforces": 1}
    stop = (await http.get("/v1/tms/pending-stopper/taskforces", params=schedd)).json()
    assert stop["taskforce_uuid"] == uuid and stop["cluster_id"] == 7


async def test_n_taskforces_skips_the_ones_already_stopping(no_tms: httpx.AsyncClient) -> None:
    http = no_tms
    created = (await http.post("/v1/workflows", json=workflow())).json()
    wf_id, (tf,) = created["workflow"]["workflow_id"], created["taskforces"]
    await http.post(f"/v1/tms/condor-rm/taskforces/{tf['taskforce_uuid']}")  # any phase may be removed
    r = await http.post(f"/v1/workflows/{wf_id}/actions/finished")
    assert r.json()["n_taskforces"] == 0
    assert (await http.post(f"/v1/workflows/{wf_id}/actions/abort")).status_code == 404


async def test_the_task_manager_drives_taskforces_through_the_tms_routes(
    sim: tuple[web.Application, httpx.AsyncClient],
) -> None:
    app, http = sim
    wf_id = (await http.post("/v1/workflows", json=workflow())).json()["workflow"]["workflow_id"]

    async def taskforce(phase: str, statuses: dict[str, Any]) -> dict[str, Any] | None:
        (tf,) = (await http.post("/v1/query/taskforces", json={"query": {"workflow_id": wf_id}})).json()[
            "taskforces"
        ]
        return dict(tf) if tf["phase"] == phase and tf["compound_statuses"] == statuses else None

    running = await eventually(lambda: taskforce("condor-submit", {"RUNNING": {"Tasking": 4}}), timeout=5)
    assert running is not None and isinstance(running["cluster_id"], int)
    assert [e["source_entity"] for e in running["phase_change_log"]][-1] == "TMS"
    assert app[simulator.WMS_KEY].requests[-1][1] == "/v1/query/taskforces"  # its calls are not logged
    await http.post(f"/v1/workflows/{wf_id}/actions/abort")
    done = await eventually(lambda: taskforce("condor-complete", {"REMOVED": {"null": 4}}), timeout=5)
    assert done is not None


async def test_an_answer_the_schema_does_not_allow_is_a_loud_500(
    sim: tuple[web.Application, httpx.AsyncClient], caplog: pytest.LogCaptureFixture
) -> None:
    app, http = sim
    wf_id = (await http.post("/v1/workflows", json=workflow())).json()["workflow"]["workflow_id"]
    state = app[simulator.WMS_KEY]
    state.workflows[wf_id].taskforces[0].doc["cluster_location"] = "osg"  # what the old simulator said
    r = await http.post("/v1/query/taskforces", json={"query": {"workflow_id": wf_id}})
    assert r.status_code == 500 and "cluster_location" in r.json()["error"]
    state.workflows[wf_id].doc["priority"] = "100"
    r = await http.get(f"/v1/workflows/{wf_id}")
    assert r.status_code == 500 and "priority" in r.json()["error"]
    assert "breaks EWMS's schema" in caplog.text


def test_the_model_checks_whole_stored_objects() -> None:
    created = {"workflow_id": "WF-1", "timestamp": 1.0, "priority": 100, "deactivated": None}
    with pytest.raises(ewms_schema.SchemaError, match="deactivated_ts"):
        ewms_schema.check(ewms_schema.WorkflowObject, created)  # the WMS's store requires every field
    ewms_schema.check_partial(ewms_schema.WorkflowObject, {"workflow_id": "WF-1"})  # a projection
    with pytest.raises(ewms_schema.SchemaError):
        ewms_schema.check(
            ewms_schema.WorkflowObject, {**created, "deactivated_ts": None, "deactivated": "aborted"}
        )
    body = copy.deepcopy(workflow())
    assert ewms_schema.check(ewms_schema.WorkflowRequest, body) is body


async def test_tms_routes_take_the_tms_role_only() -> None:
    settings = simulator.SimulatorSettings(require_auth=True, task_manager=False, tms_client_secret="s3")
    runner, _, url = await _serve(settings)
    async with httpx.AsyncClient(base_url=url) as http:

        async def token(client_id: str, secret: str) -> dict[str, str]:
            form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
            minted = (await http.post("/oidc/token", data=form)).json()["access_token"]
            return {"Authorization": f"Bearer {minted}"}

        user, tms = await token("skyscan", ""), await token("ewms-tms-simulator", "s3")
        assert (await http.post("/v1/workflows", json=workflow())).status_code == 403  # no token
        wf = (await http.post("/v1/workflows", json=workflow(), headers=user)).json()
        uuid = wf["taskforces"][0]["taskforce_uuid"]
        body = {"compound_statuses_by_taskforce": {uuid: {"IDLE": {"null": 1}}}}
        assert (await http.post("/v1/tms/statuses/taskforces", json=body, headers=user)).status_code == 403
        assert (await http.post("/v1/tms/statuses/taskforces", json=body, headers=tms)).status_code == 200
        assert (await http.post("/v1/workflows", json=workflow(), headers=tms)).status_code == 403
        bad = await http.post(
            "/oidc/token", data={"grant_type": "client_credentials", "client_id": "ewms-tms-simulator"}
        )
        assert bad.status_code == 401
    await runner.cleanup()
