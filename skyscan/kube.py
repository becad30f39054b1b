"""Thin async helpers over kubernetes_asyncio: building a client, installing the CRD."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from skyscan import model

# CustomObjectsApi arguments naming the Scan resource, and the patch type our writes use.
SCAN_RESOURCE = {"group": model.GROUP, "version": model.VERSION, "plural": model.PLURAL}
MERGE_PATCH = "application/merge-patch+json"
# kubernetes_asyncio's read buffer, kept when its session is replaced: a watch event can carry an
# object up to etcd's request limit (1.5 MiB).
READ_BUFSIZE = 2**21


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
    api = client.ApiClient(configuration=cfg)
    without_trust_env(api)
    return api


def without_trust_env(api: client.ApiClient) -> None:
    """Swap the client's aiohttp session for one that ignores proxy variables and ~/.netrc.

    kubernetes_asyncio opens its session with `trust_env=True`, which looks netrc up in a thread on
    every request; the API server is reached directly and authenticates by token or certificate.
    The new session takes over the old one's connector (TLS settings, connection limit)."""
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )
    old.detach()


async def list_scans(
    api: client.ApiClient, namespace: str, page_size: int = 500
) -> AsyncIterator[list[dict[str, Any]]]:
    """The Scans of a namespace, a page at a time (so no reader holds them all at once)."""
    objects = client.CustomObjectsApi(api)
    token = ""
    while True:
        page = await objects.list_namespaced_custom_object(
            **SCAN_RESOURCE, namespace=namespace, limit=page_size, _continue=token or None
        )
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return


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
