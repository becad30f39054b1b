"""kubectl users: the documented example Scan runs like a REST-submitted one and is visible through REST;
`kubectl get scans` shows each scan's state."""

from __future__ import annotations

from tests.e2e.conftest import LONG_NSIDES, REPO, Rest, Stack, kubectl
from tests.helpers import eventually

EXAMPLE = REPO / "examples" / "scan.yaml"
EXAMPLE_NAME = "example-scan-1"


async def test_the_example_scan_applied_with_kubectl_runs_and_is_visible_through_rest(
    rest: Rest, stack: Stack
) -> None:
    applied = await kubectl(stack, "apply", "-f", str(EXAMPLE))
    assert "configmap/skyscan-event-example-event" in applied and f"scan.skyscan.io/{EXAMPLE_NAME}" in applied

    status = await rest.wait_status(EXAMPLE_NAME, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT")
    assert status["is_deleted"] is False
    manifest = await rest.ok("GET", f"/scan/{EXAMPLE_NAME}/manifest")
    assert manifest["classifiers"] == {"source": "kubectl"}
    assert manifest["event_metadata"]["run_id"] == 138632  # read from the example's event
    found = await rest.ok("POST", "/scans/find", json={"filter": {"classifiers.source": "kubectl"}})
    assert [m["scan_id"] for m in found["manifests"]] == [EXAMPLE_NAME]
    event = await rest.ok("GET", f"/scan/{EXAMPLE_NAME}/sensor-event")
    assert event["sensor_event"]["source"] == "examples/scan.yaml"

    # Applying the same file again changes nothing (GitOps-friendly).
    again = await kubectl(stack, "apply", "-f", str(EXAMPLE))
    assert f"scan.skyscan.io/{EXAMPLE_NAME} unchanged" in again


async def test_kubectl_get_scans_shows_each_state(rest: Rest, stack: Stack) -> None:
    done = await rest.launch(classifiers={"kubectl": "done"})
    stopped = await rest.launch(classifiers={"kubectl": "stopped"}, nsides=LONG_NSIDES)
    await rest.wait_status(stopped, lambda s: s["scan_state"].startswith("IN_PROGRESS__"))
    await rest.ok("DELETE", f"/scan/{stopped}", json={})
    await rest.wait_status(stopped, lambda s: s["wms_deactivated"] == "ABORTED", timeout=30)
    await rest.wait_status(done, lambda s: s["scan_state"] == "SCAN_HAS_FINAL_RESULT")

    async def table() -> dict[str, str]:
        lines = (await kubectl(stack, "get", "scans")).splitlines()
        assert lines[0].split()[:2] == ["NAME", "STATE"], lines[0]
        return {row.split()[0]: row.split()[1] for row in lines[1:]}

    async def matches_rest() -> dict[str, str] | None:
        shown = await table()
        expected = {i: (await rest.status(i))["scan_state"] for i in (done, stopped)}
        return shown if all(shown.get(i) == state for i, state in expected.items()) else None

    shown = await eventually(matches_rest, timeout=10)
    assert shown[done] == "SCAN_HAS_FINAL_RESULT"
    assert shown[stopped].startswith("ABORTED__")
