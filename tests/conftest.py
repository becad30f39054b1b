"""Shared fixtures: one real cluster per test session, a fresh namespace per test.

`SKYSCAN_TEST_KUBECONFIG` points the suite at any existing cluster (kind, a real one); otherwise
the local control plane is started from the cached binaries and torn down at the end.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from skyscan import install, kube
from skyscan_local import control_plane as localcluster
from tests.helpers import eventually


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    local: localcluster.ClusterState | None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get("SKYSCAN_TEST_KUBECONFIG")
    if external:
        asyncio.run(install.install(external))
        yield Cluster(kubeconfig=external, local=None)
        return
    workdir = tmp_path_factory.mktemp("cluster")
    state = localcluster.start(workdir, tie_to_parent=True)
    try:
        asyncio.run(install.install(state.kubeconfig))
        yield Cluster(kubeconfig=state.kubeconfig, local=state)
    finally:
        localcluster.stop(Path(state.workdir))


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[client.ApiClient]:
    api = await kube.api_client(cluster.kubeconfig)
    async with api:
        yield api


@pytest.fixture
async def namespace(api: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace, ready for Pods (its default service account exists)."""
    core = client.CoreV1Api(api)
    name = f"t-{secrets.token_hex(4)}"
    await core.create_namespace({"metadata": {"name": name, "labels": {"skyscan.io/test": "true"}}})
    await eventually(lambda: core.read_namespaced_service_account("default", name), timeout=30)
    await install.ensure_scanner_account(api, name)
    yield name
    try:
        await core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
