"""skyscan.io.kube against the real API server: CRUD on Scans, raw and metadata-only reads, pages,
a watch, and the API server's errors as ApiError."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from skyscan import model, names
from skyscan.io import kube
from skyscan.io.kube_errors import KubeError
from tests.conftest import Cluster
from tests.unit.test_crd import minimal_spec

METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def scan(name: str) -> dict[str, Any]:
    return {
        "apiVersion": model.API_VERSION,
        "kind": "Scan",
        "metadata": {"name": name},
        "spec": minimal_spec(),
    }


@pytest.fixture
async def scratch(cluster: Cluster) -> AsyncIterator[tuple[kube.Kube, str]]:
    """A client on the cluster's kubeconfig and a namespace of its own."""
    async with await kube.connect(cluster.kubeconfig) as client:
        name = f"k-{secrets.token_hex(4)}"
        await client.request("POST", kube.core_path("namespaces"), body={"metadata": {"name": name}})
        yield client, name
        await client.request("DELETE", kube.core_path("namespaces", name=name))


async def test_scan_round_trip(scratch: tuple[kube.Kube, str]) -> None:
    client, ns = scratch
    created = await client.request("POST", kube.scan_path(ns), body=scan("s-1"))
    assert created["metadata"]["name"] == "s-1" and created["spec"]["priority"] == 0  # defaulted
    patched = await client.request(
        "PATCH", kube.scan_path(ns, "s-1", "status"), body={"status": {"state": "PENDING"}},
        content_type=kube.MERGE_PATCH,
    )  # fmt: skip
    assert patched["status"]["state"] == "PENDING"
    raw = await client.read("GET", kube.scan_path(ns, "s-1"))
    assert raw.startswith(b"{") and b'"PENDING"' in raw
    meta = await client.request("GET", kube.scan_path(ns, "s-1"), accept=METADATA)
    assert meta["kind"] == "PartialObjectMetadata" and "spec" not in meta
    await client.request("DELETE", kube.scan_path(ns, "s-1"))
    with pytest.raises(KubeError) as caught:
        await client.request("GET", kube.scan_path(ns, "s-1"))
    assert caught.value.status == 404 and caught.value.message == 'scans.skyscan.io "s-1" not found'


async def test_conflict_and_invalid_are_api_errors(scratch: tuple[kube.Kube, str]) -> None:
    client, ns = scratch
    await client.request("POST", kube.scan_path(ns), body=scan("s-1"))
    with pytest.raises(KubeError) as caught:
        await client.request("POST", kube.scan_path(ns), body=scan("s-1"))
    assert caught.value.status == 409
    bad = scan("s-2")
    bad["spec"]["priority"] = "high"
    with pytest.raises(KubeError) as caught:
        await client.request("POST", kube.scan_path(ns), body=bad)
    assert caught.value.status == 422 and "priority" in caught.value.message


async def test_list_scans_in_pages(scratch: tuple[kube.Kube, str]) -> None:
    client, ns = scratch
    for i in range(5):
        await client.request("POST", kube.scan_path(ns), body=scan(f"s-{i}"))
    pages = [[s["metadata"]["name"] for s in page] async for page in kube.list_scans(client, ns, page_size=2)]
    assert pages == [["s-0", "s-1"], ["s-2", "s-3"], ["s-4"]]


async def test_watch_sees_changes_and_ends_with_its_timeout(scratch: tuple[kube.Kube, str]) -> None:
    client, ns = scratch
    listed = await client.request("GET", kube.scan_path(ns))
    events: list[tuple[str, str]] = []

    async def follow() -> None:
        params = {"resourceVersion": listed["metadata"]["resourceVersion"], "timeoutSeconds": 3}
        async for event in client.watch(kube.scan_path(ns), params):
            events.append((event["type"], event["object"]["metadata"]["name"]))

    watching = asyncio.create_task(follow())
    await client.request("POST", kube.scan_path(ns), body=scan("s-1"))
    await client.request("DELETE", kube.scan_path(ns, "s-1"))
    await asyncio.wait_for(watching, timeout=20)  # the API server ends it after timeoutSeconds
    assert events == [("ADDED", "s-1"), ("DELETED", "s-1")]


async def test_a_too_old_watch_is_an_error_event(scratch: tuple[kube.Kube, str]) -> None:
    client, ns = scratch
    events = [
        e async for e in client.watch(kube.scan_path(ns), {"resourceVersion": "1", "timeoutSeconds": 5})
    ]
    assert events and events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


async def test_apply_crd_replaces_an_existing_one(scratch: tuple[kube.Kube, str]) -> None:
    from skyscan import crd

    client, _ = scratch
    await kube.apply_crd(client, crd.build_crd(), names.INSTALL_MANAGER)  # installed: applied again
    got = await client.request(
        "GET", kube.path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=crd.CRD_NAME)
    )
    assert kube.is_established(got)
