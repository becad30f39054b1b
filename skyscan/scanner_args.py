"""The scanner server's command line, from the typed spec: the Job runs `scanner_server_argv` and the
REST manifest shows `scanner_server_args`, the reference's string of the same arguments.

Every user value is one argument of a grammar the model checks (`model.RecoAlgo`, `model.Nsides`), so
none can add an option; `kube_literal` keeps the kubelet from expanding a `$(VAR)` in what remains."""

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


def kube_literal(value: str) -> str:
    """`value` as Kubernetes passes it on: in a container's command, args and env values the kubelet
    expands `$(VAR)`, and `$$` is its escape for one `$`."""
    return value.replace("$", "$$")


def scanner_server_argv(spec: model.ScanSpec) -> list[str]:
    """The Job's args: one element per argument, escaped for the kubelet."""
    event = "--real-event" if spec.real_or_simulated_event.is_real else "--simulated-event"
    argv = [
        *("python", "-m", "skymap_scanner.server"),
        *("--reco-algo", spec.reco_algo),
        *("--cache-dir", COMMON_SPACE),
        *("--client-startup-json", f"{COMMON_SPACE}/startup.json"),
        *("--nsides", *(f"{k}:{v}" for k, v in sorted_nsides(spec.nsides))),
        event,
        *("--predictive-scanning-threshold", str(spec.predictive_scanning_threshold)),
    ]
    return [kube_literal(a) for a in argv]


def scanner_server_args(spec: model.ScanSpec) -> str:
    """The reference's exact string (double spaces included), as the REST manifest shows it; the same
    arguments as `scanner_server_argv` (a test holds them together)."""
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
