"""The archive's least-privilege login: the role SKYSCAN_ARCHIVE_DSN names, which owns Skyscan's tables
and nothing else (`skyscan-archive-role`, run with an admin login; the chart runs it as a hook Job).

`provision(admin_dsn, app_dsn)` makes the server match, idempotently, and returns what it changed:
- the role (the app DSN's user) exists with exactly LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE
  NOREPLICATION NOBYPASSRLS NOINHERIT and the app DSN's password (stored as a SCRAM-SHA-256 verifier
  computed here: the password itself never reaches the server or its log), and is a member of no role
  (pg_execute_server_program, pg_read_server_files, pg_read_all_data... are revoked);
- the database (the app DSN's) exists, new ones owned by the role (TEMPLATE template0); PUBLIC may
  neither connect to it nor make temporary tables there, the role may connect;
- in it, PUBLIC may not create in schema `public`, the role has USAGE and CREATE there, and owns
  every table of `skyscan.io.archive.TABLES` that exists (an install made with another login: ALTER TABLE
  ... OWNER TO, which carries the indexes along).

Names come from a DSN, so the role's and database's must match NAME (no quoting surprises, never a
reserved `pg_` role); statements quote every identifier and literal with the server's `format`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import os
import re
import secrets
import stringprep
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg

from skyscan.io.archive import TABLES

NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT"
# The pg_roles columns of those attributes, and the value each must have.
WANTED = {
    "rolcanlogin": True, "rolsuper": False, "rolcreatedb": False, "rolcreaterole": False,
    "rolreplication": False, "rolbypassrls": False, "rolinherit": False,
}  # fmt: skip
SCRAM_ITERATIONS = 4096  # PostgreSQL's default (scram_iterations)
PROVISION_LOCK = 0x736B797363616E01  # pg_advisory_lock key: two runs at once take turns
ADMIN_ENV, APP_ENV = "SKYSCAN_ARCHIVE_ADMIN_DSN", "SKYSCAN_ARCHIVE_DSN"
BOOTSTRAP_SUPERUSER = 10  # its oid; it can never lose SUPERUSER


class ArchiveRoleError(ValueError):
    """A DSN or a server state this module refuses to work with."""


@dataclass(frozen=True)
class AppLogin:
    """The login the app DSN names: the role to provision, its password and its database."""

    role: str
    password: str = field(repr=False)
    database: str


@dataclass(frozen=True)
class Provisioned:
    role: str
    database: str
    changes: tuple[str, ...]  # what was changed, in order; empty: everything was already so


def _checked(kind: str, name: str) -> str:
    if not NAME.fullmatch(name) or name.startswith("pg_"):
        raise ArchiveRoleError(
            f"the archive's {kind} name {name!r} must match {NAME.pattern} and not start with pg_"
        )
    return name


def app_login(dsn: str) -> AppLogin:
    """The role, password and database of a `postgresql://user:password@host/database` DSN (the
    database defaults to the user's name, as libpq and asyncpg do)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ArchiveRoleError("the archive's DSN must be a postgresql:// URL")
    overridden = {k for k, _ in parse_qsl(parts.query)} & {"user", "password", "database", "dbname"}
    if overridden:
        raise ArchiveRoleError(
            f"give the archive's user, password and database in the URL itself, not as "
            f"{', '.join(sorted(overridden))}="
        )
    if not parts.username or not parts.password:
        raise ArchiveRoleError("the archive's DSN must name a user and a password")
    role = _checked("role", unquote(parts.username))
    database = _checked("database", unquote(parts.path.lstrip("/")) or role)
    return AppLogin(role=role, password=unquote(parts.password), database=database)


def _with_database(dsn: str, database: str) -> str:
    return urlsplit(dsn)._replace(path=f"/{database}").geturl()


# SASLprep (RFC 4013) as PostgreSQL and asyncpg apply it to a password before SCRAM: an ASCII password
# is used as it is, and one that SASLprep refuses too.
_PROHIBITED = (
    stringprep.in_table_a1, stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
    stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6, stringprep.in_table_c7,
    stringprep.in_table_c8, stringprep.in_table_c9,
)  # fmt: skip


def saslprep(password: str) -> str:
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    normalized = unicodedata.normalize("NFKC", mapped)
    if not normalized or any(test(c) for c in normalized for test in _PROHIBITED):
        return password
    if any(stringprep.in_table_d1(c) for c in normalized) and (
        not (stringprep.in_table_d1(normalized[0]) and stringprep.in_table_d1(normalized[-1]))
        or any(stringprep.in_table_d2(c) for c in normalized)
    ):
        return password
    return normalized


def _scram_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return hashlib.sha256(client_key).digest(), server_key


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (and accepts in place of the password)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    stored, server = _scram_keys(password, salt, iterations)
    b64 = base64.b64encode
    return f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}${b64(stored).decode()}:{b64(server).decode()}"


