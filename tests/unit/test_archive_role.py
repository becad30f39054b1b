"""The archive's role, without a server: which DSNs are accepted, the SCRAM verifier, the tables it owns."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

import pytest

from skyscan.io import archive_role
from skyscan.io.archive import MIGRATIONS, TABLES
from skyscan.io.archive_role import ArchiveRoleError, app_login, scram_verifier, verifies


def test_the_login_is_read_from_the_dsn_and_its_password_is_never_shown() -> None:
    login = app_login("postgresql://skyscan:p%40ss%2Fw@db.example:5432/skyscan_archive?sslmode=require")
    assert (login.role, login.password, login.database) == ("skyscan", "p@ss/w", "skyscan_archive")
    assert "p@ss" not in repr(login)
    assert app_login("postgres://app:pw@h/").database == "app", "the database defaults to the user's name"


@pytest.mark.parametrize(
    ("dsn", "error"),
    [
        ("postgresql://Skyscan:pw@h/db", "role name 'Skyscan'"),
        ("postgresql://sky%22scan:pw@h/db", "role name"),
        ("postgresql://x%27%3B%20drop:pw@h/db", "role name"),
        ("postgresql://pg_monitor:pw@h/db", "not start with pg_"),
        (f"postgresql://{'a' * 64}:pw@h/db", "role name"),
        ("postgresql://app:pw@h/my-db", "database name 'my-db'"),
        ("postgresql://app:pw@h/pg_x", "database name"),
        ("postgresql://app@h/db", "a user and a password"),
        ("postgresql://h/db", "a user and a password"),
        ("mysql://app:pw@h/db", "postgresql:// URL"),
        ("host=h user=app password=pw", "postgresql:// URL"),
        ("postgresql://app:pw@h/db?user=postgres", "not as user="),
    ],
)
def test_only_plain_names_in_a_postgresql_url_are_accepted(dsn: str, error: str) -> None:
    with pytest.raises(ArchiveRoleError, match=re.escape(error)):
        app_login(dsn)


async def test_a_refused_dsn_is_refused_before_connecting() -> None:
    with pytest.raises(ArchiveRoleError, match="role name"):  # no server at port 1
        await archive_role.provision("postgresql://postgres:pw@127.0.0.1:1/postgres", "postgresql://A:b@h/c")


def rfc7677_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """SCRAM-SHA-256's StoredKey and ServerKey, spelled out as RFC 5802 defines them."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hashlib.sha256(client).digest(), hmac.new(salted, b"Server Key", hashlib.sha256).digest()


def test_the_verifier_is_postgresqls_scram_format_and_checks_its_password() -> None:
    salt = bytes(range(16))
    verifier = scram_verifier("s3cret", salt=salt, iterations=4096)
    stored, server = rfc7677_keys("s3cret", salt, 4096)
    salt64, stored64, server64 = (base64.b64encode(b).decode() for b in (salt, stored, server))
    assert verifier == f"SCRAM-SHA-256$4096:{salt64}${stored64}:{server64}"
    assert verifies(verifier, "s3cret")
    assert not verifies(verifier, "s3cret ") and not verifies(verifier, "S3cret")
    assert scram_verifier("s3cret") != scram_verifier("s3cret"), "a new salt each time"
    assert not verifies("md5" + "0" * 32, "s3cret") and not verifies(None, "s3cret")
    assert not verifies("SCRAM-SHA-256$4096:not base64!$x:y", "s3cret")


def test_saslprep_maps_as_postgresql_does() -> None:
    assert archive_role.saslprep("plain ascii\x7f") == "plain ascii\x7f"  # ASCII: as it is
    assert archive_role.saslprep("a\u00a0b\u00adc") == "a bc"  # a non-ASCII space, a soft hyphen
    assert archive_role.saslprep("\u2168") == "IX"  # NFKC
    assert archive_role.saslprep("a\u0000\u00e9") == "a\u0000\u00e9"  # prohibited: the original
    assert verifies(scram_verifier("a\u00a0b"), "a b")


def test_the_role_owns_every_table_the_migrations_create() -> None:
    created = {m for sql in MIGRATIONS for m in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql)}
    assert {"skyscan_schema", *created} == set(TABLES)


def test_the_attributes_set_are_the_ones_checked() -> None:
    words = archive_role.ATTRIBUTES.split()
    assert len(words) == len(archive_role.WANTED)
    spelled = {
        "rolcanlogin": "LOGIN", "rolsuper": "SUPERUSER", "rolcreatedb": "CREATEDB",
        "rolcreaterole": "CREATEROLE", "rolreplication": "REPLICATION", "rolbypassrls": "BYPASSRLS",
        "rolinherit": "INHERIT",
    }  # fmt: skip
    assert set(words) == {w if archive_role.WANTED[c] else f"NO{w}" for c, w in spelled.items()}
