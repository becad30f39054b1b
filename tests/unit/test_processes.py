"""Process supervision of the local harness, with real (short-lived) processes and sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skyscan_local import processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# Says "term" on SIGTERM and carries on; says "ready" once that handler is in place.
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)",
]


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; killed afterwards whatever the test did."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def run(started: list[subprocess.Popen[bytes]], argv: list[str], **kwargs: object) -> processes.Recorded:
    proc = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
    started.append(proc)
    recorded = processes.Recorded(proc.pid, tuple(argv))
    assert eventually(recorded.alive)  # until the child has exec'd, /proc shows our own argv
    return recorded


def test_a_recorded_process_counts_only_while_its_pid_runs_the_recorded_command(
    started: list[subprocess.Popen[bytes]],
) -> None:
    p = run(started, SLEEPER)
    assert processes.Recorded(p.pid, (sys.executable,)).alive()  # a prefix: the binary alone will do
    assert not processes.Recorded(p.pid, (*SLEEPER, "other")).alive()  # a recycled pid
    assert not processes.Recorded(p.pid, ("/usr/bin/something-else",)).alive()
    with pytest.raises(ValueError):
        processes.Recorded(p.pid, ())
    started[0].kill()
    started[0].wait(timeout=10)
    assert not p.alive()


def test_stop_ends_a_process_with_sigterm_without_waiting_for_the_timeout(
    started: list[subprocess.Popen[bytes]],
) -> None:
    p = run(started, SLEEPER)
    began = time.monotonic()
    processes.stop([p], timeout=30)
    assert time.monotonic() - began < 10
    assert started[0].poll() is not None and not p.alive()


def test_stop_kills_a_process_that_ignores_sigterm(started: list[subprocess.Popen[bytes]]) -> None:
    p = run(started, STUBBORN, stdout=subprocess.PIPE)
    out = started[0].stdout
    assert out is not None and out.readline() == b"ready\n"
    began = time.monotonic()
    # Long enough for the child to be scheduled and run its handler on a loaded machine (0.5 s was not).
    processes.stop([p], timeout=2)
    assert time.monotonic() - began >= 2  # it waited for SIGTERM to work before killing
    assert started[0].poll() is not None and not p.alive()
    assert out.read() == b"term\n"  # it did get SIGTERM first, and outlived it


def test_stop_leaves_alone_a_pid_that_runs_something_else_now(started: list[subprocess.Popen[bytes]]) -> None:
    p = run(started, SLEEPER)
    processes.stop([processes.Recorded(p.pid, ("/usr/bin/what-we-once-started",))], timeout=1)
    assert started[0].poll() is None and p.alive()


def test_a_child_started_with_die_with_parent_ends_with_the_process_that_started_it(
    started: list[subprocess.Popen[bytes]],
) -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys\n"
            "from skyscan_local import processes\n"
            f"child = subprocess.Popen({SLEEPER!r}, preexec_fn=processes.die_with_parent)\n"
            "print(child.pid, flush=True)\n"
            "sys.stdin.read()\n",  # until the test closes stdin
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    started.append(parent)
    assert parent.stdout is not None and parent.stdin is not None
    child = processes.Recorded(int(parent.stdout.readline()), tuple(SLEEPER))
    try:
        assert eventually(child.alive)
        parent.stdin.close()
        parent.wait(timeout=10)
        assert eventually(lambda: not child.alive())
    finally:
        processes.stop([child], timeout=1)  # only if the test failed: it is not our child


def test_spawn_appends_to_the_log_and_a_readiness_check_reads_this_run_only(
    started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """What a component wrote before it died is evidence: a restart appends after a marker line."""
    log = tmp_path / "logs" / "echo.log"
    log.parent.mkdir()
    log.write_text("output of an earlier run: ready\n")
    argv = [sys.executable, "-c", "import os; print(os.environ['SKYSCAN_X'])"]
    for _ in range(2):
        proc = processes.spawn(argv, log, env={"SKYSCAN_X": "from spawn"})
        started.append(proc)
        assert proc.wait(timeout=30) == 0
    text = log.read_text()
    assert text.startswith("output of an earlier run: ready\n") and text.count(processes.START_MARKER) == 2
    assert processes.this_run(log).endswith("\nfrom spawn\n") and "ready" not in processes.this_run(log)
    assert "earlier run" not in processes.tail(log)


def test_this_run_is_read_back_from_the_end_to_the_latest_start_only(tmp_path: Path) -> None:
    """Logs now grow over every run: a readiness check reads from where this start began."""
    log = tmp_path / "c.log"
    earlier = b"an earlier run: ready\n" * 50_000
    log.write_bytes(earlier + f"\n{processes.START_MARKER} now: c ---\n".encode() + b"this run\n")
    for block in (5, 64, 1 << 16):  # the marker straddling blocks too
        assert processes.this_run(log, block) == " now: c ---\nthis run\n"
    log.write_bytes(b"before any marker\n")
    assert processes.this_run(log, 4) == "before any marker\n"
    assert processes.this_run(tmp_path / "none.log") == ""


def test_wait_until_returns_once_the_check_holds_and_counts_connection_errors_as_not_yet() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionRefusedError
        return len(calls) == 3

    processes.wait_until(check, "thing", timeout=10)
    assert len(calls) == 3


def test_wait_until_fails_at_once_with_the_log_when_the_process_exits(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    proc = processes.spawn([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log)
    began = time.monotonic()
    with pytest.raises(LookupError, match=r"(?s)crasher exited with status 3 during start-up.*boom"):
        processes.wait_until(lambda: False, "crasher", timeout=60, proc=proc, log=log, error=LookupError)
    assert time.monotonic() - began < 30


def test_wait_until_gives_up_after_the_timeout() -> None:
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="never not ready after 0s"):
        processes.wait_until(lambda: False, "never", timeout=0.3)
    assert time.monotonic() - began >= 0.3


def test_a_free_port_can_be_bound_and_a_taken_one_is_not_free() -> None:
    port = processes.free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not processes.port_free(port)
        other = processes.pick_port(port)  # the preferred port is taken: another one
        assert other != port and processes.port_free(other)
    assert processes.port_free(port)
    assert processes.pick_port(port) == port  # free again: the preferred one
    assert processes.pick_port(0) != 0  # no preference


def test_a_restarted_component_gets_its_port_back_before_the_preferred_one() -> None:
    """A crashed shim came back on 8080 instead of the port it had, and scanners still using the old
    address aborted their scans. The stack's components and the local PostgreSQL choose this way."""
    free = {18080, 8080}.__contains__
    assert processes.choose_port(18080, 8080, keeps=False, free=free) == 18080
    assert processes.choose_port(18080, 8080, keeps=True, free=lambda _: False) == 18080  # it runs there
    assert processes.choose_port(18081, 8080, keeps=False, free=free) == 8080  # taken meanwhile
    assert processes.choose_port(None, 8080, keeps=False, free=free) == 8080
    assert processes.choose_port(None, 0, keeps=False, free=free) not in (0, 8080, 18080)