def verifies(verifier: str | None, password: str) -> bool:
    """Whether a stored verifier is `password`'s SCRAM-SHA-256 one (an md5 hash or none: no)."""
    m = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([^$]+)\$([^:]+):(.+)", verifier or "")
    if not m:
        return False
    try:
        salt, stored, server = (base64.b64decode(g, validate=True) for g in m.group(2, 3, 4))
    except ValueError:
        return False
    want_stored, want_server = _scram_keys(password, salt, int(m.group(1)))
    return hmac.compare_digest(stored, want_stored) and hmac.compare_digest(server, want_server)


async def _run(conn: asyncpg.Connection, template: str, *args: str) -> None:
    """Execute the statement the server's `format` makes of `template` (%I: an identifier, %L: a
    literal) and `args`."""
    params = ", ".join(f"${i}::text" for i in range(2, len(args) + 2))
    await conn.execute(await conn.fetchval(f"SELECT format($1::text, {params})", template, *args))


async def _role(conn: asyncpg.Connection, login: AppLogin) -> list[str]:
    changes: list[str] = []
    row = await conn.fetchrow(f"SELECT oid, {', '.join(WANTED)} FROM pg_roles WHERE rolname = $1", login.role)
    if row is None:
        await _run(conn, f"CREATE ROLE %I WITH {ATTRIBUTES} PASSWORD %L", login.role,
                   scram_verifier(login.password))  # fmt: skip
        changes.append(f"created role {login.role} ({ATTRIBUTES})")
    else:
        if row["oid"] == BOOTSTRAP_SUPERUSER:
            raise ArchiveRoleError(f"{login.role} is the server's bootstrap superuser: name another role")
        wrong = [column for column, value in WANTED.items() if row[column] != value]
        if wrong:
            await _run(conn, f"ALTER ROLE %I WITH {ATTRIBUTES}", login.role)
            was = ", ".join(f"{c.removeprefix('rol')}={row[c]}" for c in wrong)
            changes.append(f"set role {login.role} to {ATTRIBUTES} (was {was})")
        # pg_authid (the stored verifiers) is the superuser's to read; others set the password anyway.
        readable = await conn.fetchval("SELECT has_table_privilege('pg_catalog.pg_authid', 'SELECT')")
        stored = (
            await conn.fetchval("SELECT rolpassword FROM pg_authid WHERE oid = $1", row["oid"])
            if readable
            else None
        )
        if not verifies(stored, login.password):
            await _run(conn, "ALTER ROLE %I WITH PASSWORD %L", login.role, scram_verifier(login.password))
            changes.append(f"set the password of role {login.role}")
    memberships = """
        SELECT g.rolname AS granted, gr.rolname AS grantor
        FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid LEFT JOIN pg_roles gr ON gr.oid = a.grantor
        WHERE a.member = (SELECT oid FROM pg_roles WHERE rolname = $1) ORDER BY 1
    """
    for granted, grantor in await conn.fetch(memberships, login.role):
        if grantor is None:
            await _run(conn, "REVOKE %I FROM %I CASCADE", granted, login.role)
        else:
            await _run(conn, "REVOKE %I FROM %I GRANTED BY %I CASCADE", granted, login.role, grantor)
        changes.append(f"revoked role {granted} from {login.role}")
    if left := [r["granted"] for r in await conn.fetch(memberships, login.role)]:
        raise ArchiveRoleError(f"{login.role} is still a member of {', '.join(left)}: revoke it by hand")
    return changes


