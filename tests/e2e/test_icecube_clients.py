"""IceCube's own clients, as they call the reference service, against a running stack (issue 29, item 5).

Written from reading skymap_scanner v4.2.1's `skymap_scanner/server/` and SkyDriver's
`resources/pyrequest` scripts (and its scanner Job's init container): the calls each makes, in their
order, with the bodies they send and the keys they read. The stack is the e2e suite's, on a namespace
of its own whose scanner Pods nobody plays (its scanner simulator watches elsewhere), so the test is
the scanner, with the scan's own per-scan credential. Each test then reads back, through the
interface's names, what the reference's dialect wrote, and the other way round.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from skyreader import SkyScanResult

from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan_local import scanner_report, skymap
from skyscan_local import stack as localstack
from skyscan_local.scanner_simulator import startup_json
from tests.conftest import ArchiveServer, Cluster
from tests.e2e.conftest import Rest, Stack, scan_request, stack_of_its_own
from tests.helpers import eventually

EVENT = {"value": {"data": {"run_id": 134_567, "event_id": 8_901, "mjd": 60_123.25}}}
NSIDES = {8: 0, 64: 12}


@pytest.fixture(scope="module")
def icecube(
    cluster: Cluster, archive_server: ArchiveServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str]]:
    """The e2e stack on a namespace of its own whose scanner Pods stay held and unplayed (its scanner
    simulator watches another); and the static token of a user answered in the reference's names."""

    def nobody_plays(namespace: str) -> dict[str, dict[str, str]]:
        return {"scanner-simulator": {"SKYSCAN_SCANNER_SIM_NAMESPACE": f"{namespace}-unplayed"}}

    workdir = tmp_path_factory.mktemp("icecube-stack")
    with stack_of_its_own(cluster, archive_server, workdir, "icecube", nobody_plays) as stack:
        yield stack, localstack.load_state(stack.settings.dir)["tokens"]["reference"]


