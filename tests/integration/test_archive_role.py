"""The archive's least-privilege role on a real PostgreSQL: what it may do (the archive) and what it may
not (run programs, read files, make roles or databases, grant itself more), idempotence, and the
handover of an install the superuser made."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from skyscan.io import archive_role
from skyscan.io.archive import MIGRATIONS, Archive
from skyscan.io.archive_role import ArchiveRoleError, provision
from skyscan_local import postgres
from tests.archived import record, scan_object
from tests.conftest import ArchiveServer, login_dsn

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Login:
    admin: str  # the admin's DSN, on the app's database
    dsn: str  # the app's
    role: str
    password: str


def new_login(server: ArchiveServer, password: str | None = None) -> Login:
    name = f"t_{secrets.token_hex(6)}"
    password = password or secrets.token_hex(16)
    dsn = login_dsn(server.admin_dsn, name, password, name)
    return Login(postgres.with_database(server.admin_dsn, name), dsn, name, password)


@pytest.fixture
async def logins(archive_server: ArchiveServer) -> AsyncIterator[Callable[..., Login]]:
    """New role names (and their databases), dropped after the test."""
    made: list[Login] = []

    def make(password: str | None = None) -> Login:
        made.append(new_login(archive_server, password))
        return made[-1]

    yield make
    for login in made:
        await postgres.drop_database(archive_server.admin_dsn, login.role)
        await postgres.drop_role(archive_server.admin_dsn, login.role)


async def fetch(dsn: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def attributes(admin: str, role: str) -> dict[str, bool]:
    query = f"SELECT {', '.join(archive_role.WANTED)} FROM pg_roles WHERE rolname = $1"
    (row,) = await fetch(admin, query, role)
    return dict(row)


async def memberships(admin: str, role: str) -> list[str]:
    query = "SELECT roleid::regrole::text FROM pg_auth_members WHERE member = $1::text::regrole ORDER BY 1"
    return [r[0] for r in await fetch(admin, query, role)]


async def owners(admin: str) -> dict[str, str]:
    """Every table, index and sequence in schema public, with its owner."""
    query = """SELECT c.relname, pg_get_userbyid(c.relowner) FROM pg_class c
               WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'i', 'S')"""
    return {name: owner for name, owner in await fetch(admin, query)}


async def puts_and_gets(dsn: str) -> None:
    archive = await Archive.connect(dsn)
    try:
        scan = scan_object("ns")
        await archive.put(record(scan, result={"r": 1}))
        got = await archive.get("ns", scan["metadata"]["name"])
        assert got is not None and got["spec"] == scan["spec"]
        assert await archive.pool.fetchval("SELECT max(version) FROM skyscan_schema") == len(MIGRATIONS)
    finally:
        await archive.close()


async def test_the_role_runs_the_archive_and_may_do_nothing_more(
    archive_server: ArchiveServer, logins: Callable[..., Login]
) -> None:
    login = logins()
    done = await provision(archive_server.admin_dsn, login.dsn)
    assert (done.role, done.database) == (login.role, login.role)
    assert f"created role {login.role} ({archive_role.ATTRIBUTES})" in done.changes
    assert f"created database {login.role} owned by {login.role}" in done.changes
    assert await attributes(login.admin, login.role) == archive_role.WANTED
    assert await memberships(login.admin, login.role) == []

    await puts_and_gets(login.dsn)  # the migrations run as the role, then a put and a get
    assert set((await owners(login.admin)).values()) == {login.role}

    me = f'"{login.role}"'
    conn = await asyncpg.connect(login.dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT current_user") == login.role
        await conn.execute("CREATE TABLE t (line text)")  # its own schema's objects: allowed
        refused = {
            "COPY t FROM PROGRAM 'id'": asyncpg.InsufficientPrivilegeError,
            "COPY t TO '/tmp/skyscan-archive-role-test'": asyncpg.InsufficientPrivilegeError,
            "SELECT pg_read_file('/etc/passwd')": asyncpg.InsufficientPrivilegeError,
            "SELECT lo_import('/etc/passwd')": asyncpg.InsufficientPrivilegeError,
            f"CREATE ROLE x_{secrets.token_hex(4)}": asyncpg.InsufficientPrivilegeError,
            f"CREATE DATABASE x_{secrets.token_hex(4)}": asyncpg.InsufficientPrivilegeError,
            f"ALTER ROLE {me} SUPERUSER": asyncpg.InsufficientPrivilegeError,
            f"ALTER ROLE {me} CREATEROLE": asyncpg.InsufficientPrivilegeError,
            f"GRANT pg_execute_server_program TO {me}": asyncpg.InsufficientPrivilegeError,
            f"GRANT pg_read_server_files TO {me}": asyncpg.InsufficientPrivilegeError,
            f"SET ROLE {postgres.SUPERUSER}": asyncpg.InsufficientPrivilegeError,
        }
        for statement, error in refused.items():
            with pytest.raises(error):
                await conn.execute(statement)
            assert await conn.fetchval("SELECT count(*) FROM t") == 0, statement
    finally:
        await conn.close()


async def test_other_logins_may_not_connect_to_the_archive_or_create_in_it(
    archive_server: ArchiveServer, logins: Callable[..., Login]
) -> None:
    login, other = logins(), logins()
    await provision(archive_server.admin_dsn, login.dsn)
    await provision(archive_server.admin_dsn, other.dsn)
    elsewhere = login_dsn(archive_server.admin_dsn, other.role, other.password, login.role)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied for database"):
        await asyncpg.connect(elsewhere, timeout=10)
    public = await fetch(
        login.admin,
        "SELECT has_database_privilege('public', current_database(), 'CONNECT, TEMPORARY'),"
        " has_schema_privilege('public', 'public', 'CREATE')",
    )
    assert tuple(public[0]) == (False, False)


async def test_provisioning_again_changes_nothing_and_undoes_what_was_added(
    archive_server: ArchiveServer, logins: Callable[..., Login]
) -> None:
    login = logins()
    admin = archive_server.admin_dsn
    assert (await provision(admin, login.dsn)).changes
    assert (await provision(admin, login.dsn)).changes == ()

    conn = await asyncpg.connect(login.admin, timeout=10)
    try:
        await conn.execute(
            f"ALTER ROLE \"{login.role}\" SUPERUSER CREATEDB CREATEROLE INHERIT BYPASSRLS PASSWORD 'other';"
            f'GRANT pg_execute_server_program, pg_read_all_data TO "{login.role}";'
            "GRANT CREATE ON SCHEMA public TO PUBLIC;"
            f'GRANT CONNECT ON DATABASE "{login.role}" TO PUBLIC'
        )
    finally:
        await conn.close()
    changes = (await provision(admin, login.dsn)).changes
    assert changes == (
        f"set role {login.role} to {archive_role.ATTRIBUTES} (was super=True, createdb=True, "
        f"createrole=True, bypassrls=True, inherit=True)",
        f"set the password of role {login.role}",
        f"revoked role pg_execute_server_program from {login.role}",
        f"revoked role pg_read_all_data from {login.role}",
        f"revoked CONNECT on database {login.role} from PUBLIC",
        "revoked CREATE on schema public from PUBLIC",
    )
    assert await attributes(login.admin, login.role) == archive_role.WANTED
    assert await memberships(login.admin, login.role) == []
    await puts_and_gets(login.dsn)  # the DSN's password is the role's again
    assert (await provision(admin, login.dsn)).changes == ()


async def test_a_non_ascii_password_logs_in_and_is_recognized_as_set(
    archive_server: ArchiveServer, logins: Callable[..., Login]
) -> None:
    """The verifier made here and the one the server makes of the same password agree (SASLprep)."""
    login = logins("pässwörd\u00a0mit\u2003räumen")
    await provision(archive_server.admin_dsn, login.dsn)
    assert await fetch(login.dsn, "SELECT 1") == [(1,)]
    conn = await asyncpg.connect(login.admin, timeout=10)
    try:
        literal = await conn.fetchval("SELECT quote_literal($1::text)", login.password)
        await conn.execute(f'ALTER ROLE "{login.role}" PASSWORD {literal}')  # hashed by the server
    finally:
        await conn.close()
    assert (await provision(archive_server.admin_dsn, login.dsn)).changes == ()


async def test_an_install_the_superuser_made_is_handed_over_to_the_role(
    archive_server: ArchiveServer, logins: Callable[..., Login]
) -> None:
    """An archive with a scan, all owned by the admin, one migration short: after provisioning, the
    role owns every table and index, runs the last migration (ALTER TABLE: only an owner may) and reads
    the scan."""
    login = logins()
    admin = await postgres.create_database(archive_server.admin_dsn, login.role)
    old = scan_object("ns")
    archive = await Archive.connect(admin)  # the superuser's own archive, as before
    try:
        await archive.put(record(old))
        await archive.pool.execute("DELETE FROM skyscan_schema WHERE version = $1", len(MIGRATIONS))
    finally:
        await archive.close()
    superuser = archive_server.admin_dsn.split("://")[1].split(":")[0]
    assert set((await owners(admin)).values()) == {superuser}

    changes = (await provision(archive_server.admin_dsn, login.dsn)).changes
    assert f"granted CONNECT on database {login.role} to {login.role}" in changes
    assert {c for c in changes if c.startswith("table ")} == {
        f"table {t}: owner {superuser} -> {login.role}" for t in ("skyscan_schema", "scans", "sensor_events")
    }
    assert set((await owners(admin)).values()) == {login.role}, "the indexes came along"
    archive = await Archive.connect(login.dsn)
    try:
        assert await archive.get("ns", old["metadata"]["name"]) is not None
    finally:
        await archive.close()
    await puts_and_gets(login.dsn)
    assert (await provision(archive_server.admin_dsn, login.dsn)).changes == ()


async def test_the_admins_own_login_is_never_restricted(archive_server: ArchiveServer) -> None:
    admin = archive_server.admin_dsn
    with pytest.raises(ArchiveRoleError, match="the admin DSN logs in as"):
        await provision(admin, postgres.with_database(admin, "postgres"))
    assert (await fetch(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = session_user"))[0][0]


@pytest.fixture
def cli_env(
    archive_server: ArchiveServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Login, pytest.MonkeyPatch]]:
    login = new_login(archive_server)
    monkeypatch.setenv(archive_role.ADMIN_ENV, archive_server.admin_dsn)
    monkeypatch.setenv(archive_role.APP_ENV, login.dsn)
    yield login, monkeypatch
    asyncio.run(postgres.drop_database(archive_server.admin_dsn, login.role))
    asyncio.run(postgres.drop_role(archive_server.admin_dsn, login.role))


def test_the_command_reads_its_dsns_from_the_environment_and_never_prints_a_password(
    cli_env: tuple[Login, pytest.MonkeyPatch],
    archive_server: ArchiveServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    login, env = cli_env
    admin_password = archive_server.admin_dsn.split("://")[1].split("@")[0].split(":")[1]
    assert archive_role.main([]) == 0
    first = capsys.readouterr()
    assert f"created role {login.role}" in first.out and first.out.rstrip().endswith("change(s)")
    assert archive_role.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith("already as wanted, nothing changed")

    env.setenv(archive_role.ADMIN_ENV, archive_server.admin_dsn.replace(admin_password, "wr0ngpw"))
    assert archive_role.main([]) == 1
    wrong = capsys.readouterr()
    assert "password authentication failed" in wrong.err and "wr0ngpw" not in wrong.err + wrong.out

    env.setenv(archive_role.ADMIN_ENV, archive_server.admin_dsn)
    env.setenv(archive_role.APP_ENV, login.dsn.rsplit("/", 1)[0] + "/Bad-Name")
    assert archive_role.main([]) == 1
    assert "database name 'Bad-Name'" in capsys.readouterr().err

    env.delenv(archive_role.ADMIN_ENV)
    assert archive_role.main([]) == 2
    assert f"set {archive_role.ADMIN_ENV}" in capsys.readouterr().err
    for out in (first.out, first.err):
        assert login.password not in out and admin_password not in out
