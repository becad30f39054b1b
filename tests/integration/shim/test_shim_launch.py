"""POST /scan and the reads of a new scan: validation texts, tags, events, the manifest view."""
# ruff: noqa: E501  - tables of expected texts read best unwrapped

from __future__ import annotations

import base64
import os
import re
import time
from typing import Any

import pytest

from skyscan import model, names
from skyscan.io import payloads
from skyscan.io.kube import core_path, scan_path
from skyscan.state import NOT_YET_REQUESTED
from tests.helpers import eventually
from tests.integration.shim.conftest import MakeShim, ShimUnderTest, scan_body

SCAN_ID = re.compile(r"^[0-9a-f]{11}x[0-9a-f]{20}$")


async def test_root_and_launch_returns_the_full_manifest(shim: ShimUnderTest) -> None:
    assert (await shim.call("GET", "/")).body == {}
    before = time.time()
    manifest = await shim.launch()
    assert SCAN_ID.match(manifest["scan_id"])
    assert before <= manifest["timestamp"] <= manifest["last_updated"] <= time.time()
    assert manifest["wms_workflow_id"] == NOT_YET_REQUESTED
    assert manifest["wms_task"] == "use 'wms_workflow_id'"
    assert manifest["event_live_json_dict"] == "use 'sensor_event_id'"
    assert manifest["event_live_json_dict__hash"] is None
    assert manifest["is_deleted"] is False and manifest["replaced_by_scan_id"] is None
    assert manifest["classifiers"] == {"origin": "test"} and manifest["priority"] == 0
    assert manifest["progress"] is None and manifest["event_metadata"] is None
    assert manifest["scanner_server_args"] == (
        "python -m skymap_scanner.server  --reco-algo millipede_wilks --cache-dir /common-space "
        " --client-startup-json /common-space/startup.json  --nsides 1:2 3:4  --real-event "
        " --predictive-scanning-threshold 1.0 "
    )
    assert list(manifest) == [
        "scan_id", "timestamp", "is_deleted", "scanner_server_args", "wms_workflow_id", "wms_address",
        "wms_task", "priority", "classifiers", "sensor_event_id", "event_live_json_dict",
        "event_live_json_dict__hash", "event_metadata", "scan_metadata", "progress", "replaced_by_scan_id",
        "last_updated",
    ]  # fmt: skip
    # The same manifest from the cache, and a Scan whose spec is the normalised request.
    got = await shim.call("GET", f"/scan/{manifest['scan_id']}/manifest")
    assert got.status == 200 and got.body == manifest
    spec = (await shim.kube_scan(manifest["scan_id"]))["spec"]
    assert spec["dockerTag"] == "4.2.10" and spec["workerMemoryBytes"] == 8_000_000_000
    assert spec["requestClusters"] == [{"location": "osg", "nWorkers": 10}]


