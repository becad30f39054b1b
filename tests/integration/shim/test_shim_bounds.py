"""Integer bounds: the REST shim and the API server (kubectl) refuse the same numbers, naming the field;
add-workers takes an integral number as an integer and refuses more workers than a request may ask."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from skyscan import model
from skyscan.io.kube import scan_path
from skyscan.io.kube_errors import KubeError
from tests.integration.shim.conftest import ShimUnderTest, scan_body
from tests.integration.shim.test_shim_find_wms import play_operator_for_workers

MAX = model.INTEGER_MAX


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("priority", MAX, False),
        ("priority", MAX + 1, True),
        ("priority", model.INTEGER_MIN, False),
        ("maxPixelRecoTime", MAX + 1, True),
        ("workerMemoryBytes", MAX, False),
        ("workerMemoryBytes", 2**63, True),
    ],
)
async def test_the_api_server_holds_the_same_bounds(
    shim: ShimUnderTest, field: str, value: int, refused: bool
) -> None:
    """What kubectl sends meets the CRD's bounds, which are the REST models' (one source)."""
    spec: dict[str, Any] = (await shim.kube_scan((await shim.launch())["scan_id"]))["spec"]
    body = {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {"name": f"kubectl-{field.lower()}"},
        "spec": {**spec, field: value},
    }
    if not refused:
        created = await shim.api.request("POST", scan_path(shim.namespace), body=body)
        assert created["spec"][field] == value
        return
    with pytest.raises(KubeError) as e:
        await shim.api.request("POST", scan_path(shim.namespace), body=body)
    assert e.value.status == 422 and f"spec.{field}" in e.value.message
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in field)
    rest = await shim.call("POST", "/scan", json_body=scan_body(**{snake: value}))
    assert rest.status == 400 and rest.body["reason"].startswith(f"'{snake}': must be no more than {MAX}")


async def test_add_workers_integers(shim: ShimUnderTest) -> None:
    scan_id = (await shim.launch())["scan_id"]
    path = f"/scan/{scan_id}/actions/add-workers"
    wf = {"workflow_id": "wf", "wms_address": "a"}
    await shim.call("POST", f"/scan/{scan_id}/wms/workflow-id", as_="system", json_body=wf)
    for n_workers, reason in [
        (100_001, f"'n_workers': must be no more than {model.N_WORKERS_MAX}"),  # not forwarded to the WMS
        (10_001, "'n_workers': must be no more than 10000"),  # the deployment's bound (SKYSCAN_MAX_N_WORKERS)
        (2**70, f"'n_workers': must be no more than {model.N_WORKERS_MAX}"),
        (91.5, "'n_workers': must be type 'integer' (int)"),
        (True, "'n_workers': must be type 'integer' (int)"),
        ("91", "'n_workers': must be type 'integer' (int)"),
    ]:
        reply = await shim.call("POST", path, json_body={"n_workers": n_workers, "cluster_location": "osg"})
        assert (reply.status, reply.body["error"], reply.body["reason"]) == (400, "Bad Request", reason)
    assert not (await shim.kube_scan(scan_id))["spec"].get("workerRequests")  # nothing asked

    operator = asyncio.create_task(play_operator_for_workers(shim, scan_id, "Succeeded"))
    reply = await shim.call("POST", path, json_body={"n_workers": 91.0, "cluster_location": "osg"})
    await operator
    assert (reply.status, reply.body) == (200, {"taskforce_uuid": "tf-123", "n_workers": 91})
    (ask,) = (await shim.kube_scan(scan_id))["spec"]["workerRequests"]
    assert type(ask["nWorkers"]) is int and ask["nWorkers"] == 91
