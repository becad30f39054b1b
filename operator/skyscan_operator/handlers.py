"""The kopf handlers: they feed watch events into the `Controller`, which plans and acts.

Only `on.event` handlers are used: kopf keeps no per-object progress annotations and adds no
finalizer of its own (the operator manages `skyscan.io/wms-workflow` itself, present only while a
scan holds a WMS workflow). `skyscan-operator` runs kopf standalone (no peering) for the configured
namespace(s), in the one replica holding the operator's Lease; the others stand by (`leader`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import kopf

from skyscan import logs, model, names, subscription
from skyscan.io import kube, kubeconfig
from skyscan_operator import kopf_state, leader, metrics
from skyscan_operator.controller import Controller
from skyscan_operator.settings import OperatorSettings
from skyscan_operator.standby import StandbyEndpoints


def controller_of(memo: Any) -> Controller:
    return memo["controller"]  # type: ignore[no-any-return]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 30
    settings.watching.server_timeout = 300
    # Lists (at start, and again after a watch falls too far behind) come in pages, so thousands of
    # Scans never arrive as one response to parse at once, nor take longer than a request may. A page
    # is held whole (its text three times, then its objects) until its last object is queued: ~3 MiB
    # at 100 Scans, ~15 MiB at 500.
    settings.watching.chunk_size = 100
    # kopf's worker for an object keeps that object's last watch event until it has been idle this long
    # (5 s by default): at start, that was every Scan listed, whole, at once. Measured at 10,000 Scans
    # stored while the operator runs (tools/bench/operator_memory.py): RSS 24 MiB lower at 0.5 s than at
    # 5 s, 7 MiB lower again at 0.1 s; a worker is cheap to start again for an object's next event.
    settings.queueing.idle_timeout = 0.1
    settings.persistence.diffbase_storage = kopf_state.NoDiffBase()
    await controller_of(memo).start()


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf logs in as our own client does (`kubeconfig.endpoint`): SKYSCAN_KUBECONFIG, else in-cluster, else
    $KUBECONFIG, with its token and certificate files and its exec plugin (kopf's own kubeconfig login
    runs no plugin); kopf logs in again once the credential expires, or on a 401."""
    found = kubeconfig.endpoint(controller_of(memo).settings.kubeconfig)
    now = await kubeconfig.Credentials(found).current()
    return kopf.ConnectionInfo(
        server=found.server, ca_data=found.ca, insecure=not found.verify, token=now.token,
        certificate_data=now.cert, private_key_data=now.key, expiration=now.expires,
    )  # fmt: skip


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await controller_of(memo).stop()


@kopf.on.event(model.GROUP, model.VERSION, model.PLURAL)
async def scan_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    controller_of(memo).on_scan(event.get("type"), dict(event["object"]))


@kopf.on.event(model.GROUP, model.VERSION, subscription.PLURAL)
async def subscription_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    controller_of(memo).on_subscription(event.get("type"), dict(event["object"]))


@kopf.on.event("batch", "v1", "jobs", labels=names.SCANNER_LABELS)
async def job_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    controller_of(memo).on_child("Job", event.get("type"), dict(event["object"]))


@kopf.on.event("", "v1", "pods", labels=names.SCANNER_LABELS)
async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    controller_of(memo).on_child("Pod", event.get("type"), dict(event["object"]))


def main(argv: list[str] | None = None) -> int:
    """`skyscan-operator`: configuration comes from SKYSCAN_* (see `skyscan_operator.settings`)."""
    args = sys.argv[1:] if argv is None else argv
    if args:  # no arguments are taken: `--help` is answered, anything else is a usage error
        asked = args in (["-h"], ["--help"])
        out = sys.stdout if asked else sys.stderr
        print(__doc__, "\nSettings:", file=out)
        for name, f in OperatorSettings.model_fields.items():
            default = f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]
            print(f"  SKYSCAN_{name.upper()} (default {default!r}): {f.description}", file=out)
        return 0 if asked else 2
    settings = OperatorSettings()
    # kopf.run leaves logging as configured here: kopf's own lines (with their object reference) come
    # out in the same format, JSON carrying kopf's fields (timestamp, severity, message, object).
    logs.configure(settings.log_format, os.environ.get("SKYSCAN_LOG_LEVEL", "INFO"))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per WMS request is noise
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per watch event, likewise
    if settings.rest_in_clear:
        logging.getLogger(__name__).warning(
            "SKYSCAN_REST_ADDRESS %s is plain http: scanners send their bearer token unencrypted; serve "
            "the shim over TLS (SKYSCAN_TLS_CERT_FILE, SKYSCAN_REST_CA_CONFIGMAP) unless a mesh encrypts",
            settings.rest_address,
        )
    if not settings.tags and not (settings.tag_catalog_dir and settings.tag_catalog_dir.is_dir()):
        logging.getLogger(__name__).warning(
            "no image tags: SKYSCAN_TAGS is empty and SKYSCAN_TAG_CATALOG_DIR names no directory, so every "
            "scan not yet started fails (InvalidSpec, spec.dockerTag); give the operator the shim's catalog"
        )
    asyncio.run(operate(settings))
    return 0


async def operate(settings: OperatorSettings) -> None:
    """Stand by until this replica holds the operator's Lease, then run kopf and the controller while
    renewing it; release it once they have stopped (SIGTERM), so a standby takes over at once.

    kopf's peering would not do here: it pauses kopf's handlers only, while the controller's own loops
    (backlog, WMS poller, janitor, archiver) would go on acting in every replica."""
    async with await kube.connect(settings.kubeconfig) as api:
        leadership = leader.Leadership(api, settings)
        async with StandbyEndpoints(settings):
            renewed = await leadership.acquire()
        metrics.LEADER.set(1)
        keeping = asyncio.create_task(leadership.keep(renewed), name="lease")
        try:
            await kopf.operator(
                standalone=True,  # no kopf peering: the Lease decides who acts
                clusterwide=False,
                namespaces=settings.namespaces,
                memo=kopf.Memo(controller=Controller(settings)),
                memories=kopf_state.EventMemories(),
                liveness_endpoint=settings.liveness_endpoint,
            )
        finally:
            keeping.cancel()
            await asyncio.gather(keeping, return_exceptions=True)
            await leadership.release()


if __name__ == "__main__":
    sys.exit(main())
