"""Install the Scan CRD into a cluster (`python -m skyscan.io.install --kubeconfig PATH`), and the
scanners' ServiceAccount into a namespace (the kustomize manifests carry the same account)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from skyscan import crd, names
from skyscan.io import kube


def scanner_account() -> dict[str, Any]:
    """The scanners' ServiceAccount: no RBAC bindings, no API token mounted into its Pods. The operator
    mints each scan's token for it (audience `skyscan-scanner`, bound to that scan's Secret)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": names.SCANNER_SERVICE_ACCOUNT, "labels": dict(names.MANAGED_BY)},
        "automountServiceAccountToken": False,
    }


async def ensure_scanner_account(api: kube.Kube, namespace: str) -> None:
    account = kube.core_path("serviceaccounts", namespace, names.SCANNER_SERVICE_ACCOUNT)
    await api.apply(account, scanner_account(), names.INSTALL_MANAGER)


async def install(kubeconfig: str | None) -> None:
    async with await kube.connect(kubeconfig) as api:
        await kube.apply_crd(api, crd.build_crd(), names.INSTALL_MANAGER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", help="default: in-cluster, then $KUBECONFIG / ~/.kube/config")
    args = parser.parse_args(argv)
    asyncio.run(install(args.kubeconfig))
    print(f"{crd.CRD_NAME} established")
    return 0


if __name__ == "__main__":
    sys.exit(main())
