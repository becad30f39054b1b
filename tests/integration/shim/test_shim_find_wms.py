"""POST /scans/find, the backlog, the WMS routes and add-workers (the operator's part played here)."""
# ruff: noqa: E501  - request tables read best unwrapped

from __future__ import annotations

import asyncio
import random
import secrets
import time
from typing import Any

import pytest

from api_shim.find import search as find_handler
from api_shim.find.query import FindLimits
from skyscan import model
from skyscan.io.kube import scan_path
from tests.helpers import eventually
from tests.integration.shim.conftest import ShimUnderTest


async def find(shim: ShimUnderTest, **body: Any) -> list[str]:
    """The ids of the manifests found; the find projected to scan_id (answered from the index of live
    scans alone when it can) finds the same."""
    reply = await shim.call("POST", "/scans/find", json_body=body)
    assert reply.status == 200, reply.body
    ids = [m["scan_id"] for m in reply.body["manifests"]]
    reply = await shim.call("POST", "/scans/find", json_body={**body, "manifest_projection": ["scan_id"]})
    assert reply.status == 200, reply.body
    assert reply.body == {"manifests": [{"scan_id": i} for i in ids]}, body
    return ids


async def test_find_filters_and_include_deleted(shim: ShimUnderTest) -> None:
    a = (await shim.launch(priority=1, classifiers={"origin": "alert", "n": 1}))["scan_id"]
    b = (await shim.launch(priority=5, classifiers={"origin": "manual", "n": 2}))["scan_id"]
    c = (await shim.launch(priority=9, classifiers={"origin": "alert", "n": 3}))["scan_id"]
    await shim.call(
        "PATCH", f"/scan/{b}/manifest", as_="system",
        json_body={"event_metadata": {"run_id": 7, "event_id": 8, "event_type": "x", "mjd": 1.0, "is_real_event": True}},
    )  # fmt: skip
    assert await find(shim, filter={}) == [a, b, c]
    assert await find(shim, filter={"classifiers.origin": "alert"}) == [a, c]
    assert await find(shim, filter={"event_metadata.run_id": 7, "event_metadata.is_real_event": True}) == [b]
    assert await find(shim, filter={"priority": {"$gte": 5}}) == [b, c]
    assert await find(shim, filter={"priority": {"$in": [1, 9]}, "classifiers.n": {"$ne": 3}}) == [a]
    assert await find(
        shim, filter={"$or": [{"priority": 1}, {"classifiers.origin": {"$regex": "^man"}}]}
    ) == [a, b]
    assert await find(shim, filter={"$nor": [{"priority": 1}]}) == [b, c]
    assert await find(shim, filter={"event_metadata": {"$exists": True, "$ne": None}}) == [b]
    assert await find(shim, filter={"priority": {"$not": {"$lt": 5}}}) == [b, c]

    await shim.call("DELETE", f"/scan/{a}")
    assert await find(shim, filter={}) == [b, c]
    assert await find(shim, filter={}, include_deleted=False) == [b, c]
    assert await find(shim, filter={"is_deleted": False}) == [b, c]
    assert await find(shim, filter={}, include_deleted=True) == [a, b, c]
    assert await find(shim, filter={"is_deleted": True}) == [a]
    assert await find(shim, filter={"classifiers.origin": "alert"}) == [c]  # these by the index alone
    assert await find(shim, filter={"classifiers.origin": "alert"}, include_deleted=True) == [a, c]
    assert await find(shim, filter={"classifiers.n": {"$in": [1, 2.0]}, "is_deleted": True}) == [a]
    assert await find(shim, filter={"event_metadata.run_id": 7, "classifiers.n": 2}) == [b]
    # A top-level is_deleted wins over include_deleted.
    assert await find(shim, filter={"is_deleted": False}, include_deleted=True) == [b, c]


