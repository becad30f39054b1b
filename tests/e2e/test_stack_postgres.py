"""`make up` without an archive DSN runs its own PostgreSQL and hands it to the shim and the operator,
logged in as the archive's least-privilege role; `make down` stops it and keeps its data."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from skyscan_local import postgres
from skyscan_local import stack as localstack
from tests.conftest import Cluster
from tests.e2e.conftest import FAST


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """Reachable by the `postgres` user, as a checkout's `.skyscan` is (pytest's temporary directories
    are not)."""
    d = Path(tempfile.mkdtemp(prefix="skyscan-test-stack-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        postgres.stop(d / "postgres")
        shutil.rmtree(d, ignore_errors=True)


async def connects(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except OSError:
        return False
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS marker (x int)")
        login = await conn.fetchrow("SELECT rolname, rolsuper FROM pg_roles WHERE rolname = current_user")
        assert tuple(login) == (postgres.APP_ROLE, False)
    finally:
        await conn.close()
    return True


def test_up_starts_postgres_for_both_processes_and_down_stops_it(
    cluster: Cluster, namespace: str, stack_dir: Path
) -> None:
    settings = localstack.LocalStackSettings(  # by the environment variables' names
        SKYSCAN_LOCAL_DIR=stack_dir,
        SKYSCAN_KUBECONFIG=cluster.kubeconfig,
        SKYSCAN_NAMESPACE=namespace,
        SKYSCAN_LOCAL_SHIM_PORT=0,
        SKYSCAN_LOCAL_WMS_PORT=0,
        SKYSCAN_LOCAL_POSTGRES_PORT=0,
        SKYSCAN_LOCAL_READY_TIMEOUT=60,
        tie_to_parent=True,
        overrides=FAST,
    )
    try:
        env = localstack.up(settings)
        dsn = env["SKYSCAN_ARCHIVE_DSN"]
        assert dsn.endswith("/skyscan") and f"SKYSCAN_ARCHIVE_DSN={dsn}" in (stack_dir / "env").read_text()
        assert dsn.startswith(f"postgresql://{postgres.APP_ROLE}:"), "not the superuser's"
        assert localstack.status(settings)["postgres"] is True
        records = localstack.load_state(stack_dir)["components"]
        for component in ("shim", "operator"):
            environ = Path(f"/proc/{records[component]['pid']}/environ").read_bytes().split(b"\0")
            assert f"SKYSCAN_ARCHIVE_DSN={dsn}".encode() in environ, component
        assert asyncio.run(connects(dsn))
    finally:
        stopped = localstack.down(settings)
    assert "postgres" in stopped
    server_dir = stack_dir / "postgres"
    server = postgres.load(server_dir)
    assert server is not None and not server.running() and (server_dir / "data" / "PG_VERSION").exists()
    assert not asyncio.run(connects(dsn))
