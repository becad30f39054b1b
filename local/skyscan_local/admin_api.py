"""The local cluster's API as its admin (the kubeconfig and CA in the cluster's directory): server-side
apply and get of one object at its resource path."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml


class Api:
    """The admin's client of the cluster in `cluster_dir`."""

    def __init__(self, cluster_dir: Path) -> None:
        config = yaml.safe_load((cluster_dir / "kubeconfig").read_text())
        self.http = httpx.Client(
            base_url=config["clusters"][0]["cluster"]["server"],
            verify=ssl.create_default_context(cafile=str(cluster_dir / "ca.crt")),
            headers={"Authorization": f"Bearer {config['users'][0]['user']['token']}"},
            timeout=10,
        )

    def apply(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of one object at its resource path."""
        got = self.http.patch(
            path,
            content=json.dumps(obj),
            params={"fieldManager": "skyscan-local", "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        got.raise_for_status()
        return dict(got.json())

    def get(self, path: str) -> dict[str, Any] | None:
        got = self.http.get(path)
        if got.status_code == 404:
            return None
        got.raise_for_status()
        return dict(got.json())


def resource_path(obj: dict[str, Any]) -> str:
    kind, name = obj["kind"], obj["metadata"]["name"]
    group = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    plural = {"Deployment": "deployments", "Service": "services", "Secret": "secrets",
              "NetworkPolicy": "networkpolicies", "Namespace": "namespaces"}[kind]  # fmt: skip
    ns = obj["metadata"].get("namespace")
    return f"{group}/namespaces/{ns}/{plural}/{name}" if ns else f"{group}/{plural}/{name}"
