"""What kopf keeps and computes per object, cut to what `on.event` handlers use: nothing.

The operator registers only `on.event` handlers (no change handlers, daemons, timers, indexes or
webhooks), so kopf has no per-object state to carry from one event to the next: no diff base, no
progress, no daemons, no finalizer of its own. By default it still keeps a record of every object it
has seen until the object is deleted (~0.9 KB each: 9 MiB at 10,000 Scans) and deep-copies every
event's whole body to diff it against a base it never stores.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf
from kopf._core.reactor import inventory  # kopf.operator(memories=...) takes this type


class EventMemories(inventory.ResourceMemories):
    """kopf's per-object memory made afresh for each event and never kept.

    What it would hold is unused by event handlers (their memo is the operator-wide one: our handlers
    read only the controller from it) except its error throttler, which only delays the next event's
    processing after kopf itself failed on an object; each event now starts unthrottled."""

    async def recall(
        self,
        raw_body: kopf.RawBody,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> inventory.ResourceMemory:
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True
        )


class NoDiffBase(kopf.DiffBaseStorage):
    """No essence: kopf diffs only for change handlers and daemons, which the operator has none of."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None