async def test_scan_ids_sort_by_creation(shim: ShimUnderTest) -> None:
    ids = [(await shim.launch())["scan_id"] for _ in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3


async def test_scan_request_is_the_normalised_request(shim: ShimUnderTest) -> None:
    manifest = await shim.launch(
        docker_tag="v4.1",
        worker_memory="4Gi",
        worker_memory_bytes="2GB",  # canonical name wins over its alias
        scanner_server_memory="512M",
        worker_disk=5_000,
        request_clusters=None,
        cluster=[["osg", 3], ["osg", 4], ["local", 1]],
        debug_mode="client-logs",
        priority=7,
        predictive_scanning_threshold=0.5,
        real_or_simulated_event="simulated",
        scanner_server_env={"SKYSCAN_LOG": "DEBUG"},
    )
    reply = await shim.call("GET", f"/scan-request/{manifest['scan_id']}")
    assert reply.status == 200
    assert reply.body == {
        "scan_id": manifest["scan_id"],
        "rescan_ids": [],
        "docker_tag": "4.1.0",
        "scanner_server_memory_bytes": 512_000_000,
        "reco_algo": "millipede_wilks",
        "nsides": {"1": 2, "3": 4},
        "real_or_simulated_event": "simulated",
        "predictive_scanning_threshold": 0.5,
        "classifiers": {"origin": "test"},
        "request_clusters": [["osg", 3], ["osg", 4], ["local", 1]],
        "worker_memory_bytes": 2_000_000_000,
        "worker_disk_bytes": 5_000,
        "max_pixel_reco_time": 600,
        "priority": 7,
        "debug_mode": ["client-logs"],
        "sensor_event_id": manifest["sensor_event_id"],
        "scanner_server_env_from_user": {"SKYSCAN_LOG": "DEBUG"},
    }
    assert "--simulated-event" in manifest["scanner_server_args"]
    # The stored request minus its ids is a valid POST /scan body (reuses the event by id).
    again = {k: v for k, v in reply.body.items() if k not in ("scan_id", "rescan_ids")}
    assert (await shim.call("POST", "/scan", json_body=again)).status == 200


async def test_projection_on_launch(shim: ShimUnderTest) -> None:
    reply = await shim.call("POST", "/scan", json_body=scan_body(manifest_projection=["scan_id", "priority"]))
    assert reply.status == 200 and set(reply.body) == {"scan_id", "priority"}
    reply = await shim.call("POST", "/scan", json_body=scan_body(manifest_projection="*"))
    assert "wms_task" in reply.body


MAX = 2**63 - 1024
RECO_ALGO, NSIDE = "^[A-Za-z][A-Za-z0-9_]{0,63}$", "^[1-9][0-9]{0,3}$"
RESERVED = "(reserved prefixes: SKYSCAN_SKYDRIVER_, SKYSCAN_EWMS_, SKYSCAN_MQ_, SKYSCAN_STARTUP_, EWMS_, KUBERNETES_, PYTHON, LD_)"
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"scan_id": "x"}, "Additional properties are not allowed ('scan_id' was unexpected)"),
    ({"scan_id": "x", "rescan_ids": []}, "Additional properties are not allowed ('rescan_ids', 'scan_id' were unexpected)"),
    ({"docker_tag": None}, "'docker_tag' is a required property"),
    ({"docker_tag": " "}, "'docker_tag': must match the pattern '\\\\S'"),
    ({"worker_memory_bytes": "lots"}, "invalid size: lots"),
    ({"worker_memory_bytes": 1.5}, "'worker_memory_bytes': must match one of the accepted types"),
    # Blank sizes, and sizes an int64 cannot hold (the CRD's bound: the largest int64 a float64 states).
    ({"worker_disk_bytes": "   "}, "'worker_disk_bytes': must match the pattern '\\\\S'"),
    ({"worker_memory": " "}, "'worker_memory': must match the pattern '\\\\S'"),
    ({"scanner_server_memory_bytes": ""}, "'scanner_server_memory_bytes': must be at least 1 characters long"),
    ({"worker_memory_bytes": 10**40}, f"'worker_memory_bytes': must be no more than {MAX}"),
    ({"worker_memory_bytes": "999999999999PB"}, f"'worker_memory_bytes': must be no more than {MAX} bytes"),
    ({"worker_disk": "1" * 400 + ".5GB"}, f"'worker_disk': must be no more than {MAX} bytes"),
    ({"scanner_server_memory_bytes": "9" * 5000}, f"'scanner_server_memory_bytes': must be no more than {MAX} bytes"),
    ({"request_clusters": {"mars": 1}}, "requested unknown cluster: mars (available: osg, sub-2, local)"),
    ({"request_clusters": None}, "'request_clusters' is a required property"),
    ({"request_clusters": None, "cluster": [["osg"]]}, "'cluster': must match one of the accepted types"),
    ({"memory": "8GB"}, "argument 'memory' is deprecated -- use 'worker_memory_bytes'"),
    ({"classifiers": {"rescan": True}}, "classifier cannot contain 'rescan' sub-field"),
    ({"classifiers": {"origin_scan_id": "a"}}, "classifier cannot contain 'origin_scan_id' sub-field"),
    ({"classifiers": {"a": "x" * 26}}, "'classifiers.a': must be no more than 25 characters long"),
    ({"classifiers": {"a": ["x"]}}, "'classifiers.a': must match one of the accepted types"),
    ({"classifiers": {f"k{i}": i for i in range(26)}}, "'classifiers': must have no more than 25 entries"),
    ({"scanner_server_env_from_user": {"A": {"b": 1}}}, "'scanner_server_env_from_user.A': must match one of the accepted types"),
    # The scanner's REST address, credential and WMS connection are Skyscan's: redirecting them would hand
    # the scanner's token to the user's listener.
    ({"scanner_server_env_from_user": {"SKYSCAN_SKYDRIVER_ADDRESS": "http://127.0.0.1:9999"}},
     f"'scanner_server_env_from_user': cannot set 'SKYSCAN_SKYDRIVER_ADDRESS': Skyscan sets the scanner's own variables {RESERVED}"),
    ({"scanner_server_env": {"skyscan_skydriver_auth": "x"}},
     f"'scanner_server_env': cannot set 'skyscan_skydriver_auth': Skyscan sets the scanner's own variables {RESERVED}"),
    ({"scanner_server_env_from_user": {"OK": 1, "EWMS_PILOT_TASK_TIMEOUT": 1}},
     f"'scanner_server_env_from_user': cannot set 'EWMS_PILOT_TASK_TIMEOUT': Skyscan sets the scanner's own variables {RESERVED}"),
    # The scanner's environment is an allow-list: a proxy would receive its bearer token, a CA bundle
    # would let another listener pass for the shim, PATH or BASH_ENV would change what it runs.
    *(({"scanner_server_env_from_user": {name: "http://evil.example:3128"}}, f"cannot set '{name}' in the scanner's environment")
      for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "PATH", "BASH_ENV", "GCONV_PATH")),
    *(({"scanner_server_env_from_user": {name: "x"}}, f"cannot set '{name}' in the scanner's environment")
      for name in ("NO_PROXY", "CURL_CA_BUNDLE", "HOME", "SKYSCAN_BROKER_ADDRESS", "SKYSCAN_CACHE_DIR", "SKYSCAN_N")),
    *(({"scanner_server_env_from_user": {name: "/tmp/x"}}, f"'scanner_server_env_from_user': cannot set '{name}': Skyscan sets the scanner's own variables {RESERVED}")
      for name in ("LD_PRELOAD", "PYTHONPATH", "SKYSCAN_MQ_TIMEOUT_FROM_CLIENTS")),
    # Names the API server would refuse, values no exec carries and integers the API server would round
    # are refused here, naming them.
    ({"scanner_server_env_from_user": {"A-B": 1}}, "'scanner_server_env_from_user.A-B': must match the pattern '^[A-Za-z_][A-Za-z0-9_]*$'"),
    ({"scanner_server_env_from_user": {"1A": 1}}, "'scanner_server_env_from_user.1A': must match the pattern '^[A-Za-z_][A-Za-z0-9_]*$'"),
    ({"scanner_server_env_from_user": {"A" * 129: 1}}, f"'scanner_server_env_from_user.{'A' * 129}': must be no more than 128 characters long"),
    ({"scanner_server_env_from_user": {"SKYSCAN_LOG": "INFO\x00"}}, "'scanner_server_env_from_user.SKYSCAN_LOG': must match the pattern '^[^\\\\x00]*$'"),
    ({"scanner_server_env_from_user": {"SKYSCAN_LOG": "x" * 4097}}, "'scanner_server_env_from_user.SKYSCAN_LOG': must be no more than 4096 characters long"),
    ({"scanner_server_env_from_user": {f"SKYSCAN_LOG_{i}": 1 for i in range(26)}}, "'scanner_server_env_from_user': must have no more than 25 entries"),
    ({"scanner_server_env_from_user": {"SKYSCAN_LOG": 2**70}}, f"'scanner_server_env_from_user.SKYSCAN_LOG': integers are at most {MAX} and at least {-(2**63)}"),
    ({"classifiers": {"n": -(2**64)}}, f"'classifiers.n': integers are at most {MAX} and at least {-(2**63)}"),
    # Every user value is one argument of the scanner, of a known grammar.
    ({"reco_algo": "millipede_wilks --cache-dir /etc --client-startup-json /tmp/pwn"}, f"'reco_algo': must match the pattern '{RECO_ALGO}'"),
    ({"reco_algo": "$(SKYSCAN_SKYDRIVER_AUTH)"}, f"'reco_algo': must match the pattern '{RECO_ALGO}'"),
    ({"nsides": {"8 --x": 0}}, f"'nsides.8 --x': must match the pattern '{NSIDE}'"),
    ({"nsides": {"abc": 0}}, f"'nsides.abc': must match the pattern '{NSIDE}'"),
    ({"nsides": {"08": 0}}, f"'nsides.08': must match the pattern '{NSIDE}'"),
    ({"nsides": {"9000": 0}}, "'nsides': nside 9000 is beyond the scanner's range (at most 8192)"),
    ({"nsides": {"": 0}}, f"'nsides.': must match the pattern '{NSIDE}'"),
    ({"nsides": {"-8": 0}}, f"'nsides.-8': must match the pattern '{NSIDE}'"),
    ({"nsides": {"9" * 1000: 0}}, f"'nsides.{'9' * 1000}': must match the pattern '{NSIDE}'"),
    ({"nsides": {str(n): 0 for n in range(1, 18)}}, "'nsides': must have no more than 16 entries"),
    ({"nsides": {str(n): 0 for n in range(1, 40_001)}}, "'nsides': must have no more than 16 entries"),
    ({"nsides": {"8": 0, "64": 12 * 8192**2 + 1}}, f"'nsides.64': must be no more than {12 * 8192**2}"),
    ({"request_clusters": [["osg", 100_001]]}, "'request_clusters.0.1': must be no more than 100000"),
    ({"request_clusters": {"osg": 9_200_000_000_000_000_000}}, "'request_clusters.osg': must be no more than 100000"),
    ({"request_clusters": [["x" * 65, 1]]}, "'request_clusters.0.0': must be no more than 64 characters long"),
    # The deployment's bound (SKYSCAN_MAX_N_WORKERS, 10,000 by default), below the CRD's.
    ({"request_clusters": {"osg": 10_001}}, "'request_clusters.osg': must be no more than 10000"),
    ({"request_clusters": [["osg", 1], ["sub-2", 10_001]]}, "'request_clusters.1.1': must be no more than 10000"),
    ({"request_clusters": None, "cluster": {"osg": 10_001}}, "'cluster.osg': must be no more than 10000"),
    ({"docker_tag": "foo"}, "argument docker_tag: image not found"),
    ({"docker_tag": "3.1"}, "argument docker_tag: Image tag is older than the minimum supported tag 'v4.0.0'. Contact admins for more info."),
    ({"event_live_json": None}, "Must provide either 'event_live_json' or 'sensor_event_id' (xor)"),
    ({"event_live_json": {}}, "Must provide either 'event_live_json' or 'sensor_event_id' (xor)"),
    ({"sensor_event_id": "abc"}, "Must provide either 'event_live_json' or 'sensor_event_id' (xor)"),
    ({"event_live_json": None, "sensor_event_id": "f" * 32}, "sensor event not found"),
    ({"event_live_json": None, "sensor_event_id": "../x"}, "'sensor_event_id': must match the pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"),
    ({"event_live_json": "{not json}"}, "event_live_json is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ({"real_or_simulated_event": "maybe"}, "'real_or_simulated_event': must be one of: 'real', 'real_event', 'sim', 'simulated', 'simulated_event'"),
    ({"debug_mode": "verbose"}, "'debug_mode': must be one of: 'client-logs'"),
    ({"debug_mode": ["client-logs"], "request_clusters": [["local", 6]]}, "Too many workers: Cluster 'local' can only have 5 workers when 'debug_mode' includes 'client-logs'"),
    ({"predictive_scanning_threshold": 1.5}, "'predictive_scanning_threshold': must be no more than 1.0"),
    ({"max_pixel_reco_time": 0}, "'max_pixel_reco_time': must be at least 1"),
    ({"priority": "high"}, "'priority': must be type 'integer' (int)"),
    ({"priority": 2**70}, f"'priority': must be no more than {MAX}"),
    ({"priority": -(2**70)}, "'priority': must be at least -9223372036854775808"),
    ({"priority": 1.5}, "'priority': must be type 'integer' (int)"),
    ({"priority": True}, "'priority': must be type 'integer' (int)"),
    ({"max_pixel_reco_time": 2**70}, f"'max_pixel_reco_time': must be no more than {MAX}"),
    ({"max_pixel_reco_time": 91.5}, "'max_pixel_reco_time': must be type 'integer' (int)"),
    ({"max_pixel_reco_time": "91"}, "'max_pixel_reco_time': must be type 'integer' (int)"),
    ({"nsides": {"1": 2**64}}, f"'nsides.1': must be no more than {12 * 8192**2}"),
    ({"request_clusters": {"osg": 2**70}}, "'request_clusters.osg': must be no more than 100000"),
    # JSON has no NaN or Infinity (Python's encoder writes them anyway).
    ({"predictive_scanning_threshold": float("nan")}, "'predictive_scanning_threshold': must be a finite number"),
    ({"classifiers": {"a": float("inf")}}, "'classifiers.a': must be a finite number"),
    ({"event_live_json": {"a": [float("nan")]}}, "'event_live_json': must not contain NaN or an infinite number (JSON has neither)"),
    ({"event_live_json": '{"a": 1e400}'}, "event_live_json is not valid JSON: must not contain NaN or an infinite number (JSON has neither)"),
    ({"nsides": {}}, "'nsides': must have at least 1 entries"),
    ({"manifest_projection": ["scan_id", "scan_id"]}, "'manifest_projection': items must be unique"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "reason"), INVALID)
