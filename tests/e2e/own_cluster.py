"""A whole stack on a control plane of its own, for tests that take the API server or stack components
away: restarting the session's shared cluster would disturb every other test."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from skyscan_local import control_plane
from skyscan_local import stack as localstack
from tests.e2e.conftest import Stack

NAMESPACE = "skyscan"


@dataclass(frozen=True)
class OwnCluster:
    stack: Stack
    cluster_dir: Path

    async def restart_api_server(self, down_seconds: float, *, crash: bool = False) -> float:
        """Stop the API server (SIGTERM, or SIGKILL when `crash`), keep it down `down_seconds`, start it
        again with the same command line and port; returns how long it was unreachable. The test's other
        tasks run while it is down; its start blocks until it answers (from this thread, so it dies with
        the test's process)."""
        began = time.monotonic()
        control_plane.stop_component(self.cluster_dir, "kube-apiserver", crash=crash)
        await asyncio.sleep(max(0.0, down_seconds - (time.monotonic() - began)))
        control_plane.start_component(self.cluster_dir, "kube-apiserver", tie_to_parent=True)
        return time.monotonic() - began


@contextlib.contextmanager
def own_cluster(
    workdir: Path, component_overrides: dict[str, dict[str, str]] | None = None, *, archive_dsn: str
) -> Iterator[OwnCluster]:
    """Start a control plane (about 5 s) and the stack with the e2e suite's fast timers, archiving to
    `archive_dsn`; stop both after. Call from the main thread: the processes die with the thread that
    started them."""
    cluster_dir = workdir / "cluster"
    cluster = control_plane.start(cluster_dir, tie_to_parent=True)
    settings = Stack.settings_for(
        workdir / "stack", cluster.kubeconfig, NAMESPACE, archive_dsn,
        component_overrides=component_overrides or {},
    )  # fmt: skip
    try:
        yield OwnCluster(Stack.up(settings), cluster_dir)
    finally:
        localstack.down(settings)
        for log in sorted((settings.dir / "logs").glob("*.log")):
            print(f"--- {log.name} (shown when a test fails) ---\n{localstack.tail(log, 4000)}")
        control_plane.stop(cluster_dir)
        control_plane.remove(cluster_dir)
