"""manifests/argocd: the kustomization that adds the Scan health check to Argo CD's argocd-cm, applied
server-side to a real API server, adds that one key (the shipped Lua, byte for byte) and leaves the
keys Argo CD's own install owns alone."""

from __future__ import annotations

import asyncio
import os

from skyscan.io.kube import Kube, core_path
from tests.conftest import Cluster
from tests.gitops import HEALTH_LUA

KUBECTL = os.environ.get("KUBECTL", "kubectl")
KEY = "resource.customizations.health.skyscan.io_Scan"


async def test_the_kustomization_adds_the_health_check_to_argocd_cm(
    cluster: Cluster, api: Kube, namespace: str
) -> None:
    installed = {
        "metadata": {"name": "argocd-cm", "labels": {"app.kubernetes.io/name": "argocd-cm"}},
        "data": {"url": "https://argocd.example.org"},
    }  # fmt: skip  (as Argo CD's install leaves it)
    await api.request("POST", core_path("configmaps", namespace), body=installed)
    process = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", cluster.kubeconfig, "-n", namespace, "apply", "--server-side",
        "--field-manager=skyscan", "-k", str(HEALTH_LUA.parent),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()
    cm = await api.request("GET", core_path("configmaps", namespace, "argocd-cm"))
    assert cm["data"] == {"url": "https://argocd.example.org", KEY: HEALTH_LUA.read_text()}
    assert cm["metadata"]["labels"] == {
        "app.kubernetes.io/name": "argocd-cm",
        "app.kubernetes.io/part-of": "argocd",
    }