async def test_invalid_requests_are_refused_and_nothing_is_written(
    shim: ShimUnderTest, changes: dict[str, Any], reason: str
) -> None:
    reply = await shim.call("POST", "/scan", json_body=scan_body(**changes))
    assert reply.status == 400
    assert reply.body["error"] == "Bad Request" and reply.body["reason"] == reason, reply.body
    assert isinstance(reply.body["message"], str) and reply.body["message"]
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert listed["items"] == []
    configmaps = await shim.api.request(
        "GET", core_path("configmaps", shim.namespace), params={"labelSelector": names.PAYLOAD_LABEL}
    )
    assert configmaps["items"] == []


@pytest.mark.parametrize("refused", ["count/configmaps", f"count/{model.PLURAL}.{model.GROUP}"])
async def test_a_launch_one_of_whose_two_writes_is_refused_leaves_neither(
    shim: ShimUnderTest, refused: str
) -> None:
    """The Scan and its event are written at once: a quota refusing either leaves no trace of the other."""
    kept = await shim.launch()
    plural = refused.removeprefix("count/")
    path = core_path("configmaps", shim.namespace) if plural == "configmaps" else scan_path(shim.namespace)
    stored = str(len((await shim.api.request("GET", path))["items"]))  # the namespace's own CA among them
    quota = {"metadata": {"name": "full"}, "spec": {"hard": {refused: stored}}}  # no more
    await shim.api.request("POST", core_path("resourcequotas", shim.namespace), body=quota)

    async def counted() -> bool:
        got = await shim.api.request("GET", core_path("resourcequotas", shim.namespace, "full"))
        return bool((got.get("status") or {}).get("used", {}).get(refused) == stored)

    await eventually(counted, timeout=30)
    reply = await shim.call("POST", "/scan", json_body=scan_body())
    assert (reply.status, reply.body["reason"]) == (503, "quota exceeded"), reply.body
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert [s["metadata"]["name"] for s in listed["items"]] == [kept["scan_id"]]
    configmaps = await shim.api.request(
        "GET", core_path("configmaps", shim.namespace), params={"labelSelector": names.PAYLOAD_LABEL}
    )
    assert [c["metadata"]["name"] for c in configmaps["items"]] == [
        names.event_object_name(kept["sensor_event_id"])
    ]


