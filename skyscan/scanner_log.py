"""A scanner's log as Skyscan keeps it once its container ended, and which Pod's log may be read (pure).

The kept copy is the log's head and tail, each at most a set number of bytes (the operator's
`SKYSCAN_SCANNER_LOG_END_BYTES`), with one marker line where bytes were cut, saying
how many, and a last line saying how the container ended (its reason, exit code and time), which is
what a reader of an OOMKilled scanner's log wants first. Read a log as a stream, `HeadTail.feed` one
chunk at a time: whatever the log's size, at most head + tail bytes are held.

The shim reads a running scanner's log from the API server by its Pod's name, which comes from the
Scan's status (`status.job.pod`, written by the operator) and never from a request; `is_scanner_pod`
checks that the name is one the Job controller gives to that scan's Job's Pods, so no Scan status, even
one written by hand, can make the shim read another Pod's log.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Mapping
from typing import Any

from skyscan import names

# The Job controller names a Job's Pods `<job name>-` + 5 random characters of this alphabet, the base
# cut to 58 characters first (`generateName`: names.k8s.io SimpleNameGenerator).
_GENERATED_BASE = 58
_GENERATED_SUFFIX = re.compile(r"[bcdfghjklmnpqrstvwxz2456789]{5}")


def is_scanner_pod(scan_id: str, pod: str) -> bool:
    """Whether `pod` is a name the Job controller gives to a Pod of this scan's scanner Job."""
    base = f"{names.job_name(scan_id)}-"[:_GENERATED_BASE]
    return pod.startswith(base) and _GENERATED_SUFFIX.fullmatch(pod[len(base) :]) is not None


def marker(cut: int) -> bytes:
    """The line standing where `cut` bytes of the log were left out."""
    return f"[skyscan: {cut} bytes of this log cut here]\n".encode()


def ending(terminated: Mapping[str, Any]) -> bytes:
    """The last line of a kept log: how the container ended, from its `state.terminated`."""
    reason = str(terminated.get("reason") or "unknown reason")
    code = terminated.get("exitCode")
    at = terminated.get("finishedAt") or "an unknown time"
    return f"[skyscan: the scanner container ended: {reason}, exit code {code}, at {at}]\n".encode()


class HeadTail:
    """The first `head` and the last `tail` bytes of a stream fed to it a chunk at a time, and how
    many bytes it was in all."""

    def __init__(self, head: int, tail: int) -> None:
        self.head_limit, self.tail_limit = max(head, 0), max(tail, 0)
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = max(self.head_limit - len(self.head), 0)
        self.head += chunk[:room]
        self.tail += chunk[room:]  # at most the tail and one chunk held
        del self.tail[: max(len(self.tail) - self.tail_limit, 0)]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self, last_line: bytes = b"") -> bytes:
        """The log as kept: its head, the marker if anything was cut, its tail, then `last_line`;
        every part on lines of its own (a newline ends each that lacks one)."""
        parts = [bytes(self.head), marker(self.cut) if self.cut else b"", bytes(self.tail), last_line]
        return b"".join(_ended_line(part) for part in parts)

    def shrunk(self) -> HeadTail:
        """The same log kept in half the room (head and tail halved; the total unchanged)."""
        half = HeadTail(self.head_limit // 2, self.tail_limit // 2)
        half.head = self.head[: half.head_limit]
        half.tail = self.tail[len(self.tail) - min(len(self.tail), half.tail_limit) :]
        half.total = self.total
        return half


def _ended_line(part: bytes) -> bytes:
    return part + b"\n" if part and not part.endswith(b"\n") else part


def compressed(kept: HeadTail, last_line: bytes, limit: int) -> tuple[bytes, HeadTail]:
    """The kept log gzip-compressed within `limit` bytes: the head and tail halved until it fits (a log
    that compresses badly keeps less of itself), and what was kept."""
    while True:
        data = gzip.compress(kept.text(last_line), compresslevel=6, mtime=0)
        if len(data) <= limit or not (kept.head or kept.tail):
            return data, kept
        kept = kept.shrunk()
