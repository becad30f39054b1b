"""Two shim replicas over one namespace, as two Pods behind one Service: two `skyscan-shim serve`
processes against the real API server. Concurrent writes to one scan through both lose nothing, a
scan created through one is read at once through the other, and a client that sends back the version
its write answered with (`Skyscan-Min-Version`) reads that write through either, even through a
replica whose watch has stopped (README, "More than one shim")."""

from __future__ import annotations

import asyncio
import copy
import secrets
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api_shim.auth import make_token
from api_shim.repository.freshness import READS_BURST, READS_PER_SECOND, WAIT_SECONDS
from api_shim.repository.versions import MIN_VERSION_HEADER, WRITTEN_HEADER
from skyscan import model
from skyscan.io import kube
from skyscan.io.kube_errors import KubeError
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, scan_body, start_shim_process
from tests.integration.shim.test_shim_writes import EVENT_METADATA, PROGRESS

pytestmark = pytest.mark.timeout(180)
COMPLETED = "Attempted to delete a completed scan (must use `delete_completed_scan=True`)"


@dataclass
class Replica:
    """One shim process and a client of it (as the user; `as_system` for the scanner's routes)."""

    name: str
    http: httpx.AsyncClient
    system: dict[str, str]

    async def call(self, method: str, path: str, *, as_system: bool = False, **kwargs: Any) -> httpx.Response:
        headers = {**(self.system if as_system else {}), **kwargs.pop("headers", {})}
        return await self.http.request(method, path, headers=headers, **kwargs)