_PUBLIC_ON_DATABASE = """
    SELECT array_agg(a.privilege_type ORDER BY a.privilege_type)
    FROM pg_database d, aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a
    WHERE d.datname = $1 AND a.grantee = 0 AND a.privilege_type IN ('CONNECT', 'TEMPORARY')
"""


async def _database(conn: asyncpg.Connection, login: AppLogin) -> list[str]:
    changes: list[str] = []
    owner = await conn.fetchval(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", login.database
    )
    if owner is None:
        await _run(conn, "CREATE DATABASE %I OWNER %I TEMPLATE template0", login.database, login.role)
        changes.append(f"created database {login.database} owned by {login.role}")
    if public := await conn.fetchval(_PUBLIC_ON_DATABASE, login.database):
        await _run(conn, "REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC", login.database)
        changes.append(f"revoked {', '.join(public)} on database {login.database} from PUBLIC")
        if await conn.fetchval(_PUBLIC_ON_DATABASE, login.database):
            raise ArchiveRoleError(
                f"PUBLIC may still connect to {login.database} (granted by another role): revoke it by hand"
            )
    may_connect = "SELECT has_database_privilege($1, $2, 'CONNECT')"
    if not await conn.fetchval(may_connect, login.role, login.database):
        await _run(conn, "GRANT CONNECT ON DATABASE %I TO %I", login.database, login.role)
        changes.append(f"granted CONNECT on database {login.database} to {login.role}")
    return changes


_SCHEMA_ACL = """
    SELECT array_agg(a.privilege_type ORDER BY a.privilege_type)
    FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
    WHERE n.nspname = 'public' AND a.grantee = $1
"""
# Skyscan's tables in `public`, their indexes and the sequences they own (none today; a serial column
# would add one), that someone other than the role ($2, an oid) owns.
_NOT_OWNED = """
    SELECT c.relname, c.relkind::text AS kind, pg_get_userbyid(c.relowner) AS owner
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relowner <> $2::oid AND (
      (c.relkind IN ('r', 'p') AND c.relname = ANY($1::text[]))
      OR (c.relkind = 'S' AND EXISTS (
        SELECT 1 FROM pg_depend d JOIN pg_class t ON t.oid = d.refobjid
        WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')
          AND d.refclassid = 'pg_class'::regclass AND t.relnamespace = n.oid AND t.relname = ANY($1::text[])))
      OR (c.relkind IN ('i', 'I') AND EXISTS (
        SELECT 1 FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
        WHERE i.indexrelid = c.oid AND t.relnamespace = n.oid AND t.relname = ANY($1::text[])))
    ) ORDER BY c.relkind DESC, c.relname
"""


