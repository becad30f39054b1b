"""A scan left without its sensor event (a shim killed between its two writes) settles: the operator
fails it, REST and kubectl show it ended (`ABORTED__PRESTARTUP`), and it is archived like any finished
scan, without an event to keep."""

from __future__ import annotations

import time

from api_shim import view
from api_shim.handlers.events import ended
from skyscan import names
from skyscan.io.archive import Archive
from skyscan.io.kube import Kube, core_path
from skyscan.io.kube_errors import KubeError
from tests.helpers import eventually
from tests.integration.operator.conftest import (
    OperatorFactory,
    condition,
    create_scan,
    get_scan,
    scan_events,
    st,
    wait_scan,
)
from tests.integration.operator.test_archiving import finished_scan

ENDED_STATE = "ABORTED__PRESTARTUP"


async def test_a_scan_without_its_event_fails_shows_aborted_and_is_archived(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive, operator: OperatorFactory
) -> None:
    operator(
        SKYSCAN_EVENT_GRACE_SECONDS="2",
        SKYSCAN_ARCHIVE_DSN=archive_dsn,
        SKYSCAN_ARCHIVE_RETENTION_SECONDS="3",
        SKYSCAN_ARCHIVE_INTERVAL_SECONDS="0.3",
    )
    created = time.monotonic()
    name = await create_scan(api, namespace, event=False)

    scan = await wait_scan(api, namespace, name, lambda s: st(s).get("state") == ENDED_STATE, timeout=30)
    failed_after = time.monotonic() - created
    assert condition(scan, "Failed")["reason"] == "EventMissing"
    assert condition(scan, "Stalled")["status"] == "True"  # kubectl describe / GitOps: failed
    status = view.scan_status(scan, None)  # what GET /scan/{id}/status answers from this object
    assert status["scan_state"] == ENDED_STATE and status["scan_complete"] is False
    assert ended(scan)  # its SSE stream sends `end`
    assert not scan["metadata"].get("finalizers")

    # Retention passes: the scan moves to the archive although it has no event to keep.
    async def archived() -> dict[str, object] | None:
        return await archive.get(namespace, name)

    stored = await eventually(archived, timeout=30)
    assert stored is not None
    assert view.scan_status(stored, None)["scan_state"] == ENDED_STATE
    assert await archive.event(name) is None  # GET /i3-event: 404, as it was in the cluster

    async def left_the_cluster() -> bool:
        try:
            await get_scan(api, namespace, name)
        except KubeError as e:
            return e.status == 404
        return False

    assert await eventually(left_the_cluster, timeout=30)
    assert "Archived" in await scan_events(api, namespace, name, "Archived")
    print(f"failed {failed_after:.1f}s after its creation (grace 2s), archived after a 3s retention")


async def test_a_live_scan_whose_event_vanished_later_is_still_not_archived(
    api: Kube, namespace: str, archive_dsn: str, archive: Archive, operator: OperatorFactory
) -> None:
    """Only a scan failed for never having its event goes without one; the rule of keeping a scan whose
    event disappeared otherwise stands (its event may be restored)."""
    scan = await finished_scan(api, namespace)
    name = scan["metadata"]["name"]
    await api.request("DELETE", core_path("configmaps", namespace, names.event_object_name(name)))
    operator(
        SKYSCAN_ARCHIVE_DSN=archive_dsn,
        SKYSCAN_ARCHIVE_RETENTION_SECONDS="0",
        SKYSCAN_ARCHIVE_INTERVAL_SECONDS="0.3",
    )
    assert "ArchiveSkipped" in await scan_events(api, namespace, name, "ArchiveSkipped")
    assert await archive.get(namespace, name) is None
    assert await get_scan(api, namespace, name)