async def _serving(http: httpx.AsyncClient, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "the shim exited"
    try:
        return (await http.get("/healthz")).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
async def replicas(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> AsyncIterator[tuple[Replica, Replica]]:
    token_file = tmp_path / "tokens.json"
    user = make_token(token_file, "alice", ["user"])
    system = make_token(token_file, "scanner", ["system"])
    processes: list[subprocess.Popen[bytes]] = []
    started: list[Replica] = []
    try:
        for name in ("a", "b"):
            log = tmp_path / f"shim-{name}.log"
            process, url = start_shim_process(
                cluster, namespace, token_file, log, SKYSCAN_ADD_WORKERS_TIMEOUT="20"
            )
            processes.append(process)  # a child process for the whole test; nothing awaits it
            http = httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": f"Bearer {user}"})
            started.append(Replica(name, http, {"Authorization": f"Bearer {system}"}))
        for replica, process in zip(started, processes, strict=True):
            await eventually(lambda: _serving(replica.http, process), timeout=60)  # noqa: B023
        yield started[0], started[1]
    finally:
        for replica in started:
            await replica.http.aclose()
        for process in processes:
            process.terminate()
            process.wait(10)
        for name in ("a", "b"):
            print(f"--- shim {name} ---\n{(tmp_path / f'shim-{name}.log').read_text()[-3000:]}")


def report(i: int) -> dict[str, Any]:
    progress = copy.deepcopy(PROGRESS)
    progress["summary"] = f"report {i}"
    return progress


def ok(reply: httpx.Response) -> Any:
    assert reply.status_code == 200, (reply.status_code, reply.text)
    return reply.json()


def version(reply: httpx.Response) -> int:
    return int(reply.headers[WRITTEN_HEADER])


async def test_a_scan_created_through_one_replica_is_read_at_once_through_the_other(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    for writer, reader in ((a, b), (b, a)) * 5:
        created = await writer.call("POST", "/scan", json=scan_body())
        scan_id = ok(created)["scan_id"]
        assert version(created) > 0
        # No header, no affinity: a well-formed, recent id the reader does not hold yet is read once
        # from the API server.
        assert ok(await reader.call("GET", f"/scan/{scan_id}/manifest"))["scan_id"] == scan_id
        assert ok(await reader.call("GET", f"/scan/{scan_id}/status"))["scan_state"]
        assert ok(await reader.call("GET", f"/scan-request/{scan_id}"))["scan_id"] == scan_id

    # A client's writes through one replica, read through the other with the version they answered.
    scan_id = ok(await a.call("POST", "/scan", json=scan_body()))["scan_id"]
    patched = await b.call("PATCH", f"/scan/{scan_id}/manifest", as_system=True, json={"progress": report(1)})
    assert ok(patched)["progress"]["summary"] == "report 1"
    fresh = {MIN_VERSION_HEADER: str(version(patched))}
    assert (
        ok(await a.call("GET", f"/scan/{scan_id}/manifest", headers=fresh))["progress"]["summary"]
        == "report 1"
    )
    deleted = await a.call("DELETE", f"/scan/{scan_id}")
    assert ok(deleted)["manifest"]["is_deleted"] is True
    fresh = {MIN_VERSION_HEADER: str(version(deleted))}
    assert (await b.call("GET", f"/scan/{scan_id}/manifest", headers=fresh)).status_code == 404
    assert ok(await b.call("GET", f"/scan/{scan_id}", params={"include_deleted": "true"}, headers=fresh))[
        "manifest"
    ]["is_deleted"]
    find = {"filter": {"scan_id": scan_id}, "include_deleted": True}
    found = ok(await b.call("POST", "/scans/find", json=find, headers=fresh))
    assert [m["is_deleted"] for m in found["manifests"]] == [True]
    # And through the replica that took the write, without any header.
    scan_id = ok(await b.call("POST", "/scan", json=scan_body()))["scan_id"]
    ok(await b.call("PATCH", f"/scan/{scan_id}/manifest", as_system=True, json={"progress": report(3)}))
    assert ok(await b.call("GET", f"/scan/{scan_id}/manifest"))["progress"]["summary"] == "report 3"
    assert (await b.call("GET", "/scans/backlog")).status_code == 200
    assert (
        await a.call("GET", f"/scan/{scan_id}/manifest", headers={MIN_VERSION_HEADER: "x"})
    ).status_code == 400


async def test_a_replica_whose_watch_stopped_still_reads_a_clients_writes(
    replicas: tuple[Replica, Replica], make_shim: MakeShim
) -> None:
    """The watch delay made as long as it gets: a replica (in this process) whose cache no longer
    follows the cluster. A recent scan id it does not hold is read from the API server; a read asking
    for a version waits `WAIT_SECONDS` for the watch, then reads its scan from the API server."""
    a, _ = replicas
    stale = await make_shim()
    await stale.state.scans._cache.stop()
    scan_id = ok(await a.call("POST", "/scan", json=scan_body()))["scan_id"]
    manifest = f"/scan/{scan_id}/manifest"
    assert (await stale.call("GET", manifest)).body["scan_id"] == scan_id
    deleted = await a.call("DELETE", f"/scan/{scan_id}")
    # Without the header it answers from its cache: the lag a client bypassing affinity may see.
    assert (await stale.call("GET", manifest)).body["is_deleted"] is False
    started = time.monotonic()
    fresh = {MIN_VERSION_HEADER: str(version(deleted))}
    reply = await stale.call("GET", manifest, params={"include_deleted": "true"}, headers=fresh)
    waited = time.monotonic() - started
    assert (reply.status, reply.body["is_deleted"]) == (200, True)
    assert WAIT_SECONDS <= waited < WAIT_SECONDS + 5
    # The API server's answer is in its cache now: no header needed any more.
    assert (await stale.call("GET", manifest)).status == 404
    # A listing cannot be read scan by scan: answered after the wait, as the cache stands.
    started = time.monotonic()
    reply = await stale.call("POST", "/scans/find", json_body={"filter": {}}, headers=fresh)
    assert reply.status == 200 and time.monotonic() - started >= WAIT_SECONDS

    # A check-then-write is guarded by resourceVersion: however stale its cache, this replica does not
    # delete over a final result stored through the other.
    scan_id = ok(await a.call("POST", "/scan", json=scan_body()))["scan_id"]
    assert (await stale.call("GET", f"/scan/{scan_id}/status")).body["scan_complete"] is False  # now held
    final = {"scan_result": {"n": 1}, "is_final": True}
    ok(await a.call("PUT", f"/scan/{scan_id}/result", as_system=True, json=final))
    refused = await stale.call("DELETE", f"/scan/{scan_id}")
    assert (refused.status, refused.body["reason"]) == (400, COMPLETED)


async def scan_gets_not_found(k: kube.Kube) -> float:
    """The API server's count of GETs of a Scan answered 404 (its own metrics)."""
    text = (await k.read("GET", "/metrics", accept="text/plain")).decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "apiserver_request"
        for sample in family.samples
        if sample.name == "apiserver_request_total"
        and (sample.labels.get("resource"), sample.labels.get("verb"), sample.labels.get("code"))
        == ("scans", "GET", "404")
    )


async def test_reads_of_unknown_ids_do_not_become_api_server_load(
    replicas: tuple[Replica, Replica], cluster: Cluster
) -> None:
    """Hostile ids, well-formed and recent (the kind a replica reads from the API server): every read
    answers 404, and the API server sees at most the token bucket's worth of GETs."""
    _, b = replicas
    async with await kube.connect(cluster.kubeconfig) as k:
        before = await scan_gets_not_found(k)
        started = time.monotonic()
        now = time.time()
        distinct = [model.new_scan_id(now, secrets.token_hex(10)) for _ in range(200)]
        same = [model.new_scan_id(now, "f" * 20)] * 200
        replies = await asyncio.gather(*(b.call("GET", f"/scan/{i}/status") for i in distinct + same))
        elapsed = time.monotonic() - started
        assert {r.status_code for r in replies} == {404}
        gets = await scan_gets_not_found(k) - before
    allowed = READS_BURST + READS_PER_SECOND * elapsed
    print(f"400 reads of unknown recent ids in {elapsed:.2f} s: {gets:.0f} GETs (at most {allowed:.0f})")
    assert 0 < gets <= allowed


async def answer_worker_requests(k: kube.Kube, namespace: str, scan_id: str) -> None:
    """Play the operator: answer every pending `spec.workerRequests` entry in status (taskforce
    `tf-<request id>`), a guarded write so that no answer of its own is lost, until cancelled."""
    path = kube.scan_path(namespace, scan_id)
    while True:
        scan = await k.request("GET", path)
        answered = list((scan.get("status") or {}).get("workerRequests") or [])
        known = {o["id"] for o in answered}
        pending = [r for r in scan["spec"].get("workerRequests") or [] if r["id"] not in known]
        if pending:
            outcomes = [
                {
                    "id": r["id"],
                    "state": "Succeeded",
                    "taskforceUuid": f"tf-{r['id']}",
                    "nWorkers": r["nWorkers"],
                }
                for r in pending
            ]
            body = {"metadata": {"resourceVersion": scan["metadata"]["resourceVersion"]}}
            body["status"] = {"workerRequests": [*answered, *outcomes]}
            try:
                await k.request("PATCH", path + "/status", body=body, content_type=kube.MERGE_PATCH)
            except KubeError as e:
                if e.status != 409:
                    raise
            continue
        await asyncio.sleep(0.05)


async def test_concurrent_writes_to_one_scan_through_both_replicas_are_all_kept(
    replicas: tuple[Replica, Replica], cluster: Cluster, namespace: str
) -> None:
    """Progress reports, results, worker requests, then soft deletes too, all at once through both
    replicas: every answered write is in the Scan at the end, and both replicas read the same."""
    a, b = replicas
    both = (a, b)
    scan_id = ok(await a.call("POST", "/scan", json=scan_body()))["scan_id"]
    workflow = {"workflow_id": "wf-1", "wms_address": "http://wms"}
    ok(await b.call("POST", f"/scan/{scan_id}/wms/workflow-id", as_system=True, json=workflow))
    metadata = {"event_metadata": EVENT_METADATA, "scan_metadata": {"scanner": "4.2.10"}}

    def reports(first: int, n: int) -> list[Any]:
        return [
            both[i % 2].call(
                "PATCH", f"/scan/{scan_id}/manifest", as_system=True, json={"progress": report(i), **metadata}
            )
            for i in range(first, first + n)
        ]

    def asks(first: int, n: int) -> list[Any]:
        body = {"cluster_location": "osg"}
        return [
            both[(i + 1) % 2].call(
                "POST", f"/scan/{scan_id}/actions/add-workers", json={**body, "n_workers": i}
            )
            for i in range(first, first + n)
        ]

    results = [
        both[i % 2].call(
            "PUT",
            f"/scan/{scan_id}/result",
            as_system=True,
            json={"scan_result": {"n": i}, "is_final": False},
        )
        for i in range(4)
    ]
    async with await kube.connect(cluster.kubeconfig) as k:
        operator = asyncio.create_task(answer_worker_requests(k, namespace, scan_id))
        try:
            first = await asyncio.gather(*reports(0, 16), *asks(1, 8), *results)
            deletes = [both[i % 2].call("DELETE", f"/scan/{scan_id}") for i in range(4)]
            second = await asyncio.gather(*deletes, *reports(16, 16), *asks(9, 8))
        finally:
            operator.cancel()
        scan = await k.request("GET", kube.scan_path(namespace, scan_id))

    replies = first + second
    # Nothing failed but what must: an add-workers request after the delete landed.
    refused = [r for r in replies if r.status_code != 200]
    assert all(r.json()["reason"] == "this scan has been deleted--cannot add workers" for r in refused), [
        r.text for r in refused
    ]
    assert all(r.status_code == 200 for r in first)
    # Every worker request answered 200 is in spec, once; no refused one is.
    granted = sorted(
        r.json()["taskforce_uuid"] for r in replies if r.status_code == 200 and "taskforce_uuid" in r.json()
    )
    stored = sorted(f"tf-{r['id']}" for r in scan["spec"]["workerRequests"])
    assert granted == stored and len(granted) >= 8
    assert scan["spec"]["deleted"] is True
    assert scan["status"]["workflow"]["id"] == "wf-1"
    assert scan["status"]["result"]["isFinal"] is False
    assert scan["status"]["eventMetadata"] and scan["status"]["scanMetadata"] == {"scanner": "4.2.10"}
    assert scan["status"]["progress"]["summary"] in {f"report {i}" for i in range(32)}

    # Both replicas read exactly that, once their caches reach its version.
    fresh = {MIN_VERSION_HEADER: scan["metadata"]["resourceVersion"]}
    manifests = [
        ok(
            await r.call(
                "GET", f"/scan/{scan_id}/manifest", params={"include_deleted": "true"}, headers=fresh
            )
        )
        for r in both
    ]
    assert manifests[0] == manifests[1]
    assert manifests[0]["is_deleted"] is True and manifests[0]["wms_workflow_id"] == "wf-1"
    assert manifests[0]["progress"]["summary"] == scan["status"]["progress"]["summary"]
