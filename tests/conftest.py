"""Shared fixtures: one real cluster and one real PostgreSQL per test session; a fresh namespace and
a fresh archive database per test.

`SKYSCAN_TEST_KUBECONFIG` points the suite at any existing cluster (kind, a real one); otherwise
the local control plane is started from the cached binaries and torn down at the end.
`SKYSCAN_TEST_ARCHIVE_DSN` (a login that may create databases) points it at an existing PostgreSQL;
otherwise a local server is started (skyscan_local.postgres) and removed at the end.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from xdist.scheduler.worksteal import MIN_PENDING, WorkStealingScheduling

from skyscan.io import archive_role, install, kube
from skyscan.io.archive import Archive
from skyscan.io.kube_errors import KubeError
from skyscan_local import control_plane as localcluster
from skyscan_local import postgres


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    local: localcluster.ClusterState | None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get("SKYSCAN_TEST_KUBECONFIG")
    if external:
        asyncio.run(install.install(external))
        yield Cluster(kubeconfig=external, local=None)
        return
    workdir = tmp_path_factory.mktemp("cluster")
    state = localcluster.start(workdir, tie_to_parent=True)
    try:
        asyncio.run(install.install(state.kubeconfig))
        yield Cluster(kubeconfig=state.kubeconfig, local=state)
    finally:
        localcluster.stop(Path(state.workdir))
        localcluster.remove(Path(state.workdir))


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[kube.Kube]:
    async with await kube.connect(cluster.kubeconfig) as api:
        yield api


@pytest.fixture
async def namespace(cluster: Cluster, api: kube.Kube) -> AsyncIterator[str]:
    """A fresh namespace, ready for Pods (its default service account exists).

    On the session's own control plane it is left in place afterwards, only its Jobs and Pods removed
    (so they hold none of the fake node's room): a namespace's deletion costs the API server, etcd and
    the controller manager a pass over every resource type, about 0.1 s of CPU, which over a suite's
    thousand namespaces was most of those servers' work; that control plane goes with the session.
    An external cluster gets the namespace deleted."""
    name = f"t-{secrets.token_hex(4)}"
    body = {"metadata": {"name": name, "labels": {"skyscan.io/test": "true"}}}
    await api.request("POST", kube.core_path("namespaces"), body=body)
    # Made here rather than waited for from the controller manager (which leaves one that exists as
    # it is): a few times quicker, and there are hundreds of these.
    try:
        account = {"metadata": {"name": "default"}}
        await api.request("POST", kube.core_path("serviceaccounts", name), body=account)
    except KubeError as e:
        if e.status != 409:
            raise
    await install.ensure_scanner_account(api, name)
    yield name
    if cluster.local is not None:
        background = {"propagationPolicy": "Background"}
        await api.request("DELETE", kube.path("batch/v1", "jobs", name), params=background)
        await api.request("DELETE", kube.core_path("pods", name))
        return
    try:
        await api.request("DELETE", kube.core_path("namespaces", name=name))
    except KubeError as e:
        if e.status != 404:
            raise


@dataclass(frozen=True)
class ArchiveServer:
    admin_dsn: str  # may create and drop databases
    local: postgres.Server | None


@pytest.fixture(scope="session")
def archive_server() -> Iterator[ArchiveServer]:
    external = os.environ.get("SKYSCAN_TEST_ARCHIVE_DSN")
    if external:
        yield ArchiveServer(admin_dsn=external, local=None)
        return
    # Not under pytest's temporary directory: that is closed to the `postgres` user the server runs
    # as when the suite runs as root.
    root = Path(tempfile.mkdtemp(prefix="skyscan-test-postgres-"))
    try:
        server = postgres.start(root, durable=False, tie_to_parent=True)
        yield ArchiveServer(admin_dsn=server.dsn(), local=server)
    finally:
        postgres.stop(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def archive_dsn(archive_server: ArchiveServer) -> AsyncIterator[str]:
    """The DSN of a fresh, empty database (no schema yet), dropped after the test."""
    name = f"t_{secrets.token_hex(6)}"
    yield await postgres.create_database(archive_server.admin_dsn, name)
    await postgres.drop_database(archive_server.admin_dsn, name)


def login_dsn(admin_dsn: str, role: str, password: str, database: str) -> str:
    """A DSN of the admin's server for another login and database."""
    parts = urlsplit(admin_dsn)
    server = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{role}:{quote(password, safe='')}@{server}", path=f"/{database}").geturl()


@pytest.fixture
async def archive_role_dsn(archive_server: ArchiveServer) -> AsyncIterator[str]:
    """The DSN of a fresh, empty database owned by a fresh least-privilege role (skyscan.io.archive_role,
    as a deployment logs in), both dropped after the test."""
    name = f"t_{secrets.token_hex(6)}"
    dsn = login_dsn(archive_server.admin_dsn, name, secrets.token_hex(16), name)
    try:
        await archive_role.provision(archive_server.admin_dsn, dsn)
        yield dsn
    finally:
        await postgres.drop_database(archive_server.admin_dsn, name)
        await postgres.drop_role(archive_server.admin_dsn, name)


@pytest.fixture
async def archive(archive_dsn: str) -> AsyncIterator[Archive]:
    """An Archive connected to a fresh database (migrated)."""
    connected = await Archive.connect(archive_dsn)
    try:
        yield connected
    finally:
        await connected.close()


# Modules whose tests run on one pytest-xdist worker, in file order (`make test`, `--dist worksteal`):
# the machine has one real node and test_real_stack's tests share one stack; the e2e modules on the
# session's `stack` share one worker, so one stack is started rather than one a worker (each also runs
# its timers all session), and test_cli's share one launched scan. Each group starts at once, on a worker
# of its own while there are workers enough.
SESSION_STACK = (
    "actions", "cli", "dashboard", "handoff", "identity", "kubectl", "lifecycle", "metrics", "stack",
    "webhooks",
)  # fmt: skip
TOGETHER = {
    "tests/e2e/test_real_node.py": "real_node",
    "tests/e2e/test_real_stack.py": "real_node",
    "tests/e2e/test_dashboard_oidc.py": "keycloak",  # one Keycloak for its tests
    **{f"tests/e2e/test_{name}.py": "stack" for name in SESSION_STACK},
}


KEPT = 2 * MIN_PENDING  # of a worker's tests in order, how many a steal leaves it


class _Together(WorkStealingScheduling):
    """xdist's work stealing with TOGETHER's groups kept whole. Each worker starts with a share of the
    tests and one that runs out takes half the untouched tests of the busiest, so no test waits on a
    round trip to the controller (xdist's loadgroup hands out one test at a time: test-fast took
    89-97 s with it, 73-78 s with work stealing). Each group goes, in file order, to one worker ahead
    of its share, and is never stolen."""

    together: frozenset[int] = frozenset()

    def schedule(self) -> None:
        if self.collection is None:
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = next(iter(self.node2collection.values()))
            groups: dict[str, list[int]] = {}
            for index, nodeid in enumerate(self.collection):
                if group := TOGETHER.get(nodeid.split("::", 1)[0]):
                    groups.setdefault(group, []).append(index)
            self.together = frozenset(i for indices in groups.values() for i in indices)
            for k, indices in enumerate(groups.values()):
                node = self.nodes[k % len(self.nodes)]
                self.node2pending[node].extend(indices)
                node.send_runtest_some(indices)
            self.pending[:] = [i for i in range(len(self.collection)) if i not in self.together]
        self.check_schedule()

    def check_schedule(self) -> None:
        """xdist's, but a steal takes only tests outside the groups, and the first half of those the
        busiest worker has not started rather than the last. The suite is collected heaviest first
        (the end-to-end modules with stacks of their own, then integration, then unit): stealing the
        last half left them all to the worker whose share began with them, which ran until 412 s, the
        others 378 s and 383 s (now 372-384 s). The busiest keeps the test it runs and the next three:
        a steal that finds one of its tests started takes none, and is asked again."""
        up = {node: pending for node, pending in self.node2pending.items() if not node.shutting_down}

        def idle() -> list[Any]:
            return [node for node, pending in up.items() if len(pending) < MIN_PENDING]

        if self.pending:
            waiting = idle()
            for k, node in enumerate(waiting):
                self._send_tests(node, len(self.pending) // (len(waiting) - k))
        if not idle() or self.steal_requested_from_node is not None:
            return
        stealable = {node: [i for i in up[node][KEPT:] if i not in self.together] for node in up}
        victim = max(stealable, key=lambda node: len(stealable[node]), default=None)
        if victim is None or not stealable[victim]:
            for node in idle():
                node.shutdown()
            return
        tests = stealable[victim]
        victim.send_steal(tests[: (len(tests) + 1) // 2])
        self.steal_requested_from_node = victim


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> WorkStealingScheduling | None:
    return _Together(config, log) if config.getvalue("dist") == "worksteal" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A real-node test outside TOGETHER's real-node modules would run beside them: refused."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("real_node") and TOGETHER.get(module) != "real_node":
            raise pytest.UsageError(f"{module}: add it to tests/conftest.py TOGETHER (real_node)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A real-node test skipped is said loudly: the suite then proved nothing on a real kubelet."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "real_node" in r.keywords]
    if skipped:
        reasons = {
            (r.longrepr[2] if isinstance(r.longrepr, tuple) else str(r.longrepr)).removeprefix("Skipped: ")
            for r in skipped
        }
        terminalreporter.section("REAL NODE NOT TESTED", sep="!", red=True, bold=True)
        for reason in sorted(reasons):
            terminalreporter.line(f"{len(skipped)} real-node test(s) skipped: {reason}", red=True, bold=True)
