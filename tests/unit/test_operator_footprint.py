"""What the operator keeps per object in kopf and what it imports (its memory at 10,000 Scans)."""

from __future__ import annotations

import subprocess
import sys

import kopf

from skyscan_operator.kopf_state import EventMemories, NoDiffBase


def scan(uid: str) -> dict[str, object]:
    return {"metadata": {"namespace": "ns", "name": f"s-{uid}", "uid": uid}, "spec": {"priority": 1}}


async def test_kopf_remembers_no_object_between_events() -> None:
    memories, memobase = EventMemories(), kopf.Memo(controller="c")
    first = await memories.recall(scan("u1"), memobase=memobase, noticed_by_listing=True)
    again = await memories.recall(scan("u1"), memobase=memobase)
    assert first is not again and first.memo["controller"] == "c" and first.noticed_by_listing
    assert list(memories.iter_all_memories()) == []


def test_kopf_builds_no_diff_base() -> None:
    storage = NoDiffBase()
    body = kopf.Body(scan("u1"))
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None


def test_the_operator_does_not_import_what_it_never_runs() -> None:
    """asyncpg until an archive is connected, kubernetes_asyncio's models and httpx's command line never."""
    unwanted = ("asyncpg", "kubernetes_asyncio", "httpx._main", "rich", "click")
    code = (
        "import sys, skyscan_operator.handlers\n"
        f"print(','.join(m for m in {unwanted!r} if sys.modules.get(m) is not None))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
