"""Audit: no Job or Pod in a namespace carries a credential that works on any scan but its own.

    python tools/identity_audit.py --namespace skyscan --url $SKYSCAN_URL [--kubeconfig PATH]

Reads `kubectl get jobs,pods -o json`, collects every credential a container is handed (literal env
values, and the Secret keys env entries reference, read with the caller's kubectl rights), then tries
each against the shim: a read and an empty manifest PATCH on every scan of the namespace, and a route
that belongs to no scan. A credential may work only on the scan named by its object's
`skyscan.io/scan-id` label. Prints one line per credential; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

SCAN_LABEL = "skyscan.io/scan-id"
MIN_SECRET_LENGTH = 16  # shorter literal values (flags, numbers, paths) are not credentials


@dataclass(frozen=True)
class Credential:
    where: str  # e.g. "pod/skyscan-abc-xyz container scanner env SKYSCAN_SKYDRIVER_AUTH"
    owner: str | None  # the scan the object belongs to
    token: str


def kubectl(kubeconfig: str | None, *args: str) -> Any:
    """`kubectl ... -o json`; None for an object that does not exist."""
    cmd = ["kubectl", *(["--kubeconfig", kubeconfig] if kubeconfig else []), *args, "-o", "json"]
    cmd.append("--ignore-not-found")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return json.loads(out) if out.strip() else None


def pod_specs(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]


def credentials(kubeconfig: str | None, namespace: str) -> Iterator[Credential]:
    secrets: dict[str, dict[str, str]] = {}
    for obj in kubectl(kubeconfig, "-n", namespace, "get", "jobs,pods")["items"]:
        owner = (obj["metadata"].get("labels") or {}).get(SCAN_LABEL)
        spec = pod_specs(obj)
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            for env in container.get("env") or []:
                where = f"{obj['kind'].lower()}/{obj['metadata']['name']} {container['name']} {env['name']}"
                if len(env.get("value") or "") >= MIN_SECRET_LENGTH:
                    yield Credential(where, owner, env["value"])
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    if ref["name"] not in secrets:  # a deleted Secret (a revoked credential) holds none
                        secret = kubectl(kubeconfig, "-n", namespace, "get", "secret", ref["name"]) or {}
                        secrets[ref["name"]] = secret.get("data") or {}
                    raw = secrets[ref["name"]].get(ref["key"])
                    if raw:
                        token = base64.b64decode(raw).decode()
                        yield Credential(f"{where} (Secret {ref['name']})", owner, token)


def works(http: httpx.Client, token: str, method: str, path: str, body: Any = None) -> bool:
    reply = http.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
    return reply.is_success


def audit(kubeconfig: str | None, namespace: str, url: str) -> tuple[list[str], list[str]]:
    """(lines, violations)"""
    scans = [s["metadata"]["name"] for s in kubectl(kubeconfig, "-n", namespace, "get", "scans")["items"]]
    lines, violations = [], []
    seen: set[str] = set()
    with httpx.Client(base_url=url, timeout=30) as http:
        for cred in credentials(kubeconfig, namespace):
            if cred.token in seen:
                continue
            seen.add(cred.token)
            own = []
            for scan in scans:
                ok = works(http, cred.token, "GET", f"/scan/{scan}/manifest?no_redirect=true") or works(
                    http, cred.token, "PATCH", f"/scan/{scan}/manifest", {}
                )
                if ok and scan != cred.owner:
                    violations.append(f"{cred.where}: works on scan {scan}, which is not its own")
                own += [scan] if ok else []
            if works(http, cred.token, "GET", "/scans/backlog"):
                violations.append(f"{cred.where}: works on /scans/backlog")
            lines.append(f"{cred.where}: works on {own or 'nothing'}")
    return lines, violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--url", required=True, help="the shim's base URL")
    parser.add_argument("--kubeconfig")
    args = parser.parse_args(argv)
    lines, violations = audit(args.kubeconfig, args.namespace, args.url)
    print("\n".join(lines) or "no credentials found")
    for v in violations:
        print(f"VIOLATION {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