async def _schema(conn: asyncpg.Connection, login: AppLogin) -> list[str]:
    """In the archive's database, connected as the admin."""
    changes: list[str] = []
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'public')"):
        raise ArchiveRoleError(f"database {login.database} has no schema public")
    if "CREATE" in (await conn.fetchval(_SCHEMA_ACL, 0) or []):
        await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        changes.append("revoked CREATE on schema public from PUBLIC")
    role_oid = await conn.fetchval("SELECT oid FROM pg_roles WHERE rolname = $1", login.role)
    if not {"CREATE", "USAGE"} <= set(await conn.fetchval(_SCHEMA_ACL, role_oid) or []):
        await _run(conn, "GRANT USAGE, CREATE ON SCHEMA public TO %I", login.role)
        changes.append(f"granted USAGE, CREATE on schema public to {login.role}")
    # ALTER TABLE carries the table's indexes and owned sequences along; a sequence left (owned by
    # another role than its table's) follows with ALTER SEQUENCE; an index cannot be left.
    for kinds, statement in ((("r", "p"), "TABLE"), (("S",), "SEQUENCE")):
        for name, kind, owner in await conn.fetch(_NOT_OWNED, list(TABLES), role_oid):
            if kind in kinds:
                await _run(conn, f"ALTER {statement} public.%I OWNER TO %I", name, login.role)
                changes.append(f"{statement.lower()} {name}: owner {owner} -> {login.role}")
    if left := [r["relname"] for r in await conn.fetch(_NOT_OWNED, list(TABLES), role_oid)]:
        raise ArchiveRoleError(f"{login.role} still does not own {', '.join(left)}")
    return changes


async def provision(admin_dsn: str, app_dsn: str, *, timeout: float = 30.0) -> Provisioned:
    """Make the app DSN's role, database and ownership of Skyscan's tables as the module says, logged in
    with `admin_dsn` (a login that may create roles and databases: a superuser, or CREATEROLE CREATEDB
    that can grant what it creates). Idempotent; returns what it changed."""
    login = app_login(app_dsn)
    changes: list[str] = []
    conn = await asyncpg.connect(admin_dsn, timeout=timeout)
    try:
        if await conn.fetchval("SELECT session_user") == login.role:
            raise ArchiveRoleError(
                f"the admin DSN logs in as {login.role}, the role to restrict: use another login"
            )
        await conn.execute("SELECT pg_advisory_lock($1)", PROVISION_LOCK)
        async with conn.transaction():
            changes += await _role(conn, login)
        changes += await _database(conn, login)  # CREATE DATABASE runs outside a transaction
        inside = await asyncpg.connect(_with_database(admin_dsn, login.database), timeout=timeout)
        try:
            async with inside.transaction():
                changes += await _schema(inside, login)
        finally:
            await inside.close()
    finally:
        await conn.close()  # releases the advisory lock
    return Provisioned(role=login.role, database=login.database, changes=tuple(changes))


def _redacted(message: str, dsns: Sequence[str]) -> str:
    """`message` without the passwords of `dsns` (an error may quote a DSN)."""
    for dsn in dsns:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            continue
        for secret in {password, unquote(password)} if password else ():
            message = message.replace(secret, "***")
    return message


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="skyscan-archive-role",
        description=(
            f"Create or restrict the archive's least-privilege PostgreSQL role, its database and its "
            f"ownership of Skyscan's tables. Reads the admin login's DSN from {ADMIN_ENV} and the "
            f"archive's DSN (the role, password and database to provision) from {APP_ENV}; never from "
            f"the command line, which every user of the machine can read."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser().parse_args(argv)
    dsns = [os.environ.get(ADMIN_ENV, ""), os.environ.get(APP_ENV, "")]
    if missing := [name for name, dsn in zip((ADMIN_ENV, APP_ENV), dsns, strict=True) if not dsn]:
        print(f"skyscan-archive-role: set {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        done = asyncio.run(provision(*dsns))
    except ArchiveRoleError as e:
        print(f"skyscan-archive-role: {_redacted(str(e), dsns)}", file=sys.stderr)
        return 1
    except asyncpg.PostgresError as e:
        print(f"skyscan-archive-role: PostgreSQL refused: {_redacted(str(e), dsns)}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError, ValueError) as e:  # unreachable, or a DSN asyncpg cannot parse
        print(f"skyscan-archive-role: cannot connect: {_redacted(str(e), dsns)}", file=sys.stderr)
        return 1
    for change in done.changes:
        print(change)
    summary = f"{len(done.changes)} change(s)" if done.changes else "already as wanted, nothing changed"
    print(f"archive role {done.role} on database {done.database}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
