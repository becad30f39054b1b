"""Install the CRDs (Scan, ScanSubscription) into a cluster (`python -m skyscan.io.install --kubeconfig
PATH`), and the scanners' ServiceAccount and the webhook Secret into a namespace (the kustomize manifests
carry the same)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from skyscan import crd, names, subscription
from skyscan.io import kube
from skyscan.io.kube_errors import Conflict


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


async def ensure_webhook_secrets(api: kube.Kube, namespace: str) -> None:
    """The one Secret holding subscriptions' signing secrets (`skyscan.subscription.SECRET_NAME`), empty
    when made; one already there is left as it is."""
    metadata = {"name": subscription.SECRET_NAME, "labels": dict(names.MANAGED_BY)}
    body = {"metadata": metadata, "type": "Opaque"}
    with contextlib.suppress(Conflict):
        await api.request("POST", kube.core_path("secrets", namespace), body=body)


async def install(kubeconfig: str | None) -> None:
    async with await kube.connect(kubeconfig) as api:
        for of in crd.KINDS:
            await kube.apply_crd(api, crd.build_crd(of), names.INSTALL_MANAGER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", help="default: in-cluster, then $KUBECONFIG / ~/.kube/config")
    args = parser.parse_args(argv)
    asyncio.run(install(args.kubeconfig))
    print(", ".join(of.crd_name for of in crd.KINDS), "established")
    return 0


if __name__ == "__main__":
    sys.exit(main())