async def test_integral_numbers_are_integers(shim: ShimUnderTest) -> None:
    """As in JSON Schema, 91.0 is an integer: taken as 91 wherever an integer is expected."""
    manifest = await shim.launch(
        max_pixel_reco_time=600.0, priority=7.0, nsides={"1": 2.0}, request_clusters={"osg": 3.0},
        worker_memory_bytes=1.5e9, worker_disk_bytes=float(2**63 - 1024),
    )  # fmt: skip
    request = (await shim.call("GET", f"/scan-request/{manifest['scan_id']}")).body
    got = {k: request[k] for k in ("max_pixel_reco_time", "priority", "nsides", "request_clusters")}
    assert got == {
        "max_pixel_reco_time": 600,
        "priority": 7,
        "nsides": {"1": 2},
        "request_clusters": [["osg", 3]],
    }
    assert (request["worker_memory_bytes"], request["worker_disk_bytes"]) == (1_500_000_000, 2**63 - 1024)
    assert all(
        type(v) is int
        for v in (request["priority"], request["max_pixel_reco_time"], request["worker_memory_bytes"])
    )
    spec = (await shim.kube_scan(manifest["scan_id"]))["spec"]
    assert (spec["priority"], spec["maxPixelRecoTime"], spec["workerDiskBytes"]) == (7, 600, 2**63 - 1024)


