"""The scanner server's command line, from the typed spec, in one place: `scanner_server_options`
groups its arguments; the Job runs them as a list (`scanner_server_argv`) and the REST manifest shows
them as the reference's string (`scanner_server_args`), so the two cannot disagree.

Every user value is one argument of a grammar the model checks (`model.RecoAlgo`, `model.Nsides`), so
none can add an option; the Job builder escapes `$` for the kubelet on top of that."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skyscan import model

COMMON_SPACE = "/common-space"  # the scanner's shared volume (cache, startup.json)

# How the reference writes each group of `scanner_server_options` into its string (double spaces
# included: it concatenates fragments that each bring their own).
_REFERENCE_FRAGMENTS = ("{} ", " {}", " {} ", " {} ", " {} ", " {} ", " {} ")


def nside_order(item: tuple[str, Any]) -> tuple[int, str]:
    """Sort key for (nside, extension) pairs: numerically, coarse to fine."""
    return (int(item[0]) if item[0].isdigit() else 1 << 62, item[0])


def sorted_nsides(nsides: Mapping[str, int]) -> Iterable[tuple[str, int]]:
    """nside -> extension pairs coarse to fine (the API server returns map keys sorted as strings)."""
    return sorted(nsides.items(), key=nside_order)


def scanner_server_options(spec: model.ScanSpec) -> list[list[str]]:
    """The program, then each option with its values: one list element per argument."""
    return [
        ["python", "-m", "skymap_scanner.server"],
        ["--reco-algo", spec.reco_algo],
        ["--cache-dir", COMMON_SPACE],
        ["--client-startup-json", f"{COMMON_SPACE}/startup.json"],
        ["--nsides", *(f"{k}:{v}" for k, v in sorted_nsides(spec.nsides))],
        ["--real-event" if spec.real_or_simulated_event.is_real else "--simulated-event"],
        ["--predictive-scanning-threshold", str(spec.predictive_scanning_threshold)],
    ]


def scanner_server_argv(spec: model.ScanSpec) -> list[str]:
    """The scanner's argv, as the Job passes it (before the kubelet's escaping)."""
    return [arg for option in scanner_server_options(spec) for arg in option]


def scanner_server_args(spec: model.ScanSpec) -> str:
    """The reference's exact string of the same arguments, as the REST manifest shows it."""
    options = scanner_server_options(spec)
    return "".join(f.format(" ".join(o)) for f, o in zip(_REFERENCE_FRAGMENTS, options, strict=True))
