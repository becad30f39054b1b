"""The worker hand-off across the whole stack: the scanner Pod's sidecar (the real program, run by the
scanner simulator) uploads startup.json through the shim, and the WMS simulator's workers fetch it
through the presigned URL of their init command before they start; a tampered or expired URL is 403."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from skyscan import names, presign
from skyscan.io import kube
from skyscan.io.kube import core_path
from skyscan_local import stack as localstack
from skyscan_local.task_manager_simulator import startup_url_of
from tests.e2e.conftest import Rest, Stack


async def sim(stack: Stack, path: str) -> Any:
    async with httpx.AsyncClient(base_url=stack.wms_url, timeout=10) as http:
        r = await http.get(path)
        r.raise_for_status()
        return r.json()


async def test_a_scan_completes_through_the_presigned_hand_off(rest: Rest, stack: Stack) -> None:
    scan_id = await rest.launch()
    await rest.wait_status(scan_id, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT", timeout=90)
    workflow_id = (await rest.ok("GET", f"/scan/{scan_id}/wms/workflow-id"))["workflow_id"]

    # The workers started only after fetching the file through their presigned URL.
    fetches = [f for f in (await sim(stack, "/_sim/fetches"))["fetches"] if f["workflow_id"] == workflow_id]
    ok = [f for f in fetches if f["status"] == 200]
    assert ok, fetches
    assert 100_000 <= ok[0]["bytes"] <= 530_000  # the simulated scanner's realistic startup.json
    assert all(f["status"] in (200, 404) for f in fetches), fetches  # 404: not uploaded yet, retried
    log = localstack.tail(stack.settings.dir / "logs" / "wms-simulator.log", 100_000)
    assert f"worker fetched startup.json for {workflow_id} via presigned URL: 200" in log

    # The file is stored as the scan's payload object.
    async with await kube.connect(stack.kubeconfig) as api:
        cm = await api.request(
            "GET", core_path("configmaps", stack.namespace, names.startup_object_name(scan_id))
        )
        job = await api.request(
            "GET", kube.path("batch/v1", "jobs", stack.namespace, names.job_name(scan_id))
        )
    assert cm["metadata"]["labels"][names.PAYLOAD_LABEL] == "startup"
    assert cm["metadata"]["ownerReferences"][0]["name"] == scan_id
    (sidecar,) = job["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["command"] == ["skyscan-sidecar"]
    auth = next(e for e in sidecar["env"] if e["name"] == "SKYSCAN_SKYDRIVER_AUTH")
    assert "value" not in auth  # a reference to the scanner's Secret, never the token itself

    # The URL the operator gave the workers, over real HTTP with no credential.
    (workflow,) = [
        w for w in (await sim(stack, "/_sim/workflows"))["workflows"] if w["workflow_id"] == workflow_id
    ]
    url = startup_url_of(workflow["request"]["tasks"][0]["init_args"])
    assert url is not None
    split = urlsplit(url)
    assert split.path == f"/scan/{scan_id}/startup.json"
    query = {k: v[0] for k, v in parse_qs(split.query).items()}
    base = f"{split.scheme}://{split.netloc}{split.path}"
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(url)
        assert r.status_code == 200
        assert len(r.content) == ok[0]["bytes"] and "GCDQp_packet" in json.loads(r.content)

        flipped = query["signature"][:-1] + ("0" if query["signature"][-1] != "0" else "1")
        key = presign.check_key((stack.settings.dir / localstack.PRESIGN_KEY_FILE).read_bytes())
        past = int(time.time()) - 5
        other_scan = await rest.launch()  # a valid URL of another scan does not open this one
        refused = [
            {**query, "signature": flipped},  # tampered signature
            {**query, "expires": str(int(query["expires"]) + 3600)},  # tampered expiry
            {"expires": str(past), "signature": presign.sign(key, scan_id, past)},  # signed, but expired
            {"expires": query["expires"], "signature": presign.sign(key, other_scan, int(query["expires"]))},
        ]
        for params in refused:
            r = await http.get(base, params=params)
            assert r.status_code == 403, (params, r.text)
            assert set(r.json()) == {"error", "reason", "message"}