async def test_body_must_be_a_json_object(shim: ShimUnderTest) -> None:
    for data, reason in [
        (b"[1]", "request body must be a JSON object"),
        (b"{", "request body is not valid JSON"),
    ]:
        reply = await shim.call("POST", "/scan", data=data, headers={"Content-Type": "application/json"})
        assert (reply.status, reply.body["reason"]) == (400, reason)


@pytest.mark.parametrize(
    ("requested", "resolved"),
    [("latest", "4.2.10"), ("v4", "4.2.10"), ("4.1", "4.1.0"), ("4.1.0", "4.1.0"), ("V4.2.3", "4.2.3"),
     ("gcd-handling-fe8ecee", "gcd-handling-fe8ecee")],
)  # fmt: skip
async def test_tags_resolve_against_the_catalog(shim: ShimUnderTest, requested: str, resolved: str) -> None:
    manifest = await shim.launch(docker_tag=requested)
    assert (await shim.call("GET", f"/scan-request/{manifest['scan_id']}")).body["docker_tag"] == resolved


async def test_tag_catalog_directory(make_shim: MakeShim, tmp_path: Any) -> None:
    for tag in ("4.0.1", "5.0.0", "5.1.2", "feature-x"):
        (tmp_path / f"skymap_scanner:{tag}").mkdir()
    shim = await make_shim(tags=[], tag_catalog_dir=tmp_path)
    for requested, resolved in [
        ("latest", "5.1.2"),
        ("5", "5.1.2"),
        ("4", "4.0.1"),
        ("feature-x", "feature-x"),
    ]:
        manifest = await shim.launch(docker_tag=requested)
        assert (await shim.call("GET", f"/scan-request/{manifest['scan_id']}")).body["docker_tag"] == resolved
    reply = await shim.call("POST", "/scan", json_body=scan_body(docker_tag="4.2.10"))
    assert reply.body["reason"] == "argument docker_tag: image not found"


