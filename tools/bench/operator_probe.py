"""The operator under `operator_memory.py`: `skyscan-operator`, answering SIGUSR1 with a report of its
memory (appended as a JSON line to $SKYSCAN_BENCH_PROBE_FILE) and SIGUSR2 with one after a full
collection and glibc's malloc_trim. Standard library only, so it adds nothing to what it measures.

$SKYSCAN_BENCH_TRACE (frames) starts tracemalloc first; $SKYSCAN_BENCH_BLOCK names modules, comma-
separated, made unimportable.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

PROBE_FILE = "SKYSCAN_BENCH_PROBE_FILE"
TRACE = "SKYSCAN_BENCH_TRACE"
BLOCK = "SKYSCAN_BENCH_BLOCK"


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def proc_status() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in MiB."""
    wanted = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


def malloc_figures() -> dict[str, float]:
    """glibc's view of its heap, MiB: in use (uordblks + mmapped), free in arenas (fordblks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    m = libc.mallinfo2()
    mib = 1024 * 1024
    return {
        "arena_mib": round(m.arena / mib, 1),
        "in_use_mib": round((m.uordblks + m.hblkhd) / mib, 1),
        "free_in_arenas_mib": round(m.fordblks / mib, 1),
    }


def sockets() -> int:
    """Open sockets (each TLS connection to the API server holds a 256 KiB read buffer)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            pass
    return found


def report(path: Path, top: int = 30) -> None:
    """One stage's figures, appended to `path` as a JSON line."""
    import tracemalloc

    figures: dict[str, Any] = {
        "at": time.time(),
        **proc_status(),
        "malloc": malloc_figures(),
        "python_blocks": sys.getallocatedblocks(),
        "gc_objects": len(gc.get_objects()),
        "modules": len(sys.modules),
        "sockets": sockets(),
    }
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("lineno")
        figures["traced_mib"] = round(sum(s.size for s in stats) / 2**20, 1)
        figures["tracemalloc_overhead_mib"] = round(tracemalloc.get_tracemalloc_memory() / 2**20, 1)
        figures["top"] = [
            f"{s.size / 2**20:7.2f} MiB {s.count:8d} {s.traceback[0].filename}:{s.traceback[0].lineno}"
            for s in stats[:top]
        ]
        by_file: dict[str, int] = {}
        for s in stats:
            by_file[s.traceback[0].filename] = by_file.get(s.traceback[0].filename, 0) + s.size
        biggest = sorted(by_file.items(), key=lambda x: -x[1])[:top]
        figures["top_files"] = [f"{size / 2**20:7.2f} MiB {name}" for name, size in biggest]
    with path.open("a") as f:
        f.write(json.dumps(figures) + "\n")


def report_trimmed(path: Path) -> None:
    """A report after a full collection and glibc's malloc_trim: what the allocators could give back."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    report(path)


def probe() -> int:
    """The operator, answering SIGUSR1 with a report (written from its event loop's thread)."""
    for name in filter(None, os.environ.get(BLOCK, "").split(",")):
        sys.modules[name] = None  # type: ignore[assignment]
    if frames := int(os.environ.get(TRACE, "0")):
        import tracemalloc

        tracemalloc.start(frames)
    path = Path(os.environ[PROBE_FILE])
    signal.signal(signal.SIGUSR1, lambda *_: report(path))
    signal.signal(signal.SIGUSR2, lambda *_: report_trimmed(path))
    from skyscan_operator.handlers import main

    return main([])


if __name__ == "__main__":
    sys.exit(probe())
