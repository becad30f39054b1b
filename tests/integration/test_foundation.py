"""The ground holds: the CRD is served and validates, Jobs run through kwok, owners collect garbage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from skyscan import crd
from skyscan.io import kube
from skyscan.io.kube import Kube, core_path, scan_path
from skyscan.io.kube_errors import KubeError
from skyscan_local import control_plane as localcluster
from tests.helpers import eventually
from tests.unit.test_crd import minimal_spec

MERGE = "application/merge-patch+json"


def scan(name: str, **spec_changes: Any) -> dict[str, Any]:
    return {
        "apiVersion": crd.model.API_VERSION,
        "kind": "Scan",
        "metadata": {"name": name},
        "spec": minimal_spec(**spec_changes),
    }


async def test_crd_is_established_with_printer_columns(api: Kube) -> None:
    got = await api.request(
        "GET", kube.path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=crd.CRD_NAME)
    )
    assert kube.is_established(got)
    version = got["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:3] == ["State", "Priority", "Position"] and "Algo" in columns
    assert got["spec"]["names"]["shortNames"] == ["scn"]


SCALARS: dict[str, Any] = {"N": 3, "F": 1.5, "B": False, "Z": None}


async def test_valid_scan_is_accepted_with_defaults(api: Kube, namespace: str) -> None:
    await api.request(
        "POST",
        scan_path(namespace),
        body=scan(
            "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0",
            classifiers={"origin": "alert", "n": 3, "ok": True, "z": None},
            scannerServerEnvFromUser={"SKYSCAN_URL": "https://example.test/" + "p" * 200, **SCALARS},
        ),
    )
    got = await api.request("GET", scan_path(namespace, "0194d2a3b4cx4a1b2c3d4e5f6a7b8c9d0"))
    spec = got["spec"]
    assert spec["scannerServerMemoryBytes"] == 1_024_000_000
    assert spec["workerMemoryBytes"] == 8_000_000_000 and spec["workerDiskBytes"] == 1_000_000_000
    assert spec["priority"] == 0 and spec["deleted"] is False
    assert spec["classifiers"]["n"] == 3 and spec["classifiers"]["ok"] is True
    assert {k: spec["scannerServerEnvFromUser"][k] for k in SCALARS} == SCALARS  # a pattern: strings only


async def test_status_is_a_subresource(api: Kube, namespace: str) -> None:
    await api.request("POST", scan_path(namespace), body=scan("s1"))
    await api.request(
        "PATCH",
        scan_path(namespace, "s1", "status"),
        body={"status": {"state": "PENDING", "observedGeneration": 1}},
        content_type=MERGE,
    )
    # A status written through the main resource is ignored.
    await api.request(
        "PATCH", scan_path(namespace, "s1"), body={"status": {"state": "HACKED"}}, content_type=MERGE
    )
    got = await api.request("GET", scan_path(namespace, "s1"))
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
        # The scanner's command line: kubectl is held to the REST grammar.
        ({"recoAlgo": "millipede_wilks --cache-dir /etc"}, None, "spec.recoAlgo: Invalid value"),
        ({"nsides": {"8 --x": 0}}, None, "nsides keys are integers from 1 to 8192, written plainly"),
        ({"nsides": {"9000": 0}}, None, "nsides keys are integers from 1 to 8192, written plainly"),
        ({"nsides": {str(n): 0 for n in range(1, 18)}}, None, "spec.nsides: Too many: 17"),
        ({"requestClusters": [{"location": "osg", "nWorkers": 100001}]}, None, "requestClusters[0].nWorkers"),
        ({"nsides": {"8": 0, "64": 805306369}}, None, "spec.nsides.64: Invalid value"),
        # The scanner's environment: values an exec can carry (names: the model's, CEL cannot see the map).
        ({"scannerServerEnvFromUser": {"A": "\x00"}}, None, "spec.scannerServerEnvFromUser.A: Invalid"),
    ],
)
async def test_invalid_scans_are_rejected_naming_the_field(
    api: Kube, namespace: str, changes: dict[str, Any], drop: str | None, expected: str
) -> None:
    body = scan("bad", **changes)
    if drop:
        del body["spec"][drop]
    with pytest.raises(KubeError) as err:
        await api.request("POST", scan_path(namespace), body=body)
    assert err.value.status == 422
    assert expected in json.loads(err.value.body)["message"]


async def test_a_job_runs_to_complete_through_kwok(api: Kube, namespace: str) -> None:
    phases: list[str] = []
    nodes: set[str] = set()

    # Watched from the list's version, so no phase the pod passes through before the watch is
    # established (a slow start beside the other workers) is missed.
    listed = await api.request("GET", core_path("pods", namespace))
    since = {"resourceVersion": listed["metadata"]["resourceVersion"], "timeoutSeconds": 60}

    async def record_pods() -> None:
        async for event in api.watch(core_path("pods", namespace), since):
            pod = event["object"]
            nodes.add(pod["spec"].get("nodeName") or "")
            phase = (pod.get("status") or {}).get("phase")
            if phase and (not phases or phases[-1] != phase):
                phases.append(phase)
            if phase == "Succeeded":
                return

    recorder = asyncio.create_task(record_pods())
    await api.request(
        "POST",
        kube.path("batch/v1", "jobs", namespace),
        body={
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
        job = await api.request("GET", kube.path("batch/v1", "jobs", namespace, "hello", "status"))
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    await eventually(complete, timeout=60)
    await asyncio.wait_for(recorder, timeout=30)
    assert localcluster.NODE_NAME in nodes
    assert phases[-2:] == ["Running", "Succeeded"], phases


async def test_deleting_an_owner_collects_what_it_owns(api: Kube, namespace: str) -> None:
    owner = await api.request("POST", scan_path(namespace), body=scan("owner"))
    await api.request(
        "POST",
        core_path("configmaps", namespace),
        body={
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
    await api.request("DELETE", scan_path(namespace, "owner"))

    async def gone() -> bool:
        try:
            await api.request("GET", core_path("configmaps", namespace, "owned"))
        except KubeError as e:
            return e.status == 404
        return False

    assert await eventually(gone, timeout=60)