async def test_find_projection(shim: ShimUnderTest) -> None:
    await shim.launch()
    for projection in ("*", ["*"], None):
        body: dict[str, Any] = {"filter": {}}
        if projection is not None:
            body["manifest_projection"] = projection
        (manifest,) = (await shim.call("POST", "/scans/find", json_body=body)).body["manifests"]
        assert "scan_id" in manifest and "progress" in manifest
        assert not {"wms_task", "event_live_json_dict", "event_live_json_dict__hash"} & set(manifest)
    reply = await shim.call(
        "POST", "/scans/find", json_body={"filter": {}, "manifest_projection": ["scan_id"]}
    )
    assert list(reply.body["manifests"][0]) == ["scan_id"]
    for disallowed in (
        ["scan_id", "wms_task"],
        ["*", "event_live_json_dict"],
        ["event_live_json_dict__hash"],
    ):
        reply = await shim.call(
            "POST", "/scans/find", json_body={"filter": {}, "manifest_projection": disallowed}
        )
        assert reply.status == 400 and reply.body["reason"].startswith("manifest_projection cannot include: ")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"filter": {"priority": {"$where": "1"}}}, "invalid filter: unsupported operator: $where"),
        ({"filter": {"$expr": {}}}, "invalid filter: unsupported operator: $expr"),
        ({"filter": {"priority": {"$in": 1}}}, "invalid filter: $in needs an array"),
        ({}, "'filter' is a required property"),
        ({"filter": []}, "'filter': must be type 'object' (dict)"),
        ({"filter": {}, "include_deleted": "yes"}, "'include_deleted': must be type 'boolean' (bool)"),
        ({"filter": {}, "limit": 3}, "Additional properties are not allowed ('limit' was unexpected)"),
    ],
)
async def test_find_refuses_bad_requests(shim: ShimUnderTest, body: dict[str, Any], reason: str) -> None:
    reply = await shim.call("POST", "/scans/find", json_body=body)
    assert (reply.status, reply.body["reason"]) == (400, reason)


CATASTROPHIC = ["^\\w{8}(\\w+)+!", "^(\\w+)+!", "(a|aa)+$", "(.*a){20}"]  # exponential when backtracking


async def test_find_regex_never_stalls_the_shim(shim: ShimUnderTest) -> None:
    """Patterns that backtrack exponentially answer at once, and /healthz stays fast meanwhile."""
    for _ in range(3):
        await shim.launch()
    await shim.call("DELETE", f"/scan/{(await shim.launch())['scan_id']}")
    health: list[float] = []
    done = asyncio.Event()

    async def probe_health() -> None:
        while not done.is_set():
            start = time.perf_counter()
            assert (await shim.call("GET", "/healthz", as_=None)).status == 200
            health.append(time.perf_counter() - start)
            await asyncio.sleep(0.005)

    prober = asyncio.create_task(probe_health())
    try:
        for pattern in CATASTROPHIC:
            for field in ("scan_id", "scanner_server_args", "progress.summary"):
                body = {"filter": {field: {"$regex": pattern}}, "include_deleted": True}
                start = time.perf_counter()
                reply = await shim.call("POST", "/scans/find", json_body=body)
                elapsed = time.perf_counter() - start
                assert reply.status in (200, 400), reply.body
                assert elapsed < 1.0, (pattern, field, elapsed)  # the acceptance is 200 ms; generous here
    finally:
        done.set()
        await prober
    assert health and max(health) < 0.5, max(health)  # the acceptance is 50 ms; generous here


@pytest.mark.parametrize(
    ("pattern", "options", "reason"),
    [
        (
            "(a)\\1",
            "",
            "invalid filter: invalid $regex: invalid escape sequence: \\1 (the linear-time engine refuses backreferences, lookahead/lookbehind, atomic groups, possessive quantifiers, recursion and conditionals)",
        ),
        (
            "^(?=\\w)",
            "",
            "invalid filter: invalid $regex: invalid perl operator: (?= (the linear-time engine refuses",
        ),
        (
            "(?<!a)b",
            "",
            "invalid filter: invalid $regex: invalid perl operator: (?<! (the linear-time engine refuses",
        ),
        (
            "(?>a+)b",
            "",
            "invalid filter: invalid $regex: invalid perl operator: (?> (the linear-time engine refuses",
        ),
        (
            "a++",
            "",
            "invalid filter: invalid $regex: bad repetition operator: ++ (the linear-time engine refuses",
        ),
        (
            "(.*a){200}",
            "",
            "invalid filter: invalid $regex: pattern too complex: its program has 1804 instructions, at most 1000 are allowed",
        ),
        ("a" * 1001, "", "invalid filter: invalid $regex: pattern longer than 1000 characters"),
        ("a", "u", "invalid filter: unsupported $options flag: 'u' (supported: i, m, s, x)"),
    ],
)
async def test_find_refuses_patterns_it_cannot_run_in_linear_time(
    shim: ShimUnderTest, pattern: str, options: str, reason: str
) -> None:
    await shim.launch()
    condition = {"$regex": pattern, **({"$options": options} if options else {})}
    reply = await shim.call("POST", "/scans/find", json_body={"filter": {"scan_id": condition}})
    assert reply.status == 400
    assert set(reply.body) == {"error", "reason", "message"} and reply.body["error"] == "Bad Request"
    assert reply.body["reason"].startswith(reason), reply.body["reason"]


