"""Install the Scan CRD into a cluster (`python -m skyscan.install --kubeconfig PATH`)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from skyscan import crd, kube


async def install(kubeconfig: str | None) -> None:
    api = await kube.api_client(kubeconfig)
    async with api:
        await kube.apply_crd(api, crd.build_crd())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", help="default: in-cluster, then $KUBECONFIG / ~/.kube/config")
    args = parser.parse_args(argv)
    asyncio.run(install(args.kubeconfig))
    print(f"{crd.CRD_NAME} established")
    return 0


if __name__ == "__main__":
    sys.exit(main())
