"""Where the local PostgreSQL comes from and how its DSNs are spelled (no server started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from skyscan_local import postgres
from skyscan_local import stack as localstack


def test_the_newest_debian_server_is_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"9": ["postgres", "initdb"], "15": ["postgres", "initdb"], "16": ["psql"]}
    for version, programs in installed.items():
        (tmp_path / version / "bin").mkdir(parents=True)
        for program in programs:
            (tmp_path / version / "bin" / program).touch()
    monkeypatch.setattr(postgres, "DEBIAN_BINARIES", tmp_path)
    assert postgres._debian_bindir() == tmp_path / "15" / "bin"  # 16 has the client only


def test_a_dsn_for_another_database_keeps_the_login() -> None:
    dsn = "postgresql://postgres:pw@127.0.0.1:5432/postgres"
    assert postgres.with_database(dsn, "skyscan") == "postgresql://postgres:pw@127.0.0.1:5432/skyscan"


def test_make_up_prints_the_archive_without_its_password() -> None:
    shown = localstack._without_password("postgresql://postgres:secret@127.0.0.1:55432/skyscan")
    assert shown == "postgresql://postgres@127.0.0.1:55432/skyscan"


@pytest.mark.parametrize("name", ["Upper", "drop;", 'x"y', ""])
async def test_only_plain_database_names_are_quoted_into_sql(name: str) -> None:
    for statement in (postgres.create_database, postgres.drop_database):
        with pytest.raises(ValueError):  # before connecting: there is no server at port 1
            await statement("postgresql://u@127.0.0.1:1/postgres", name)


def test_files_that_are_no_cluster_are_refused_never_deleted(tmp_path: Path) -> None:
    """A data directory without PG_VERSION was once wiped as an interrupted initdb's leftovers."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "base").write_text("someone's")
    with pytest.raises(postgres.PostgresError, match="nothing was deleted"):
        postgres._init(tmp_path, Path("/nonexistent"), None, durable=False)
    assert (tmp_path / "data" / "base").read_text() == "someone's"
    assert not (tmp_path / postgres.PASSWORD_FILE).exists()


def test_the_superuser_logs_in_only_locally_and_pods_only_as_the_archive_role() -> None:
    lines = postgres.hba_lines(("10.244.0.0/16",), "skyscan", "skyscan")
    assert lines == [
        "local all all trust",  # the socket is inside the data directory: the server's user only
        "host all all 127.0.0.1/32 scram-sha-256",
        "host all all ::1/128 scram-sha-256",
        "host skyscan skyscan 10.244.0.0/16 scram-sha-256",
        "host all all 0.0.0.0/0 reject",
        "host all all ::/0 reject",
    ]
    assert postgres.hba_lines(()) == [*lines[:3], *lines[4:]], "no clients: loopback only"
    for role, database in (("all", "skyscan"), ("skyscan", "replication"), ("sky scan", "skyscan")):
        with pytest.raises(ValueError):
            postgres.hba_lines(("10.0.0.0/8",), role, database)


def test_the_archive_role_password_is_made_once_private_and_kept(tmp_path: Path) -> None:
    server = postgres.Server(dir=str(tmp_path), port=5433, pid=1, argv=())
    dsn = server.app_dsn()
    password = (tmp_path / postgres.APP_PASSWORD_FILE).read_text().strip()
    assert dsn == f"postgresql://skyscan:{password}@127.0.0.1:5433/skyscan" and len(password) == 32
    assert oct((tmp_path / postgres.APP_PASSWORD_FILE).stat().st_mode & 0o777) == "0o600"
    assert server.app_dsn() == dsn, "kept across calls (and restarts: it is a file of the server's directory)"
