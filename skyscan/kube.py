"""Thin async helpers over kubernetes_asyncio: building a client, installing the CRD."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from skyscan import model

# CustomObjectsApi arguments naming the Scan resource, and the patch type our writes use.
SCAN_RESOURCE = {"group": model.GROUP, "version": model.VERSION, "plural": model.PLURAL}
MERGE_PATCH = "application/merge-patch+json"


async def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client for the given kubeconfig, else in-cluster, else the default kubeconfig."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


def is_established(crd: Any) -> bool:
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


async def apply_crd(api: client.ApiClient, body: dict[str, Any], timeout: float = 60.0) -> None:
    """Create or replace a CRD and wait until the API server serves it."""
    ext = client.ApiextensionsV1Api(api)
    name = body["metadata"]["name"]
    try:
        await ext.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
        current = await ext.read_custom_resource_definition(name)
        replacement = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version},
        }
        await ext.replace_custom_resource_definition(name, replacement)
    deadline = time.monotonic() + timeout
    while not is_established(await ext.read_custom_resource_definition(name)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout}s")
        await asyncio.sleep(0.2)
