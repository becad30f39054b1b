"""A local PostgreSQL server for the archive: `make up` runs one, the test session runs another.

Everything lives in one directory: `data/` (the cluster, owned by the server's user, its unix
socket inside), `password` (the superuser's, mode 0600), `app-password` (the archive's role's, made
on first use, mode 0600), `server.json` (pid, command line, port) and `postgres.log`. The data
survives `stop`; `start` on the same directory finds it again.

Two logins: the superuser, only over the unix socket and loopback, and the archive's least-privilege
role `skyscan` (`ensure_app_login`: skyscan.io.archive_role), which alone may also log in from the
`clients` networks, to its own database only.

The binaries: `pg_config --bindir`, else the newest Debian `/usr/lib/postgresql/<version>/bin`,
else (as root) `apt-get install -y postgresql`. PostgreSQL refuses to run as root, so as root the
server runs as the `postgres` user the package creates, and the directory must be reachable by it.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

from skyscan.io import archive_role
from skyscan_local import processes

SUPERUSER = "postgres"
SERVER_USER = "postgres"  # the OS user the server runs as when we are root
STATE_FILE, PASSWORD_FILE, LOG_FILE = "server.json", "password", "postgres.log"
APP_PASSWORD_FILE = "app-password"
APP_ROLE = APP_DATABASE = "skyscan"  # the archive's least-privilege login and its database
HBA_KEYWORDS = {"all", "sameuser", "samerole", "samegroup", "replication"}
DEBIAN_BINARIES = Path("/usr/lib/postgresql")


class PostgresError(RuntimeError):
    pass


@dataclass(frozen=True)
class Server:
    """A server we started, as its directory records it."""

    dir: str
    port: int
    pid: int
    argv: tuple[str, ...]

    def recorded(self) -> processes.Recorded:
        return processes.Recorded(self.pid, self.argv)

    def running(self) -> bool:
        return self.recorded().alive()

    def dsn(self, database: str = "postgres") -> str:
        """The superuser's DSN (over loopback)."""
        password = (Path(self.dir) / PASSWORD_FILE).read_text().strip()  # hex: safe in a URL
        return f"postgresql://{SUPERUSER}:{password}@127.0.0.1:{self.port}/{database}"

    def app_dsn(self, role: str = APP_ROLE, database: str = APP_DATABASE) -> str:
        """The archive's role's DSN (over loopback); its password is made on first use and kept.
        The role exists once `ensure_app_login` has run."""
        password = processes.kept_secret(Path(self.dir) / APP_PASSWORD_FILE)  # hex: safe in a URL
        return f"postgresql://{_checked(role)}:{password}@127.0.0.1:{self.port}/{_checked(database)}"


def _has_server(bindir: Path) -> bool:
    return (bindir / "postgres").is_file() and (bindir / "initdb").is_file()


def _debian_bindir() -> Path | None:
    """The newest major version among Debian's side-by-side installs."""
    found = [d / "bin" for d in DEBIAN_BINARIES.glob("*") if d.name.isdigit() and _has_server(d / "bin")]
    return max(found, key=lambda b: int(b.parent.name), default=None)


def _pg_config_bindir() -> Path | None:
    """pg_config may come with the client library only (libpq-dev): it counts if the server is there."""
    if not shutil.which("pg_config"):
        return None
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
    bindir = Path(out.stdout.strip())
    return bindir if out.returncode == 0 and _has_server(bindir) else None


def find_bindir() -> Path | None:
    return _pg_config_bindir() or _debian_bindir()


