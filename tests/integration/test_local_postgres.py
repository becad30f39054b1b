"""The local PostgreSQL of `make up`: started, stopped, started again on the same data."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from skyscan_local import postgres, processes


@pytest.fixture
def root() -> Iterator[Path]:
    """A server directory the `postgres` user can reach (pytest's temporary directories are closed)."""
    d = Path(tempfile.mkdtemp(prefix="skyscan-test-pg-"))
    try:
        yield d
    finally:
        postgres.stop(d)
        shutil.rmtree(d, ignore_errors=True)


def owner(pid: int) -> str:
    return pwd.getpwuid(Path(f"/proc/{pid}").stat().st_uid).pw_name


async def test_stop_keeps_the_data_and_the_next_start_finds_it(root: Path) -> None:
    first = postgres.start(root, durable=False, tie_to_parent=True)
    assert first.running() and postgres.load(root) == first
    assert owner(first.pid) == ("postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name)
    assert oct((root / postgres.PASSWORD_FILE).stat().st_mode & 0o777) == "0o600"
    dsn = await postgres.create_database(first.dsn(), "kept")
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE marker (x int); INSERT INTO marker VALUES (7)")
    await conn.close()

    assert postgres.stop(root) is True
    assert not first.running() and postgres.load(root) == first  # its port stays recorded
    assert not postgres.stop(root), "nothing left to stop"
    with pytest.raises(OSError):
        await asyncpg.connect(dsn, timeout=2)

    preferred = processes.free_port()  # free, but the port it had comes first: the DSN stays
    second = postgres.ensure(root, port=preferred, tie_to_parent=True)
    assert second.running() and second.pid != first.pid and second.port == first.port
    assert second.dsn() == first.dsn()
    assert postgres.ensure(root, port=preferred, tie_to_parent=True) == second, "a running server is reused"
    conn = await asyncpg.connect(postgres.with_database(second.dsn(), "kept"))
    try:
        assert await conn.fetchval("SELECT x FROM marker") == 7  # same data, same password
    finally:
        await conn.close()


async def test_the_password_is_required_over_tcp(root: Path) -> None:
    server = postgres.start(root, durable=False, tie_to_parent=True, clients=("10.99.0.0/16",))
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://{postgres.SUPERUSER}:wrong@127.0.0.1:{server.port}/postgres")
    conn = await asyncpg.connect(server.dsn())
    try:  # the server read every line of its pg_hba.conf as meant
        rules = await conn.fetch(
            "SELECT database, user_name, address, auth_method, error FROM pg_hba_file_rules"
        )
    finally:
        await conn.close()
    assert [r["error"] for r in rules] == [None] * len(postgres.hba_lines(("10.99.0.0/16",)))
    assert [
        (r["database"], r["user_name"], r["auth_method"]) for r in rules if r["address"] == "10.99.0.0"
    ] == [(["skyscan"], ["skyscan"], "scram-sha-256")], (
        "from the Pod network: the archive's role only, to its database only"
    )
    assert [r["auth_method"] for r in rules][-2:] == ["reject", "reject"]


def test_a_directory_the_server_user_cannot_reach_is_refused_clearly(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the server runs as ourselves: every directory we use is reachable")
    with pytest.raises(postgres.PostgresError, match="cannot reach"):
        postgres.start(tmp_path / "pg", durable=False, tie_to_parent=True)  # under pytest's 0700 base
    assert not (tmp_path / "pg" / "data").exists()