async def test_find_limits(shim: ShimUnderTest, monkeypatch: pytest.MonkeyPatch) -> None:
    deep: dict[str, Any] = {"priority": 1}
    for _ in range(20):
        deep = {"$or": [deep]}
    for query, reason in [
        (deep, "invalid filter: the filter is nested deeper than 16 levels"),
        ({"priority": {"$in": list(range(1000))}}, "invalid filter: the filter has more than 1000 keys"),
    ]:
        reply = await shim.call("POST", "/scans/find", json_body={"filter": query})
        assert (reply.status, reply.body["reason"][: len(reason)]) == (400, reason)

    monkeypatch.setattr(find_handler, "LIMITS", FindLimits(max_work=9))
    await shim.launch()
    await shim.launch()
    assert len(await find(shim, filter={"priority": 0})) == 2  # cost 4 (with is_deleted) x 2 scans
    reply = await shim.call("POST", "/scans/find", json_body={"filter": {"priority": {"$gte": 0, "$lt": 5}}})
    assert reply.status == 400
    assert reply.body["reason"] == "filter too costly: 5 per scan * 2 scans exceeds the work budget of 9"


async def test_find_answers_many_scans_in_id_order(
    shim: ShimUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More manifests than one write chunk and one sort run, created out of id order."""
    monkeypatch.setattr(find_handler, "SORT_RUN", 16)
    now = time.time()
    ids = [model.new_scan_id(now + i, secrets.token_hex(10)) for i in range(150)]
    spec = {
        "dockerTag": "4.1.0", "recoAlgo": "millipede_wilks", "sensorEventId": "ev", "nsides": {"8": 0},
        "realOrSimulatedEvent": "real", "maxPixelRecoTime": 600, "requestClusters": [{"location": "osg", "nWorkers": 1}],
    }  # fmt: skip
    sem = asyncio.Semaphore(8)

    async def create(i: int, name: str) -> None:
        async with sem:
            body = {
                "apiVersion": model.API_VERSION,
                "kind": model.KIND,
                "metadata": {"name": name},
                "spec": {**spec, "priority": i % 3},
            }
            await shim.api.request("POST", scan_path(shim.namespace), body=body)

    await asyncio.gather(*(create(i, name) for i, name in random.sample(list(enumerate(ids)), len(ids))))

    async def all_there() -> list[str] | None:
        found = await find(shim, filter={}, manifest_projection=["scan_id"])
        return found if len(found) == len(ids) else None

    assert await eventually(all_there, timeout=30) == sorted(ids)
    assert await find(shim, filter={"priority": 2}) == [n for i, n in enumerate(ids) if i % 3 == 2]
    manifests = (await shim.call("POST", "/scans/find", json_body={"filter": {"scan_id": ids[77]}})).body[
        "manifests"
    ]
    direct = (await shim.call("GET", f"/scan/{ids[77]}/manifest")).body
    assert manifests == [
        {
            k: v
            for k, v in direct.items()
            if k not in ("wms_task", "event_live_json_dict", "event_live_json_dict__hash")
        }
    ]


async def test_backlog_lists_what_the_operator_holds(shim: ShimUnderTest) -> None:
    first = (await shim.launch())["scan_id"]
    second = (await shim.launch(priority=100))["scan_id"]  # an entry's priority is its spec's
    third = (await shim.launch())["scan_id"]
    assert (await shim.call("GET", "/scans/backlog")).body == {"entries": []}
    await shim.operator_writes(second, {"backlog": {"enteredAt": 20.0, "pendingSince": 0.0, "attempts": 0}})
    await shim.operator_writes(first, {"backlog": {"enteredAt": 10.0, "pendingSince": 11.5, "attempts": 2}})

    async def two() -> Any:
        entries = (await shim.call("GET", "/scans/backlog")).body["entries"]
        return entries if len(entries) == 2 else None

    entries = await eventually(two, timeout=10)
    assert entries == [  # in admission order: priority, then age
        {
            "scan_id": second,
            "timestamp": 20.0,
            "pickled_k8s_job": None,
            "priority": 100,
            "pending_timestamp": 0.0,
            "next_attempt": 0,
            "position": 1,
        },
        {
            "scan_id": first,
            "timestamp": 10.0,
            "pickled_k8s_job": None,
            "priority": 0,
            "pending_timestamp": 11.5,
            "next_attempt": 2,
            "position": 2,
        },
    ]
    assert third not in [e["scan_id"] for e in entries]


async def test_the_backlog_in_admission_order_and_a_waiting_scans_place(shim: ShimUnderTest) -> None:
    """Positions by priority then arrival, a scan in a start attempt first without one; the status
    shows the place the operator wrote, its estimated wait counted from now."""
    old_low, new_low, high, starting = [(await shim.launch(priority=p))["scan_id"] for p in (0, 0, 200, 0)]
    entered = {old_low: 10.0, new_low: 30.0, high: 40.0, starting: 20.0}
    for scan_id, at in entered.items():
        await shim.operator_writes(
            scan_id, {"backlog": {"enteredAt": at, "pendingSince": 0.0, "attempts": 0}}
        )
    admitted = {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "start attempt 1",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    await shim.operator_writes(starting, {"conditions": [admitted]})
    start_at = time.time() + 120
    place = {"waitReason": "Priority", "position": 3, "estimatedStart": start_at}
    await shim.operator_writes(new_low, {"backlog": {"enteredAt": 30.0, **place}})

    async def ordered() -> Any:
        entries = (await shim.call("GET", "/scans/backlog")).body["entries"]
        got = [(e["scan_id"], e["position"]) for e in entries]
        return got if got == [(starting, None), (high, 1), (old_low, 2), (new_low, 3)] else None

    await eventually(ordered, timeout=10)

    async def placed() -> Any:
        return (await shim.call("GET", f"/scan/{new_low}/status")).body["backlog"]

    backlog = await eventually(placed, timeout=10)
    assert (backlog["position"], backlog["wait_reason"]) == (3, "Priority")
    assert backlog["estimated_start"] == start_at
    assert 100 < backlog["estimated_wait_seconds"] <= 120
    assert (await shim.call("GET", f"/scan/{high}/status")).body["backlog"] is None  # no place written


async def test_workflow_id_is_set_once(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/wms/workflow-id"
    assert (await shim.call("GET", path)).body == {
        "workflow_id": "not-yet-requested", "requested_wms_workflow": False, "eligible_for_wms": True, "wms_address": None,
    }  # fmt: skip
    reply = await shim.call(
        "POST", path, as_="system", json_body={"workflow_id": "wf-1", "wms_address": "https://wms.test"}
    )
    assert (
        reply.status == 200
        and reply.body["wms_workflow_id"] == "wf-1"
        and reply.body["wms_address"] == "https://wms.test"
    )
    assert (await shim.call("GET", path)).body == {
        "workflow_id": "wf-1", "requested_wms_workflow": True, "eligible_for_wms": True, "wms_address": "https://wms.test",
    }  # fmt: skip
    again = await shim.call("POST", path, as_="system", json_body={"workflow_id": "wf-2", "wms_address": "x"})
    assert again.status == 404
    status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
    assert status["scan_state"] == "PENDING__WAITING_ON_SCANNER_SERVER_STARTUP"

    deleted = (await shim.launch())["scan_id"]
    await shim.call("DELETE", f"/scan/{deleted}")
    reply = await shim.call(
        "POST",
        f"/scan/{deleted}/wms/workflow-id",
        as_="system",
        json_body={"workflow_id": "w", "wms_address": "a"},
    )
    assert reply.status == 404
    bad = await shim.call("POST", path, as_="system", json_body={"workflow_id": ""})
    assert bad.status == 400 and "'wms_address' is a required property" in bad.body["reason"]


async def test_workforce_taskforces_and_deactivation(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    assert (await shim.call("GET", f"/scan/{scan_id}/wms/taskforces")).body == {"taskforces": []}
    taskforces = [{"taskforce_uuid": "tf1", "n_workers": 3, "cluster_location": "osg"}]
    await shim.operator_writes(
        scan_id,
        {
            "workflow": {"id": "wf-9", "address": "https://wms.test", "deactivated": "ABORTED"},
            "workforce": {"statuses": {"IDLE": {"x": 2}}, "nRunning": 4, "topErrors": {"boom": 1}},
            "taskforces": taskforces,
        },
    )

    async def aborted() -> Any:
        status = (await shim.call("GET", f"/scan/{scan_id}/status")).body
        return status if status["wms_deactivated"] else None

    status = await eventually(aborted, timeout=10)
    assert status["scan_state"] == "ABORTED__WAITING_ON_SCANNER_SERVER_STARTUP"
    workforce = {
        "workflow_id": "wf-9",
        "statuses": {"IDLE": {"x": 2}},
        "n_running": 4,
        "top_errors": {"boom": 1},
    }
    assert status["wms_workforce"] == workforce
    assert (await shim.call("GET", f"/scan/{scan_id}/wms/workforce")).body == workforce
    assert (await shim.call("GET", f"/scan/{scan_id}/wms/taskforces")).body == {"taskforces": taskforces}


async def play_operator_for_workers(
    shim: ShimUnderTest, scan_id: str, state: str, reason: str | None = None
) -> None:
    """Wait for the add-workers request in spec and answer it in status, as the operator does."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        scan = await shim.kube_scan(scan_id)
        answered = list((scan.get("status") or {}).get("workerRequests") or [])
        pending = [
            r for r in scan["spec"].get("workerRequests") or [] if r["id"] not in {a["id"] for a in answered}
        ]
        if pending:
            ask = pending[0]
            outcome = {"id": ask["id"], "state": state, "reason": reason}
            if state == "Succeeded":
                outcome.update(taskforceUuid="tf-123", nWorkers=ask["nWorkers"])
            await shim.operator_writes(scan_id, {"workerRequests": [*answered, outcome]})
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("no worker request appeared")


async def test_add_workers(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/actions/add-workers"
    body = {"n_workers": 7, "cluster_location": "osg"}
    reply = await shim.call("POST", path, json_body=body)
    assert (reply.status, reply.body["reason"]) == (
        422,
        "a WMS workflow has not been assigned--cannot add workers",
    )
    await shim.call(
        "POST",
        f"/scan/{scan_id}/wms/workflow-id",
        as_="system",
        json_body={"workflow_id": "wf", "wms_address": "a"},
    )

    operator = asyncio.create_task(play_operator_for_workers(shim, scan_id, "Succeeded"))
    reply = await shim.call("POST", path, json_body=body)
    await operator
    assert (reply.status, reply.body) == (200, {"taskforce_uuid": "tf-123", "n_workers": 7})

    operator = asyncio.create_task(play_operator_for_workers(shim, scan_id, "Failed", "WMS said 503"))
    reply = await shim.call("POST", path, json_body=body)
    await operator
    assert reply.status == 500
    assert reply.body["reason"] == "failed to request additional workers on the WMS: WMS said 503"

    # The WMS refused the request itself (a cluster it does not know): a 400 naming it, an Error body.
    rejection = "the WMS refused workers at cluster 'osg': POST /v1/...: HTTP 400: not found: osg"
    operator = asyncio.create_task(play_operator_for_workers(shim, scan_id, "Rejected", rejection))
    reply = await shim.call("POST", path, json_body=body)
    await operator
    assert reply.status == 400
    assert reply.body == {"error": "Bad Request", "reason": rejection, "message": rejection}
    # A cluster this deployment does not offer is refused as launch refuses it, before any WMS request.
    asks = len((await shim.kube_scan(scan_id))["spec"]["workerRequests"])
    reply = await shim.call("POST", path, json_body={"n_workers": 7, "cluster_location": "mars"})
    assert reply.status == 400
    assert reply.body["reason"] == "requested unknown cluster: mars (available: osg, sub-2, local)"
    assert set(reply.body) == {"error", "reason", "message"}
    assert len((await shim.kube_scan(scan_id))["spec"]["workerRequests"]) == asks

    # The state changed before the operator acted on the request (e.g. the workflow ended): a 422.
    refusal = "its WMS workflow is aborted--cannot add workers"
    operator = asyncio.create_task(play_operator_for_workers(shim, scan_id, "Refused", refusal))
    reply = await shim.call("POST", path, json_body=body)
    await operator
    assert (reply.status, reply.body["reason"]) == (422, refusal)

    bad = await shim.call("POST", path, json_body={"n_workers": 0, "cluster_location": "osg"})
    assert (bad.status, bad.body["reason"]) == (400, "'n_workers': must be at least 1")
    await shim.call(
        "PUT", f"/scan/{scan_id}/result", as_="system", json_body={"scan_result": {"a": 1}, "is_final": True}
    )
    reply = await shim.call("POST", path, json_body=body)
    assert (reply.status, reply.body["reason"]) == (422, "this scan has a final result--cannot add workers")
    await shim.call("DELETE", f"/scan/{scan_id}", json_body={"delete_completed_scan": True})
    reply = await shim.call("POST", path, json_body=body)
    assert (reply.status, reply.body["reason"]) == (422, "this scan has been deleted--cannot add workers")


async def shim_sees_workflow(shim: ShimUnderTest, scan_id: str) -> None:
    """Until the shim's watch has brought the operator's workflow id (the shim decides on its cache)."""

    async def seen() -> bool:
        reply = await shim.call("GET", f"/scan/{scan_id}/manifest")
        return bool(reply.body.get("wms_workflow_id") == "wf")

    await eventually(seen, timeout=10)


async def test_add_workers_to_an_ended_or_deleting_scan_is_refused_at_once(shim: ShimUnderTest) -> None:
    """No request is recorded for the operator when the scan's state already says no."""
    body = {"n_workers": 1, "cluster_location": "osg"}
    ended = (await shim.launch())["scan_id"]
    await shim.operator_writes(ended, {"workflow": {"id": "wf", "deactivated": "FINISHED"}})
    await shim_sees_workflow(shim, ended)
    reply = await shim.call("POST", f"/scan/{ended}/actions/add-workers", json_body=body)
    assert (reply.status, reply.body["reason"]) == (422, "its WMS workflow is finished--cannot add workers")
    assert not (await shim.kube_scan(ended))["spec"].get("workerRequests")

    deleting = (await shim.launch())["scan_id"]
    await shim.operator_writes(deleting, {"workflow": {"id": "wf"}})
    await shim_sees_workflow(shim, deleting)
    path = scan_path(shim.namespace, deleting)
    await shim.api.request("PATCH", path, body={"metadata": {"finalizers": ["test.skyscan.io/hold"]}},
                           content_type="application/merge-patch+json")  # fmt: skip
    await shim.api.request("DELETE", path)  # held by the finalizer: being deleted
    reply = await shim.call("POST", f"/scan/{deleting}/actions/add-workers", json_body=body)
    assert (reply.status, reply.body["reason"]) == (422, "this scan has been deleted--cannot add workers")
    assert not (await shim.kube_scan(deleting))["spec"].get("workerRequests")
    await shim.api.request("PATCH", path, body={"metadata": {"finalizers": None}},
                           content_type="application/merge-patch+json")  # fmt: skip


async def test_add_workers_times_out_clearly(make_shim: Any) -> None:
    shim = await make_shim(add_workers_timeout=0.5)
    scan_id = (await shim.launch())["scan_id"]
    await shim.call(
        "POST",
        f"/scan/{scan_id}/wms/workflow-id",
        as_="system",
        json_body={"workflow_id": "wf", "wms_address": "a"},
    )
    reply = await shim.call(
        "POST", f"/scan/{scan_id}/actions/add-workers", json_body={"n_workers": 1, "cluster_location": "osg"}
    )
    assert reply.status == 504 and "did not answer" in reply.body["reason"]
    assert len((await shim.kube_scan(scan_id))["spec"]["workerRequests"]) == 1  # recorded for the operator


async def test_the_scanner_reads_its_event_through_the_manifest(shim: ShimUnderTest) -> None:
    event = {"run": 3, "value": {"data": "z"}}
    scan_id = (await shim.launch(event_live_json=event))["scan_id"]
    as_scanner = await shim.call("GET", f"/scan/{scan_id}/manifest", as_="system")
    assert as_scanner.body["event_live_json_dict"] == event
    projected = await shim.call(
        "GET", f"/scan/{scan_id}/manifest", as_="system", params={"projection": "scan_id"}
    )
    assert projected.body == {"scan_id": scan_id}
    as_user = await shim.call("GET", f"/scan/{scan_id}/manifest")
    assert as_user.body["event_live_json_dict"] == "use 'sensor_event_id'"
