"""A scan's changes as `ScanEvent`s: the Server-Sent Events of `GET /scan/{id}/events`, or polling.

The stream's messages (`event: scan`, `data:` one JSON line) carry the scan's status, its progress and
whether a result exists; `event: end` follows the message that shows a terminal state. Without the
stream, `ScanEvent.polled` builds the same thing from `GET /status` and the manifest's progress.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

FINAL_STATE = "SCAN_HAS_FINAL_RESULT"


@dataclass(frozen=True)
class SseMessage:
    event: str
    data: str
    id: str | None


def parse_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """The messages of a text/event-stream, one per blank-line-terminated block (comments skipped)."""
    event, data, last_id = "message", list[str](), None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SseMessage(event, "\n".join(data), last_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            last_id = value


@dataclass(frozen=True)
class ScanEvent:
    """One state of a scan as a follower sees it."""

    scan_id: str
    status: dict[str, Any]
    progress: dict[str, Any] | None
    result: dict[str, Any] | None  # None: no result yet; else {"is_final": bool}
    version: str | None = None  # the Scan's resourceVersion, when the stream gave it

    @classmethod
    def from_stream(cls, message: SseMessage) -> ScanEvent:
        doc = json.loads(message.data)
        return cls(doc["scan_id"], doc["status"], doc.get("progress"), doc.get("result"), message.id)

    @classmethod
    def polled(cls, scan_id: str, status: dict[str, Any], progress: dict[str, Any] | None) -> ScanEvent:
        final = bool(status.get("scan_complete"))
        return cls(scan_id, status, progress, {"is_final": True} if final else None)

    @property
    def state(self) -> str:
        return str(self.status.get("scan_state", ""))

    @property
    def has_final_result(self) -> bool:
        return self.state == FINAL_STATE or bool(self.status.get("scan_complete"))

    @property
    def aborted(self) -> bool:
        """Deleted, replaced, its workflow aborted or the scan failed, without a final result."""
        deactivated = str(self.status.get("wms_deactivated") or "").upper()
        ended = deactivated == "ABORTED" or self.state.startswith("ABORTED__")
        return not self.has_final_result and (bool(self.status.get("is_deleted")) or ended)

    @property
    def terminal(self) -> bool:
        """Nothing more will happen: what polling can tell (the stream also ends on failures)."""
        return self.has_final_result or self.aborted or bool(self.status.get("wms_deactivated"))

    def same_as(self, other: ScanEvent | None) -> bool:
        return other is not None and (self.status, self.progress, self.result) == (
            other.status,
            other.progress,
            other.result,
        )
