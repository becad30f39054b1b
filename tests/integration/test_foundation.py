"""The ground holds: the CRD is served and validates, Jobs run through kwok, owners collect garbage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from skyscan import crd
from skyscan_local import control_plane as localcluster
from tests.helpers import SCAN, eventually
from tests.unit.test_crd import minimal_spec

MERGE = "application/merge-patch+json"


def scan(name: str, **spec_changes: Any) -> dict[str, Any]:
    return {
        "apiVersion": crd.model.API_VERSION,
        "kind": "Scan",
        "metadata": {"name": name},
        "spec": minimal_spec(**spec_changes),
    }


async def test_crd_is_established_with_printer_columns(api: client.ApiClient) -> None:
    got = await client.ApiextensionsV1Api(api).read_custom_resource_definition(crd.CRD_NAME)
    assert any(c.type == "Established" and c.status == "True" for c in got.status.conditions)
    version = got.spec.versions[0]
    assert version.name == "v1alpha1" and version.subresources.status == {}
    assert [c.name for c in version.additional_printer_columns][:3] == ["State", "Priority", "Algo"]
    assert got.spec.names.short_names == ["scn"]


async def test_valid_scan_is_accepted_with_defaults(api: client.ApiClient, namespace: str) -> None:
    objs = client.CustomObjectsApi(api)
    await objs.create_namespaced_custom_object(
        **SCAN,
        namespace=namespace,
        body=scan(
            "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0",
            classifiers={"origin": "alert", "n": 3, "ok": True, "z": None},
            scannerServerEnvFromUser={"SKYSCAN_URL": "https://example.test/" + "p" * 200},
        ),
    )
    got = await objs.get_namespaced_custom_object(
        **SCAN, namespace=namespace, name="0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0"
    )
    spec = got["spec"]
    assert spec["scannerServerMemoryBytes"] == 1_024_000_000
    assert spec["workerMemoryBytes"] == 8_000_000_000 and spec["workerDiskBytes"] == 1_000_000_000
    assert spec["priority"] == 0 and spec["deleted"] is False
    assert spec["classifiers"]["n"] == 3 and spec["classifiers"]["ok"] is True


async def test_status_is_a_subresource(api: client.ApiClient, namespace: str) -> None:
    objs = client.CustomObjectsApi(api)
    await objs.create_namespaced_custom_object(**SCAN, namespace=namespace, body=scan("s1"))
    await objs.patch_namespaced_custom_object_status(
        **SCAN,
        namespace=namespace,
        name="s1",
        body={"status": {"state": "PENDING", "observedGeneration": 1}},
        _content_type=MERGE,
    )
    # A status written through the main resource is ignored.
    await objs.patch_namespaced_custom_object(
        **SCAN, namespace=namespace, name="s1", body={"status": {"state": "HACKED"}}, _content_type=MERGE
    )
    got = await objs.get_namespaced_custom_object(**SCAN, namespace=namespace, name="s1")
    assert got["status"]["state"] == "PENDING"


@pytest.mark.parametrize(
    ("changes", "drop", "expected"),
    [
        (
            {"classifiers": {"origin": "x" * 26}},
            None,
            "spec.classifiers.origin: Too long: may not be more than 25",
        ),
        (
            {"classifiers": {"tags": ["a", "b"]}},
            None,
            "spec.classifiers.tags: Too many: 2: must have at most 0 items",
        ),
        ({"classifiers": {"tags": []}}, None, "spec.classifiers.tags in body should have at least 1 items"),
        ({"scannerServerEnvFromUser": {"X": {"a": 1}}}, None, "spec.scannerServerEnvFromUser.X: Too many: 1"),
        ({"scannerServerEnvFromUser": {"X": "u" * 4097}}, None, "spec.scannerServerEnvFromUser.X: Too long"),
        ({}, "recoAlgo", "spec.recoAlgo: Required value"),
        ({"workerMemoryBytes": -1}, None, "spec.workerMemoryBytes: Invalid value: -1"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 0}]}, None, "spec.requestClusters[0].nWorkers"),
        ({"realOrSimulatedEvent": "maybe"}, None, 'spec.realOrSimulatedEvent: Unsupported value: "maybe"'),
        ({"predictiveScanningThreshold": 1.5}, None, "spec.predictiveScanningThreshold: Invalid value"),
        ({"classifiers": {f"k{i}": i for i in range(26)}}, None, "spec.classifiers: Too many: 26"),
    ],
)
async def test_invalid_scans_are_rejected_naming_the_field(
    api: client.ApiClient, namespace: str, changes: dict[str, Any], drop: str | None, expected: str
) -> None:
    body = scan("bad", **changes)
    if drop:
        del body["spec"][drop]
    with pytest.raises(ApiException) as err:
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            **SCAN, namespace=namespace, body=body
        )
    assert err.value.status == 422
    assert expected in json.loads(err.value.body)["message"]


async def test_a_job_runs_to_complete_through_kwok(api: client.ApiClient, namespace: str) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    phases: list[str] = []
    nodes: set[str] = set()

    async def record_pods() -> None:
        async with watch.Watch().stream(core.list_namespaced_pod, namespace, timeout_seconds=60) as stream:
            async for event in stream:
                pod = event["object"]
                nodes.add(pod.spec.node_name or "")
                if pod.status.phase and (not phases or phases[-1] != pod.status.phase):
                    phases.append(pod.status.phase)
                if pod.status.phase == "Succeeded":
                    return

    recorder = asyncio.create_task(record_pods())
    await batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "hello"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}
                },
            },
        },
    )

    async def complete() -> bool:
        job = await batch.read_namespaced_job_status("hello", namespace)
        return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])

    await eventually(complete, timeout=60)
    await asyncio.wait_for(recorder, timeout=30)
    assert localcluster.NODE_NAME in nodes
    assert phases[-2:] == ["Running", "Succeeded"], phases


async def test_deleting_an_owner_collects_what_it_owns(api: client.ApiClient, namespace: str) -> None:
    objs, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    owner = await objs.create_namespaced_custom_object(**SCAN, namespace=namespace, body=scan("owner"))
    await core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "owned",
                "ownerReferences": [
                    {
                        "apiVersion": crd.model.API_VERSION,
                        "kind": "Scan",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"k": "v"},
        },
    )
    await objs.delete_namespaced_custom_object(**SCAN, namespace=namespace, name="owner")

    async def gone() -> bool:
        try:
            await core.read_namespaced_config_map("owned", namespace)
        except ApiException as e:
            return e.status == 404
        return False

    assert await eventually(gone, timeout=60)