class Client:
    """Calls as IceCube's clients make them (wipac-rest-tools' RestClient): a bearer token, GET
    arguments in the query (Python's `True`), any other method's in a JSON body (`{}` when none)."""

    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http, self.token = http, token

    async def call(self, method: str, path: str, args: dict[str, Any] | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if method == "GET":
            params = {k: str(v) for k, v in (args or {}).items()}
            return await self.http.request(method, path, params=params, headers=headers)
        return await self.http.request(method, path, content=json.dumps(args or {}), headers=headers)

    async def ok(self, method: str, path: str, args: dict[str, Any] | None = None) -> Any:
        r = await self.call(method, path, args)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()


@pytest.fixture
async def clients(icecube: tuple[Stack, str]) -> AsyncIterator[tuple[Rest, Client]]:
    """The interface's user (`Rest`) and a SkyDriver user (`Client`, the reference's names)."""
    stack, reference_token = icecube
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        yield Rest(stack, http), Client(http, reference_token)


async def scanner_credential(stack: Stack, scan_id: str) -> str:
    """The token the operator gave the scan's scanner (its Job's SKYSCAN_SKYDRIVER_AUTH)."""
    async with await kube.connect(stack.kubeconfig) as api:

        async def token() -> str:
            # The Secret is made first; the API server's token controller fills its token a moment later.
            path = core_path("secrets", stack.namespace, f"skyscan-{scan_id}-scanner")
            data = (await api.request("GET", path)).get("data") or {}
            return base64.b64decode(data["token"]).decode() if "token" in data else ""

        return await eventually(token, timeout=60)


def progress(summary: str, started: int, *, end: int | None = None) -> dict[str, Any]:
    """The PATCH body's `progress` as the scanner's reporter builds it."""
    stats: dict[str, Any] = {
        "start": {"scanner start": "2026-11-28 17:00:00"},
        "runtime": {"elapsed": "0:01:00"},
    }
    if end is not None:
        stats |= {"end": "2026-11-28 17:05:00", "finished": True}
    return {
        "summary": summary,
        "epilogue": "",
        "tallies": {"overall": {"recos": {"done": 0, "done est. percent": "0%", "generated": 0.0}}},
        "processing_stats": stats,
        "predictive_scanning_threshold": 1.0,
        "last_updated": "2026-11-28 17:05:00",
        "start": started,
        "end": end,
    }


async def test_the_real_scanners_sequence_with_its_own_credential(clients: tuple[Rest, Client]) -> None:
    rest, skydriver = clients
    scan_id = await rest.launch(nsides={str(n): v for n, v in NSIDES.items()}, event_live_json=EVENT)
    scanner = Client(rest.http, await scanner_credential(rest.stack, scan_id))
    scan = f"/scan/{scan_id}"

    # 1. The event, from the manifest, by the reference's name (the scanner's only read of it).
    manifest = await eventually(lambda: scanner.ok("GET", f"{scan}/manifest"), timeout=60)
    assert manifest["event_i3live_json_dict"] == EVENT
    assert "event_live_json_dict" not in manifest and "sensor_event_id" not in manifest
    assert manifest["i3_event_id"] and "ewms_workflow_id" in manifest
    # 2. The kill switch reads `is_deleted` and `ewms_deactivated` (a KeyError there ends its thread).
    status = await scanner.ok("GET", f"{scan}/status")
    assert status["is_deleted"] is False and status["ewms_deactivated"] is None
    assert "wms_deactivated" not in status and "n_running" in status["ewms_workforce"]
    # 3. Start-up progress, with the event metadata skyreader writes (its `version` key included).
    metadata = scanner_report.event_metadata(EVENT, real_event=True) | {"version": 1}
    started = int(time.time())
    body = {
        "progress": progress("The Skymap Scanner has started up.", started),
        "event_metadata": metadata,
        "scan_metadata": scanner_report.scan_metadata(scan_id, NSIDES, 7),
    }
    patched = await scanner.ok("PATCH", f"{scan}/manifest", body)
    assert patched["i3_event_id"] == manifest["i3_event_id"]
    # (The Pod's own sidecar uploads the workers' startup.json: Skyscan's part, not the scanner's.)
    await scanner.ok("PUT", f"{scan}/startup.json", startup_json(scan_id, metadata))
    # 4. Workers: the reference's path, polled until some run.
    workforce = await eventually(lambda: _running(scanner, f"{scan}/ewms/workforce"), timeout=90)
    assert workforce["workflow_id"] == manifest["ewms_workflow_id"] or manifest["ewms_workflow_id"] is None
    # 5. The first report's result is empty: answered {} and nothing stored; then a partial one.
    assert await scanner.ok("PUT", f"{scan}/result", {"skyscan_result": {}, "is_final": False}) == {}
    sky = skymap.ScanSky(skymap.true_event(metadata), scan_id, NSIDES)
    for nside in NSIDES:
        sky.finish(nside, sky.send(nside))
    partial = sky.result(metadata, final=False)
    stored = await scanner.ok("PUT", f"{scan}/result", {"skyscan_result": partial, "is_final": False})
    assert stored == {"scan_id": scan_id, "skyscan_result": partial, "is_final": False}
    # 6. The final result, then the final progress.
    final = sky.result(metadata, final=True)
    await scanner.ok("PUT", f"{scan}/result", {"skyscan_result": final, "is_final": True})
    done = progress("The Skymap Scanner has finished.", started, end=int(time.time()))
    await scanner.ok("PATCH", f"{scan}/manifest", {"progress": done, "scan_metadata": body["scan_metadata"]})

    # What the scanner wrote, read through the interface's names ...
    result = await rest.ok("GET", f"{scan}/result")
    assert result == {"scan_id": scan_id, "scan_result": final, "is_final": True}
    whole = await rest.ok("GET", scan)
    assert whole["result"]["scan_result"] == final and whole["manifest"]["sensor_event_id"]
    assert whole["manifest"]["progress"]["summary"] == "The Skymap Scanner has finished."
    assert whole["manifest"]["event_metadata"]["run_id"] == EVENT["value"]["data"]["run_id"]
    assert (await rest.status(scan_id))["scan_complete"] is True
    # ... is IceCube's own result (skyreader reads it) ...
    read = SkyScanResult.deserialize(result["scan_result"])
    assert read.has_minimal_metadata() and read.get_event_metadata().run_id == metadata["run_id"]
    # ... and SkyDriver's clients read it by the reference's names (prod_tester's monitor loop).
    assert (await skydriver.ok("GET", f"{scan}/result", {"include_deleted": True}))["skyscan_result"] == final
    assert (await skydriver.ok("GET", f"{scan}/status"))["scan_complete"] is True


async def _running(scanner: Client, path: str) -> dict[str, Any] | None:
    workforce: dict[str, Any] = await scanner.ok("GET", path)
    return workforce if workforce["n_running"] else None


async def test_skydrivers_scripts_calls_and_the_init_containers(clients: tuple[Rest, Client]) -> None:
    """resources/pyrequest (and prod_tester) as a user answered in the reference's names."""
    rest, skydriver = clients
    # prod_tester's launch: the event as a JSON string, and the deprecated aliases it still sends.
    launch = {k: v for k, v in scan_request().items() if k not in ("event_live_json", "request_clusters")}
    launch |= {
        "event_i3live_json": json.dumps(EVENT),
        "cluster": {"osg": 1},
        "scanner_server_memory": "1G",
        "classifiers": {"_TEST": True},
    }
    launched = await skydriver.ok("POST", "/scan", launch)
    scan_id, event_id = launched["scan_id"], launched["i3_event_id"]
    assert event_id and launched["event_i3live_json_dict"] == "use 'i3_event_id'"
    assert launched["ewms_task"] == "use 'ewms_workflow_id'" and "sensor_event_id" not in launched
    scan = f"/scan/{scan_id}"

    # remix_scan.py: the stored request, sent again with its event by id.
    request = await skydriver.ok("GET", f"/scan-request/{scan_id}")
    assert request["i3_event_id"] == event_id and "sensor_event_id" not in request
    remix = {k: v for k, v in request.items() if k not in ("scan_id", "rescan_ids")} | {
        "i3_event_id": event_id
    }
    remixed = await skydriver.ok("POST", "/scan", remix)
    assert remixed["i3_event_id"] == event_id and remixed["scan_id"] != scan_id

    # The init container's first call, and get_ewms_ids.py both ways, once the workflow exists.
    async def requested() -> dict[str, Any] | None:
        got: dict[str, Any] = await skydriver.ok("GET", f"{scan}/ewms/workflow-id")
        return got if got["requested_ewms_workflow"] else None

    workflow = await eventually(requested, timeout=60)
    assert workflow["eligible_for_ewms"] is True and workflow["ewms_address"]
    manifest = await skydriver.ok("GET", f"{scan}/manifest", {"include_deleted": True})
    assert manifest["ewms_workflow_id"] == workflow["workflow_id"] and manifest["ewms_address"]
    by_workflow = {"filter": {"ewms_workflow_id": workflow["workflow_id"]}, "include_deleted": True}
    found = await skydriver.ok("POST", "/scans/find", by_workflow)
    assert [m["scan_id"] for m in found["manifests"]] == [scan_id]
    assert found["manifests"][0]["ewms_workflow_id"] == workflow["workflow_id"]

    # get_scan.py and random_query.py.
    status = await skydriver.ok("GET", f"{scan}/status")
    assert {"ewms_deactivated", "ewms_workforce"} <= set(status) and "wms_workforce" not in status
    assert set(await skydriver.ok("GET", f"{scan}/logs")) == {"scanner_server"}
    ids = await skydriver.ok(
        "POST", "/scans/find", {"filter": {}, "include_deleted": True, "manifest_projection": ["scan_id"]}
    )
    assert {"scan_id": scan_id} in ids["manifests"]
    both = {"filter": {"scan_id": {"$in": [scan_id, remixed["scan_id"]]}}, "include_deleted": True}
    assert len((await skydriver.ok("POST", "/scans/find", both))["manifests"]) == 2
    assert "entries" in await skydriver.ok("GET", "/scans/backlog")
    whole = await skydriver.ok("GET", scan, {"include_deleted": True})
    assert whole["manifest"]["i3_event_id"] == event_id and whole["result"] == {}
    assert await skydriver.ok("GET", f"{scan}/i3-event") == {"i3_event": EVENT}
    assert await skydriver.ok("GET", f"{scan}/result", {"include_deleted": True}) == {}

    # add_workers.py, rescan.py, stop_scan.py.
    added = await skydriver.ok(
        "POST", f"{scan}/actions/add-workers", {"n_workers": 1, "cluster_location": "osg"}
    )
    assert added["taskforce_uuid"] and added["n_workers"] == 1
    rescanned = await skydriver.ok(
        "POST", f"{scan}/actions/rescan", {"abort_first": False, "replace_scan": False}
    )
    assert rescanned["i3_event_id"] == event_id
    stopped = await skydriver.ok("DELETE", scan)
    assert set(stopped) == {"manifest", "result"} and stopped["manifest"]["is_deleted"] is True
    assert stopped["manifest"]["i3_event_id"] == event_id

    # What the reference's dialect wrote, read through the interface's names.
    for other in (scan_id, remixed["scan_id"], rescanned["scan_id"]):
        mine = await rest.ok("GET", f"/scan/{other}/manifest", params={"include_deleted": "true"})
        assert mine["sensor_event_id"] == event_id and "i3_event_id" not in mine
    assert await rest.ok("GET", f"{scan}/sensor-event") == {"sensor_event": EVENT}
    interface_find = {"filter": {"wms_workflow_id": workflow["workflow_id"]}, "include_deleted": True}
    assert [
        m["scan_id"] for m in (await rest.ok("POST", "/scans/find", json=interface_find))["manifests"]
    ] == [scan_id]
    assert (await rest.ok("GET", f"/scan-request/{scan_id}"))["classifiers"] == {"_TEST": True}