def ensure_bindir() -> Path:
    """The server binaries, installed from the distribution first if we may (root) and must."""
    if found := find_bindir():
        return found
    if os.geteuid() != 0:
        raise PostgresError(
            "no PostgreSQL server binaries found; install PostgreSQL (e.g. apt-get install postgresql)"
        )
    print("installing PostgreSQL (apt-get install -y postgresql)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PostgresError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    if found := find_bindir():
        return found
    raise PostgresError("apt-get installed postgresql, but no server binaries were found")


def _server_user() -> pwd.struct_passwd | None:
    """Whom the server runs as: None for ourselves, the `postgres` user when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresError(
            f"running as root, but there is no `{SERVER_USER}` user to run PostgreSQL"
        ) from None


def _closed_ancestor(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first directory on the way to `path` that `user` may not pass through, if any."""
    groups = {user.pw_gid, *(g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem)}
    for d in reversed(path.parents):
        st = d.stat()
        if st.st_uid == user.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return d
    return None


def _init(root: Path, bindir: Path, user: pwd.struct_passwd | None, durable: bool) -> None:
    """A new cluster in root/data whose superuser has a generated password (TCP logins need it;
    the unix socket, inside the data directory only its owner may enter, trusts)."""
    data = root / "data"
    if (data / "PG_VERSION").exists():
        return
    if data.is_dir() and any(data.iterdir()):  # never deleted by us: it may be someone's data
        raise PostgresError(
            f"{data} holds files but no PostgreSQL cluster (a first start killed during initdb?); "
            f"nothing was deleted: move it away, or `make down && make reset` deletes {root}"
        )
    password = secrets.token_hex(16)
    (root / PASSWORD_FILE).write_text(password + "\n")
    (root / PASSWORD_FILE).chmod(0o600)
    data.mkdir(mode=0o700, exist_ok=True)
    # initdb reads the password from a file; the server's user must be able to open it.
    pwfile = root / "initdb-password"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    if user is not None:
        root.chmod(0o711)  # the server's user passes through, and reads nothing else here
        for path in (data, pwfile):
            os.chown(path, user.pw_uid, user.pw_gid)
    argv = [
        str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, f"--pwfile={pwfile}", "-E", "UTF8",
        "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256",
        *([] if durable else ["--no-sync"]),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False,
            user=user.pw_uid if user else None, group=user.pw_gid if user else None,
            extra_groups=[] if user else None, cwd="/" if user else None,
        )  # fmt: skip
    finally:
        pwfile.unlink()
    if done.returncode != 0:
        raise PostgresError(f"initdb failed in {data}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _argv(bindir: Path, data: Path, port: int, durable: bool) -> list[str]:
    # Tests throw their server away: they need no crash safety, and skipping fsync makes
    # CREATE DATABASE per test cheap.
    fast = (
        [] if durable else ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    )
    return [
        str(bindir / "postgres"), "-D", str(data), "-p", str(port),
        "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={data}", *fast,
    ]  # fmt: skip


def hba_lines(clients: tuple[str, ...], role: str = APP_ROLE, database: str = APP_DATABASE) -> list[str]:
    """Who may log in (pg_hba.conf, first match wins): anyone over the unix socket (inside the data
    directory, which only the server's user may enter) and with a password from loopback, so the
    superuser only there; from `clients` (CIDRs, e.g. a local node's Pod network) only `role`, to
    `database`, with its password; nobody from anywhere else."""
    lines = [
        "local all all trust",
        "host all all 127.0.0.1/32 scram-sha-256",
        "host all all ::1/128 scram-sha-256",
    ]
    if {role, database} & HBA_KEYWORDS:
        raise ValueError(f"not a name pg_hba.conf takes literally: {role!r}, {database!r}")
    lines += [f"host {_checked(database)} {_checked(role)} {cidr} scram-sha-256" for cidr in clients]
    return [*lines, "host all all 0.0.0.0/0 reject", "host all all ::/0 reject"]


def _write_hba(
    data: Path, clients: tuple[str, ...], role: str = APP_ROLE, database: str = APP_DATABASE
) -> None:
    """hba_lines into the cluster's pg_hba.conf: rewritten at each start (initdb's file is ours to
    replace)."""
    (data / "pg_hba.conf").write_text("\n".join(hba_lines(clients, role, database)) + "\n")  # keeps its owner


def load(root: Path) -> Server | None:
    f = root / STATE_FILE
    if not f.exists():
        return None
    raw = json.loads(f.read_text())
    return Server(dir=raw["dir"], port=int(raw["port"]), pid=int(raw["pid"]), argv=tuple(raw["argv"]))


def _ready(bindir: Path, port: int) -> bool:
    probe = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER]
    return subprocess.run(probe, check=False).returncode == 0


def start(
    root: Path,
    *,
    port: int = 0,
    durable: bool = True,
    clients: tuple[str, ...] = (),
    tie_to_parent: bool = False,
    timeout: float = 60.0,
) -> Server:
    """Start the server of `root` (initialized on first use) on `port` if free (0: any free port);
    returns once it accepts connections. Stopped again if it does not get there. `clients`: CIDRs
    besides loopback from which the archive's role (APP_ROLE, only it) may log in with its password."""
    current = load(root)
    if current and current.running():
        raise PostgresError(f"a PostgreSQL server already runs from {root} (pid {current.pid})")
    bindir, user = ensure_bindir(), _server_user()
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if user is not None and (closed := _closed_ancestor(root, user)):
        raise PostgresError(f"user {user.pw_name} cannot reach {root}: {closed} is closed to it")
    _init(root, bindir, user, durable)
    _write_hba(root / "data", clients)
    port = processes.pick_port(port)
    argv = _argv(bindir, root / "data", port, durable)
    log = root / LOG_FILE
    proc = processes.spawn(argv, log, tie_to_parent=tie_to_parent, user=user)
    server = Server(dir=str(root), port=port, pid=proc.pid, argv=tuple(argv))
    (root / STATE_FILE).write_text(json.dumps(asdict(server)))
    try:
        processes.wait_until(
            lambda: _ready(bindir, port), "PostgreSQL", timeout, proc=proc, log=log, error=PostgresError
        )
    except BaseException:
        stop(root)
        raise
    return server


def stop(root: Path, timeout: float = 30.0) -> bool:
    """Stop the server recorded in `root` (a fast shutdown: clients are disconnected); keeps its data,
    and its record (the port it had, for `ensure`). Returns whether it was running."""
    current = load(root)
    if current is None:
        return False
    was_running = current.running()
    processes.stop([current.recorded()], timeout, sig=signal.SIGINT)
    return was_running


def ensure(
    root: Path, *, port: int = 0, clients: tuple[str, ...] = (), tie_to_parent: bool = False
) -> Server:
    """The server recorded in `root` if it runs, else a new start on the same data: on the port it had
    if free (so the DSN in `.skyscan/env` and in running components stays), else on `port`, else any."""
    current = load(root)
    if current and current.running():
        return current
    chosen = processes.choose_port(current.port if current else None, port, keeps=False)
    return start(root, port=chosen, clients=clients, tie_to_parent=tie_to_parent)


def _checked(name: str) -> str:
    """A database name we make up ourselves, safe to quote into SQL."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"not a database name: {name!r}")
    return name


def with_database(dsn: str, name: str) -> str:
    """The same server and login, another database."""
    return urlsplit(dsn)._replace(path=f"/{name}").geturl()


async def create_database(admin_dsn: str, name: str, *, exist_ok: bool = False) -> str:
    """Create database `name` (from template0: nothing anyone added to template1); returns its DSN.
    `admin_dsn`: a login allowed to create databases."""
    quoted = f'"{_checked(name)}"'
    conn = await asyncpg.connect(admin_dsn)
    try:
        exists = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name)
        if not (exists and exist_ok):
            await conn.execute(f"CREATE DATABASE {quoted} TEMPLATE template0")
    finally:
        await conn.close()
    return with_database(admin_dsn, name)


async def ensure_app_login(server: Server, role: str = APP_ROLE, database: str = APP_DATABASE) -> str:
    """The archive's least-privilege login on `server` (skyscan.io.archive_role: the role, its database,
    its ownership of Skyscan's tables), made or brought back to what it should be; returns its DSN."""
    dsn = server.app_dsn(role, database)
    try:
        await archive_role.provision(server.dsn(), dsn)
    except archive_role.ArchiveRoleError as e:
        raise PostgresError(f"the archive's role: {e}") from e
    return dsn


async def _execute(admin_dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database `name`, disconnecting whoever still uses it."""
    await _execute(admin_dsn, f'DROP DATABASE IF EXISTS "{_checked(name)}" WITH (FORCE)')


async def drop_role(admin_dsn: str, name: str) -> None:
    """Drop role `name` if it exists (after the databases it owns: what it owns elsewhere stops it)."""
    await _execute(admin_dsn, f'DROP ROLE IF EXISTS "{_checked(name)}"')