async def test_events_are_stored_once_and_shared(shim: ShimUnderTest) -> None:
    event = {"run": 7, "value": {"data": "y" * 1000}}
    first = await shim.launch(event_live_json=event)
    # A JSON string is accepted too.
    import json

    second = await shim.launch(event_live_json=json.dumps(event))
    assert first["sensor_event_id"] != second["sensor_event_id"]
    reused = await shim.launch(event_live_json=None, sensor_event_id=first["sensor_event_id"])
    assert reused["sensor_event_id"] == first["sensor_event_id"]
    for manifest in (first, second, reused):
        reply = await shim.call("GET", f"/scan/{manifest['scan_id']}/sensor-event")
        assert reply.status == 200 and reply.body == {"sensor_event": event}
    name = names.event_object_name(first["sensor_event_id"])
    cm = await shim.api.request("GET", core_path("configmaps", shim.namespace, name))
    assert cm["immutable"] and set(cm["binaryData"]) == {payloads.DATA_KEY}
    # Stored beside the first Scan, named for it (the operator makes it an owner); the reuse joined.
    assert cm["metadata"]["annotations"] == {names.STORED_FOR_ANNOTATION: first["scan_id"]}
    assert [o["name"] for o in cm["metadata"]["ownerReferences"]] == [reused["scan_id"]]
    assert payloads.decode(cm) == event


