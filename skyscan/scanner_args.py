"""The scanner server's command line, from the typed spec: the Job runs it and the REST manifest
shows it (`scanner_server_args`), so both come from here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skyscan import model

COMMON_SPACE = "/common-space"  # the scanner's shared volume (cache, startup.json)


def nside_order(item: tuple[str, Any]) -> tuple[int, str]:
    """Sort key for (nside, extension) pairs: numerically, coarse to fine."""
    return (int(item[0]) if item[0].isdigit() else 1 << 62, item[0])


def sorted_nsides(nsides: Mapping[str, int]) -> Iterable[tuple[str, int]]:
    """nside -> extension pairs coarse to fine (the API server returns map keys sorted as strings)."""
    return sorted(nsides.items(), key=nside_order)


def scanner_server_args(spec: model.ScanSpec) -> str:
    """The reference's exact string (double spaces included); the Job's args are its `.split()`."""
    nsides = " ".join(f"{k}:{v}" for k, v in sorted_nsides(spec.nsides))
    event = "--real-event" if spec.real_or_simulated_event.is_real else "--simulated-event"
    return (
        "python -m skymap_scanner.server "
        f" --reco-algo {spec.reco_algo}"
        f" --cache-dir {COMMON_SPACE} "
        f" --client-startup-json {COMMON_SPACE}/startup.json "
        f" --nsides {nsides} "
        f" {event} "
        f" --predictive-scanning-threshold {spec.predictive_scanning_threshold} "
    )
