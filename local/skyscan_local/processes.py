"""Supervision of the local harness's background processes, shared by the control plane and the stack.

Both start long-lived programs that must outlive the command that started them (`make up` returns),
recognise them later from a recorded pid alone (a pid is recycled once its process is gone), stop
them without hanging on one that ignores SIGTERM, and gate every next step on readiness.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

_PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>
POLL_SECONDS = 0.2
START_MARKER = "--- skyscan: started"  # the line `spawn` writes to a log before each start


def write_private(path: Path, text: str) -> None:
    """`text` as the whole of `path`, readable by its owner only from the first byte (mode 0600), put in
    place at once (never seen partly written)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def kept_secret(path: Path, nbytes: int = 16) -> str:
    """The random hex secret kept in `path`, made on first use: written whole to a file of mode 0600,
    then linked into place, so it is never seen partly written and two first uses keep the same one."""
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(nbytes) + "\n")
        with contextlib.suppress(FileExistsError):  # another made it first: theirs is kept
            os.link(tmp, path)
        tmp.unlink()
    return path.read_text().strip()


def die_with_parent() -> None:
    """preexec hook: the child gets SIGKILL when the thread that started it exits (Linux).

    Tests and benches start whole clusters; when they crash, nothing may be left running."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def command_line(pid: int) -> list[str] | None:
    """The argv `pid` runs now; None when there is no such process ([] for a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1]


@dataclass(frozen=True)
class Recorded:
    """A process we started, as a state file remembers it: its pid and the argv it was started with
    (or the start of that argv). Only the pid is not enough: the kernel reuses it for another program."""

    pid: int
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("an empty argv would match any process")

    def alive(self) -> bool:
        """It still runs: the pid's command line starts with the recorded one (a zombie's is empty)."""
        return (command_line(self.pid) or [])[: len(self.argv)] == list(self.argv)


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    tie_to_parent: bool = False,
    user: pwd.struct_passwd | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a session of its own, so that it outlives the command that started it and a
    Ctrl-C there does not reach it. Output is appended to `log` after a `START_MARKER` line: what a
    component wrote before it died is kept, and readiness checks and error messages read this run's
    part (`this_run`). `env` is added to the inherited environment. With `user` (we are root), it runs
    as that user, from `/` (our working directory may be closed to it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        out.write(f"\n{START_MARKER} {stamp}: {Path(argv[0]).name} ---\n".encode())
        out.flush()
        return subprocess.Popen(
            list(argv),
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if tie_to_parent else None,  # runs after the user switch
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            cwd="/" if user else None,
        )


def _signal(p: Recorded, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended since we looked
        os.kill(p.pid, sig)


def _reap(pid: int, block: bool) -> None:
    """Collect the exit status when the process is our own child (tests): an exited child of ours
    stays a zombie until we do. A no-op for anyone else's process."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0 if block else os.WNOHANG)


def stop(procs: Iterable[Recorded], timeout: float = 15.0, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send `sig` (SIGTERM) to every recorded process that still runs, all at once so they shut down in
    parallel (pass them newest first); SIGKILL whichever still runs `timeout` seconds later. A pid that
    runs something else now is left alone."""
    recorded = list(procs)
    running = [p for p in recorded if p.alive()]
    for p in running:
        _signal(p, sig)
    deadline = time.monotonic() + timeout
    for p in running:
        while p.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if p.alive():
            _signal(p, signal.SIGKILL)
    for p in recorded:
        _reap(p.pid, block=p in running)


def kill(p: Recorded) -> None:
    """SIGKILL, as a crash would (tests bring components down this way); reaped when it is our child."""
    if p.alive():
        _signal(p, signal.SIGKILL)
        _reap(p.pid, block=True)


def this_run(log: Path, block: int = 1 << 16) -> str:
    """What the latest start of a component wrote to its log: the text after the last START_MARKER,
    that is from the offset where this start began. Read backwards from the end, so a readiness check
    polling it costs what this run wrote, not what the earlier runs appended before it."""
    if not log.exists():
        return ""
    marker, found = START_MARKER.encode(), b""
    with log.open("rb") as f:
        position = f.seek(0, os.SEEK_END)
        while position > 0:
            step = min(block, position)
            position -= step
            f.seek(position)
            found = f.read(step) + found
            if (at := found.rfind(marker)) >= 0:
                return found[at + len(marker) :].decode(errors="replace")
    return found.decode(errors="replace")  # written before any marker: all of it


def tail(log: Path, chars: int = 3000) -> str:
    """The end of a log's latest run, for error messages."""
    return this_run(log)[-chars:]


def wait_until(
    check: Callable[[], bool],
    what: str,
    timeout: float,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    error: type[Exception] = RuntimeError,
) -> None:
    """Poll `check` until it holds; raise `error` (with the log's end) after `timeout` seconds, or as
    soon as `proc` exits: a crashed component must not cost the whole timeout. Connection errors
    count as "not yet": a server is probed before it listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise error(_failure(f"{what} exited with status {proc.returncode} during start-up", log))
        with contextlib.suppress(httpx.HTTPError, OSError):
            if check():
                return
        time.sleep(POLL_SECONDS)
    raise error(_failure(f"{what} not ready after {timeout:.0f}s", log))


def _failure(message: str, log: Path | None) -> str:
    return f"{message}; log {log}:\n{tail(log)}" if log else message


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """`port` can be bound on loopback now by a server (which sets SO_REUSEADDR, as aiohttp and Go do):
    only a listener holds it, not the TIME_WAIT connections a killed server leaves behind."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    """`preferred` when it is free (stable URLs across `make up`), else any free port; 0: any."""
    return preferred if preferred and port_free(preferred) else free_port()


def choose_port(
    had: int | None, preferred: int, *, keeps: bool, free: Callable[[int], bool] = port_free
) -> int:
    """The port of a component that starts again: a running one keeps (`keeps`) the port it had; a
    stopped one gets it back if free (its clients, a scanner's Pod or a sourced `.skyscan/env`, still
    use that address), else the preferred one, else any; `None`/0: none."""
    if keeps and had:
        return had
    for candidate in (had, preferred):
        if candidate and free(candidate):
            return candidate
    return free_port()