async def test_an_event_too_large_even_compressed_is_413(shim: ShimUnderTest) -> None:
    noise = base64.b64encode(os.urandom(1_100_000)).decode()
    reply = await shim.call("POST", "/scan", json_body=scan_body(event_live_json={"data": noise}))
    assert reply.status == 413 and reply.body["reason"] == "sensor event too large"
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert listed["items"] == []


async def test_a_request_too_large_for_its_scan_is_413(shim: ShimUnderTest) -> None:
    """The Scan holds the request: a megabyte of it (40,000 cluster requests) is a 413 naming the field,
    not a refusal by etcd that came back as a retryable 503."""
    reply = await shim.call("POST", "/scan", json_body=scan_body(request_clusters=[["osg", 1]] * 40_000))
    assert (reply.status, reply.body["reason"]) == (413, "'request_clusters' too large"), reply.body
    listed = await shim.api.request("GET", scan_path(shim.namespace))
    assert listed["items"] == []
    # The largest valid request fits: 25 environment variables of 4096 characters.
    env = {f"SKYSCAN_PROGRESS_VAR_{i}": "v" * 4096 for i in range(25)}
    assert (
        await shim.call("POST", "/scan", json_body=scan_body(scanner_server_env_from_user=env))
    ).status == 200


async def test_a_deployment_widens_the_scanner_env_and_the_worker_bound(make_shim: MakeShim) -> None:
    """SKYSCAN_SCANNER_ENV_ALLOWED adds names and prefixes (never a reserved one); SKYSCAN_MAX_N_WORKERS
    moves the bound on one request's workers, up to the CRD's."""
    default = await make_shim()
    env = {"OMP_NUM_THREADS": 4, "MKL_NUM_THREADS": 2, "SKYSCAN_LOG": "DEBUG"}
    reply = await default.call("POST", "/scan", json_body=scan_body(scanner_server_env_from_user=env))
    assert (reply.status, reply.body["reason"]) == (
        400,
        "cannot set 'OMP_NUM_THREADS' in the scanner's environment",
    )
    widened = await make_shim(scanner_env_allowed=["OMP_*", "MKL_NUM_THREADS", "LD_*"], max_n_workers=50_000)
    manifest = await widened.launch(scanner_server_env_from_user=env, request_clusters={"osg": 50_000})
    spec = (await widened.kube_scan(manifest["scan_id"]))["spec"]
    assert spec["scannerServerEnvFromUser"] == env and spec["requestClusters"] == [
        {"location": "osg", "nWorkers": 50_000}
    ]
    for changes, reason in [
        (
            {"scanner_server_env_from_user": {"LD_PRELOAD": "/tmp/x.so"}},
            "'scanner_server_env_from_user': cannot set 'LD_PRELOAD'",
        ),
        ({"scanner_server_env_from_user": {"OMPX": 1}}, "cannot set 'OMPX' in the scanner's environment"),
        ({"request_clusters": {"osg": 50_001}}, "'request_clusters.osg': must be no more than 50000"),
    ]:
        reply = await widened.call("POST", "/scan", json_body=scan_body(**changes))
        assert reply.status == 400 and reply.body["reason"].startswith(reason), reply.body
