"""The WMS client against the simulator over real HTTP (in-process, no cluster needed)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from skyscan import model
from skyscan_local import wms_simulator as simulator
from skyscan_operator import metrics, scanner_job
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.wms_client import WMSClient, WMSError, WMSUnavailable, jwt_expiry
from skyscan_operator.workforce import summarize
from tests.helpers import eventually
from tests.unit.test_crd import minimal_spec


class Sim:
    def __init__(self, app: web.Application, url: str) -> None:
        self.state, self.url = app[simulator.WMS_KEY], url

    def posts(self, path: str) -> int:
        return sum(1 for r in self.state.requests if r == ("POST", path))

    async def configure(self, **settings: Any) -> None:
        async with aiohttp.ClientSession() as http, http.patch(f"{self.url}/_sim/config", json=settings) as r:
            r.raise_for_status()


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    settings = simulator.SimulatorSettings(activation_delay=0.2, step_delay=0.1, page_size=2)
    app = simulator.make_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Sim(app, f"http://127.0.0.1:{runner.addresses[0][1]}")
    await runner.cleanup()


def request(marker: str = "uid-1", **spec: Any) -> dict[str, Any]:
    s = model.ScanSpec.model_validate(minimal_spec(**spec))
    return scanner_job.workflow_request("scan", marker, s, OperatorSettings())


def client(sim: Sim, **kw: Any) -> WMSClient:
    return WMSClient(sim.url, retries=2, backoff=0.01, **kw)


async def test_a_workflow_lives_through_the_simulated_lifecycle(sim: Sim) -> None:
    wms = client(sim)
    await sim.configure(activation_delay=3600)  # held until the first looks
    wf = (await wms.request_workflow(request(requestClusters=[{"location": "osg", "nWorkers": 3}])))[
        "workflow"
    ]
    wf_id = wf["workflow_id"]
    assert wf_id.startswith("WF-") and wf["deactivated"] is None
    assert scanner_job.ewms_connection(await wms.public_mq_profiles(wf_id)) is None
    (tf,) = await wms.query_taskforces([wf_id])
    assert tf["phase"] == "pre-mq-activation" and tf["compound_statuses"] == {}
    await sim.configure(activation_delay=0)
    # Time passes: the queues activate, the taskforce is submitted and its workers run.
    assert await eventually(lambda: _running(wms, wf_id), timeout=5) == 3
    assert scanner_job.ewms_connection(await wms.public_mq_profiles(wf_id)) is not None
    assert await wms.deactivate(wf_id, "finished") is True
    assert await wms.deactivate(wf_id, "abort") is False  # a second deactivation is a 404
    assert (await wms.get_workflow(wf_id))["deactivated"] == "FINISHED"
    stopped = await eventually(lambda: _phase(wms, wf_id, "condor-complete"), timeout=5)
    assert stopped is not None
    (tf,) = stopped
    assert tf["compound_statuses"] == {"COMPLETED": {"Done": 3}}
    with pytest.raises(WMSError) as err:
        await wms.add_workers(wf_id, "osg", 2)
    assert err.value.status == 422
    await wms.aclose()


async def _running(wms: WMSClient, wf_id: str) -> int:
    running: int = summarize(await wms.query_taskforces([wf_id])).n_running
    return running


async def _phase(wms: WMSClient, wf_id: str, phase: str) -> list[dict[str, Any]] | None:
    tfs = await wms.query_taskforces([wf_id])
    return tfs if all(tf["phase"] == phase for tf in tfs) else None


async def test_add_workers_and_marker_lookup(sim: Sim) -> None:
    wms = client(sim)
    wf_id = (await wms.request_workflow(request("uid-7")))["workflow"]["workflow_id"]
    assert await wms.find_workflows_by_marker("uid-7") == [wf_id]
    assert await wms.find_workflows_by_marker("uid-8") == []
    tf = await wms.add_workers(wf_id, "sub-2", 4)
    # sub-2 is the WMS's alias of osg, which a taskforce names by its schedd; priority: the workflow's
    # max(50, 100), plus 100 for added workers
    assert tf["n_workers"] == 4 and tf["priority"] == 200
    assert tf["schedd"] == "grid-submitter.icecube.wisc.edu" and "cluster_location" not in tf
    with pytest.raises(WMSError, match="condor cluster location not found") as err:
        await wms.add_workers(wf_id, "mars", 4)
    assert err.value.status == 400
    await wms.aclose()


async def test_batched_queries_page_through_everything(sim: Sim) -> None:
    wms = client(sim)
    ids = [(await wms.request_workflow(request(f"u{i}")))["workflow"]["workflow_id"] for i in range(5)]
    assert sorted(w["workflow_id"] for w in await wms.query_workflows(ids)) == sorted(ids)
    assert len(await wms.query_taskforces(ids[:3])) == 3
    queries = [r for r in sim.state.requests if r[1] == "/v1/query/workflows"]
    assert len(queries) == 3  # 5 workflows, 2 per page: one batched query, paged
    await wms.aclose()


async def test_idempotent_calls_are_retried_on_5xx_and_workflow_requests_are_not(sim: Sim) -> None:
    wms = client(sim)
    sim.state.faults.append(simulator.Fault(503, time.time() + 60, 2, "/v1/query/", None))
    assert await wms.query_workflows(["WF-x"]) == []
    assert sum(1 for r in sim.state.requests if r[1] == "/v1/query/workflows") == 3
    sim.state.faults.append(simulator.Fault(503, time.time() + 60, 1, "/v1/workflows", "POST"))
    with pytest.raises(WMSUnavailable) as err:
        await wms.request_workflow(request())
    assert err.value.status == 503 and sim.posts("/v1/workflows") == 1
    sim.state.faults.append(simulator.Fault(502, time.time() + 60, None, "/v1/", None))
    with pytest.raises(WMSUnavailable):
        await wms.get_workflow("WF-x")
    await wms.aclose()


@pytest.mark.parametrize("status", [408, 429])
async def test_408_and_429_mean_the_wms_cannot_now_not_a_refusal(sim: Sim, status: int) -> None:
    wms = client(sim)
    sim.state.faults.append(simulator.Fault(status, time.time() + 60, 1, "/v1/query/", None))
    assert await wms.query_workflows(["WF-x"]) == []  # retried
    sim.state.faults.append(simulator.Fault(status, time.time() + 60, 1, "/v1/workflows", "POST"))
    with pytest.raises(WMSUnavailable) as err:
        await wms.request_workflow(request())
    assert err.value.status == status
    sim.state.faults.append(simulator.Fault(404, time.time() + 60, 1, "/v1/", None))
    with pytest.raises(WMSError) as refused:
        await wms.get_workflow("WF-x")
    assert not isinstance(refused.value, WMSUnavailable)
    await wms.aclose()


async def test_connection_errors_are_wms_unavailable() -> None:
    wms = WMSClient("http://127.0.0.1:9", retries=1, backoff=0.01)
    with pytest.raises(WMSUnavailable, match="ConnectError"):
        await wms.query_workflows(["x"])
    await wms.aclose()


async def test_oidc_client_credentials(sim: Sim) -> None:
    sim.state.settings = sim.state.settings.model_copy(update={"require_auth": True})
    anonymous = client(sim)
    with pytest.raises(WMSError) as err:
        await anonymous.query_workflows(["x"])
    assert err.value.status == 403  # as EWMS refuses a missing or bad token
    authed = client(sim, oidc_issuer=sim.url, client_id="skyscan", client_secret="s3cret")
    assert await authed.query_workflows(["x"]) == []
    assert await authed.query_taskforces(["x"]) == []
    assert len(sim.state.tokens) == 1  # minted once, reused
    await anonymous.aclose()
    await authed.aclose()


# -- the retry rules, each over real HTTP ------------------------------------------------------------


async def test_a_5xx_is_tried_1_plus_retries_times_and_a_4xx_once(sim: Sim) -> None:
    wms = client(sim)  # retries=2
    sim.state.faults.append(simulator.Fault(503, time.time() + 60, None, "/v1/workflows/WF-x", "GET"))
    with pytest.raises(WMSUnavailable) as err:
        await wms.get_workflow("WF-x")
    assert err.value.status == 503
    assert sim.state.requests.count(("GET", "/v1/workflows/WF-x")) == 3
    for status in (400, 403, 409, 422):
        path = f"/v1/workflows/WF-{status}"
        sim.state.faults.append(simulator.Fault(status, time.time() + 60, None, path, "GET"))
        with pytest.raises(WMSError) as refused:
            await wms.get_workflow(f"WF-{status}")
        assert refused.value.status == status and not isinstance(refused.value, WMSUnavailable)
        assert sim.state.requests.count(("GET", path)) == 1  # a refusal is an answer
    await wms.aclose()


async def test_the_pauses_between_tries_double(sim: Sim) -> None:
    wms = WMSClient(sim.url, retries=2, backoff=0.2)
    sim.state.faults.append(simulator.Fault(502, time.time() + 60, None, "/v1/workflows/", "GET"))
    started = time.monotonic()
    with pytest.raises(WMSUnavailable):
        await wms.get_workflow("WF-x")
    # 0.2 s, then 0.4 s: equal pauses would be 0.4 s in all.
    assert 0.6 <= time.monotonic() - started < 3.0
    await wms.aclose()


async def test_a_timed_out_read_is_tried_again_and_a_timed_out_post_is_not(sim: Sim) -> None:
    """No answer in time: a read is repeated; a workflow request may have been acted on (it was:
    the simulator answers late), so it is not sent again."""
    wms = WMSClient(sim.url, retries=2, backoff=0.01, timeout=0.3)
    sim.state.delays.append(simulator.Delay(1.0, "after", 1, "/v1/query/", None))
    assert await wms.query_workflows(["WF-x"]) == []
    assert sim.state.requests.count(("POST", "/v1/query/workflows")) == 2
    sim.state.delays.append(simulator.Delay(1.0, "after", 1, "/v1/workflows", "POST"))
    with pytest.raises(WMSUnavailable, match="ReadTimeout"):
        await wms.request_workflow(request())
    assert sim.posts("/v1/workflows") == 1
    assert len(sim.state.workflows) == 1  # acted on once
    await wms.aclose()


async def test_a_refused_token_is_minted_again_and_even_a_post_is_sent_again(sim: Sim) -> None:
    sim.state.settings = sim.state.settings.model_copy(update={"require_auth": True})
    wms = client(sim, oidc_issuer=sim.url, client_id="skyscan", client_secret="s3cret")
    assert await wms.query_workflows(["x"]) == []
    sim.state.tokens.clear()  # the WMS forgets (revokes) the token the client holds
    created = await wms.request_workflow(request())
    assert sim.posts("/v1/workflows") == 2  # refused unread (403, as EWMS answers), then accepted
    assert list(sim.state.workflows) == [created["workflow"]["workflow_id"]]
    assert len(sim.state.tokens) == 1  # the fresh one
    await wms.aclose()


@pytest.mark.parametrize("status", [401, 403])
async def test_a_token_refused_either_way_is_minted_again(sim: Sim, status: int) -> None:
    """EWMS answers an expired or revoked token 403, the book 401: either way a fresh one is minted."""
    sim.state.settings = sim.state.settings.model_copy(update={"require_auth": True})
    wms = client(sim, oidc_issuer=sim.url, client_id="skyscan", client_secret="s3cret")
    assert await wms.query_workflows(["x"]) == []
    sim.state.faults.append(simulator.Fault(status, time.time() + 60, 1, "/v1/query/workflows", "POST"))
    assert await wms.query_workflows(["x"]) == []
    assert sim.state.requests.count(("POST", "/v1/query/workflows")) == 3  # the refused one tried again
    await wms.aclose()


def wms_attempts(operation: str, outcome: str) -> float:
    labels = {"operation": operation, "outcome": outcome}
    return metrics.REGISTRY.get_sample_value("skyscan_operator_wms_requests_total", labels) or 0.0


async def test_a_connection_that_never_opened_is_tried_again_even_for_a_post() -> None:
    wms = WMSClient("http://127.0.0.1:9", retries=2, backoff=0.01)  # nothing listens: nothing was sent
    before = wms_attempts("POST /v1/workflows", "unavailable")
    with pytest.raises(WMSUnavailable, match="ConnectError"):
        await wms.request_workflow(request())
    assert wms_attempts("POST /v1/workflows", "unavailable") - before == 3
    await wms.aclose()


def test_jwt_expiry_is_read_without_verification() -> None:
    token = simulator.fake_jwt({"sub": "x"}, 100)
    assert abs(jwt_expiry(token) - (time.time() + 100)) < 2
    assert jwt_expiry("not-a-jwt") > time.time()


def test_query_matching_subset() -> None:
    doc = {"workflow_id": "WF-1", "pilot_config": {"environment": {"K": "v"}}}
    assert simulator.matches(doc, {"workflow_id": {"$in": ["WF-1", "WF-2"]}})
    assert simulator.matches(doc, {"pilot_config.environment.K": "v"})
    assert not simulator.matches(doc, {"pilot_config.environment.K": "w"})
    with pytest.raises(simulator.SimError):
        simulator.matches(doc, {"workflow_id": {"$regex": "x"}})


async def test_a_simulator_with_a_state_file_remembers_its_workflows_across_a_restart(tmp_path: Any) -> None:
    settings = simulator.SimulatorSettings(activation_delay=0, state_file=tmp_path / "wms.json")
    first = simulator.WMS(settings)
    created = first.create_workflow(request(), time.time())
    first.save()  # as the HTTP layer does after every change
    wf_id = created["workflow"]["workflow_id"]
    again = simulator.WMS(settings)  # a new process on the same file
    assert again.workflow(wf_id).request == first.workflow(wf_id).request
    again.advance(time.time())
    assert again.workflow(wf_id).mqprofiles[0]["is_activated"]  # the lifecycle goes on from its clock
    assert again.deactivate(wf_id, "ABORTED", time.time())["n_taskforces"] == 1
    assert simulator.WMS(settings.model_copy(update={"state_file": None})).workflows == {}
