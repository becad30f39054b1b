"""`skyscan follow`: a scan's progress as it happens, from `Client.events`.

On a terminal, one live panel (rich): state, pixels done/total per nside, workers, reco rate, ETA.
Elsewhere (a pipe, a CI log), one line per change; with `--json`, one JSON object per change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from skyscan_client.events import ScanEvent
from skyscan_client.exit_codes import ABORTED, FAILED, OK


def nside_rows(progress: dict[str, Any] | None) -> list[tuple[int, int, int]]:
    """(nside, pixels done, pixels generated) for each nside the scanner has started, coarse first."""
    nsides = ((progress or {}).get("tallies") or {}).get("nsides") or {}
    rows = []
    for nside, tally in nsides.items():
        pixels = (tally or {}).get("pixels") or {}
        rows.append((int(nside), int(pixels.get("done") or 0), int(pixels.get("generated") or 0)))
    return sorted(rows)


def workers(status: dict[str, Any]) -> str:
    workforce = status.get("wms_workforce") or {}
    text = f"{workforce.get('n_running', 0)} running"
    counts = [f"{k}: {v}" for k, v in _flat(workforce.get("statuses") or {})]
    return text + (f" ({', '.join(counts)})" if counts else "")


def _flat(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """The WMS's compound statuses ({"RUNNING": {"Tasking": 2}}) as ("RUNNING/Tasking", 2) pairs."""
    pairs: list[tuple[str, Any]] = []
    for key, value in sorted(tree.items()):
        name = f"{prefix}{key}"
        pairs += _flat(value, f"{name}/") if isinstance(value, dict) else [(name, value)]
    return pairs


def rate(progress: dict[str, Any] | None) -> str:
    """The scanner's mean wall time per reconstruction, once recos come back."""
    stats = (progress or {}).get("processing_stats") or {}
    wall = ((stats.get("rate") or {}).get("all recos") or {}).get("wall time") or {}
    return f"{wall['mean reco']} per reco" if wall.get("mean reco") else "-"


def eta(progress: dict[str, Any] | None) -> str:
    stats = (progress or {}).get("processing_stats") or {}
    if stats.get("finished"):
        return "done"
    predictions = stats.get("predictions") or {}
    left = predictions.get("time left")
    return f"{left} left (ends {predictions.get('end', '?')})" if left else "-"


def outcome(last: ScanEvent | None) -> int:
    """The exit code for how the followed scan ended (the stream also ends on failures)."""
    if last is not None and last.has_final_result:
        return OK
    if last is not None and last.aborted:
        return ABORTED
    return FAILED


def line(event: ScanEvent, elapsed: float) -> str:
    done = sum(d for _, d, _ in nside_rows(event.progress))
    total = sum(g for _, _, g in nside_rows(event.progress))
    pixels = f"{done}/{total} pixels" if total else "no pixels yet"
    summary = (event.progress or {}).get("summary", "")
    return (
        f"[{elapsed:6.1f}s] {event.state:45} {pixels:16} workers {workers(event.status)}  {summary}".rstrip()
    )


def panel(event: ScanEvent, elapsed: float) -> Group:
    colour = "green" if event.has_final_result else "red" if event.terminal else "cyan"
    head = Text.assemble(("scan ", "bold"), event.scan_id, "  ", (event.state, f"bold {colour}"))
    head.append(f"  {elapsed:.0f}s")
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for name in ("nside", "pixels", ""):
        table.add_column(name, justify="right" if name else "left")
    for nside, done, generated in nside_rows(event.progress):
        bar = ProgressBar(total=max(generated, 1), completed=done, width=30)
        table.add_row(str(nside), f"{done}/{generated}", bar)
    facts = Table.grid(padding=(0, 2))
    facts.add_row("workers", workers(event.status))
    facts.add_row("rate", rate(event.progress))
    facts.add_row("ETA", "done" if event.has_final_result else eta(event.progress))
    facts.add_row("result", "final" if event.has_final_result else "partial" if event.result else "none yet")
    summary = Text((event.progress or {}).get("summary", ""), style="dim")
    return Group(head, table, facts, summary)


def follow(events: Iterable[ScanEvent], console: Console, *, as_json: bool = False) -> int:
    began = time.monotonic()
    last: ScanEvent | None = None
    if as_json or not console.is_terminal:
        for event in events:
            last = event
            text = json.dumps(asdict(event)) if as_json else line(event, time.monotonic() - began)
            console.print(text, markup=False, highlight=False, soft_wrap=True)
        return outcome(last)
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        for event in events:
            last = event
            live.update(panel(event, time.monotonic() - began))
    return outcome(last)
