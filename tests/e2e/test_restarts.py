"""Every long-lived watch survives an API-server restart (issue 10, item 5): the shim's Scan cache, the
operator's (kopf) watches and the scanner simulator's Pod watch. The API server of a control plane of
the test's own is stopped and started again on the same port while the whole stack runs. Meanwhile the
shim, past its bound, stops vouching for its copy of the Scans (issue 18, item 1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyscan_local import control_plane
from skyscan_local import stack as localstack
from tests.e2e.conftest import REPO, Rest, kubectl
from tests.e2e.own_cluster import OwnCluster, own_cluster
from tests.helpers import eventually

DOWN_SECONDS = 8
EXAMPLE = REPO / "examples" / "scan.yaml"
EXAMPLE_NAME = "example-scan-1"
# What each watcher logs when its watch is cut; none of them may exit.
INTERRUPTED = {"shim": "scan watch interrupted", "scanner-simulator": "pod watch"}


BROKEN_BOUND = 2  # the shim's SKYSCAN_CACHE_BROKEN_SECONDS here (30 s by default)


@pytest.fixture
def own(tmp_path: Path, archive_dsn: str) -> Iterator[OwnCluster]:
    shim = {"SKYSCAN_CACHE_BROKEN_SECONDS": str(BROKEN_BOUND)}
    # The operator rightly steps down when it cannot renew its Lease in time; on a loaded machine (the
    # suite's workers beside it) the API server's restart alone can take most of the local stack's 30 s.
    operator = {"SKYSCAN_LEASE_DURATION_SECONDS": "90"}
    with own_cluster(tmp_path, {"shim": shim, "operator": operator}, archive_dsn=archive_dsn) as cluster:
        yield cluster


def final(status: dict[str, object]) -> bool:
    return status["scan_state"] == "SCAN_HAS_FINAL_RESULT"


@pytest.mark.timeout(240)
async def test_every_watch_resumes_after_an_api_server_restart(own: OwnCluster, own_rest: Rest) -> None:
    rest, stack = own_rest, own.stack
    began = time.monotonic()
    # A scan end to end first: every watch is established and has delivered events.
    before = await rest.launch(classifiers={"restart": "before"})
    await rest.wait_status(before, final)

    # SIGTERM: the watches' streams end or break. Past the bound the shim vouches for nothing: not
    # ready, and routes answer 503 rather than a copy of the Scans it can no longer check.
    control_plane.stop_component(own.cluster_dir, "kube-apiserver")  # returns once it has exited
    stopped = time.monotonic()

    async def shim_unready() -> bool:
        r = await rest.http.get("/healthz")
        return r.status_code == 503 and "Scan watch has been broken" in r.json()["message"]

    await eventually(shim_unready, timeout=BROKEN_BOUND + 10)
    unready_after = time.monotonic() - stopped
    assert unready_after < BROKEN_BOUND + 10, unready_after
    read = await rest.call("GET", f"/scan/{before}/status")
    assert (read.status_code, read.json()["reason"]) == (503, "kubernetes API unavailable"), read.text
    assert (await rest.http.get("/livez")).status_code == 200  # unready, yet alive: no restart cures this
    await asyncio.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - stopped)))
    control_plane.start_component(own.cluster_dir, "kube-apiserver", tie_to_parent=True)  # this thread's
    print(f"API server away {time.monotonic() - stopped:.1f}s; shim unready after {unready_after:.1f}s")

    async def shim_ready() -> bool:
        return (await rest.http.get("/healthz")).status_code == 200

    await eventually(shim_ready, timeout=30)
    assert (await rest.status(before))["scan_state"] == "SCAN_HAS_FINAL_RESULT"
    logs = stack.settings.dir / "logs"
    for component, line in INTERRUPTED.items():
        log = logs / f"{component}.log"
        await eventually(lambda log=log, line=line: asyncio.to_thread(_says, log, line), timeout=30)
    assert localstack.status(stack.settings) == dict.fromkeys(
        ["wms-simulator", "shim", "operator", "scanner-simulator"], True
    ), "a component ended with the API server"

    # After the restart: a REST scan runs to completion through the shim, the operator (its Scan
    # watch admits it) and the scanner simulator (its Pod watch sees the new scanner Pod) ...
    after = await rest.launch(classifiers={"restart": "after"})
    # ... and a Scan made with kubectl reaches the shim only through its cache's watch.
    await kubectl(stack, "apply", "-f", str(EXAMPLE))
    await rest.wait_status(EXAMPLE_NAME, lambda s: True, timeout=30)
    await rest.wait_status(after, final)
    await rest.wait_status(EXAMPLE_NAME, final)
    found = await rest.ok("POST", "/scans/find", json={"filter": {"classifiers.restart": "after"}})
    assert [m["scan_id"] for m in found["manifests"]] == [after]
    print(f"test body took {time.monotonic() - began:.1f}s")


def _says(log: Path, line: str) -> bool:
    return log.exists() and line in log.read_text(errors="replace")
