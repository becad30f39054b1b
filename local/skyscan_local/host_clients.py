"""Keep a mangle-table chain accepting the addresses of the Pods a label selector names, for the real
node's firewall: the host's ports (the archive's PostgreSQL) take connections from those Pods only.

    python -m skyscan_local.host_clients --kubeconfig K --namespace skyscan \
        --selector 'app.kubernetes.io/component in (operator,shim)' --chain SKYSCAN-NODE-CLIENTS

A list, then a watch from its resourceVersion (a new list when the watch ends or fails). Each sync
rewrites the whole chain in one `iptables-restore` transaction, so a Pod that went away is out at the
next event, and nothing else ever is in: it fails closed (an empty chain when it starts, the last
known Pods while the API server cannot be reached). Not an ipset: kube-router restores every ipset of
the host from its own last view of them, which would undo a change made since.
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

WATCH_SECONDS = 60


def address(pod: dict[str, Any]) -> str | None:
    """The Pod's address while it may use it: assigned, not finished, not being deleted."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    ip = status.get("podIP")
    return str(ip) if ip else None


def restore_script(chain: str, addresses: Iterable[str]) -> str:
    """`iptables-restore --noflush` input replacing the rules of mangle chain `chain` with one ACCEPT
    per address, committed at once."""
    lines = ["*mangle", f"-F {chain}"]
    lines += [f"-A {chain} -s {ip}/32 -j ACCEPT" for ip in sorted(set(addresses))]
    return "\n".join([*lines, "COMMIT"]) + "\n"


def sync(chain: str, addresses: Iterable[str]) -> None:
    script = restore_script(chain, addresses)
    subprocess.run(["iptables-restore", "--noflush", "-w", "5"], input=script, text=True, check=True)


def client(kubeconfig: Path, token: str | None = None) -> httpx.Client:
    """The API server of a local kubeconfig, as its user, or with `token` (another account's)."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    ca = cluster.get("certificate-authority") or str(kubeconfig.parent / "ca.crt")
    return httpx.Client(
        base_url=cluster["server"],
        verify=ssl.create_default_context(cafile=ca),
        headers={"Authorization": f"Bearer {token or user['token']}"},
        timeout=httpx.Timeout(10, read=WATCH_SECONDS + 10),
    )


def events(api: httpx.Client, path: str, selector: str, version: str) -> Iterator[dict[str, Any]]:
    params = {"labelSelector": selector, "watch": "1", "resourceVersion": version,
              "timeoutSeconds": str(WATCH_SECONDS), "allowWatchBookmarks": "false"}  # fmt: skip
    with api.stream("GET", path, params=params) as got:
        got.raise_for_status()
        for line in got.iter_lines():
            if line:
                yield json.loads(line)


def run(api: httpx.Client, namespace: str, selector: str, chain: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    sync(chain, ())
    while True:
        try:
            listed = api.get(path, params={"labelSelector": selector})
            listed.raise_for_status()
            pods = {p["metadata"]["name"]: address(p) for p in listed.json()["items"]}
            sync(chain, filter(None, pods.values()))
            for event in events(api, path, selector, listed.json()["metadata"]["resourceVersion"]):
                if event["type"] == "ERROR":  # e.g. 410 Gone: list again
                    break
                pod = event["object"]
                name = pod["metadata"]["name"]
                pods[name] = None if event["type"] == "DELETED" else address(pod)
                sync(chain, filter(None, pods.values()))
        except (httpx.HTTPError, ValueError) as e:
            print(f"host-clients: {e!r}; listing again", file=sys.stderr, flush=True)
            time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--selector", required=True)
    parser.add_argument("--chain", required=True)
    args = parser.parse_args(argv)
    with client(args.kubeconfig) as api:
        run(api, args.namespace, args.selector, args.chain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
