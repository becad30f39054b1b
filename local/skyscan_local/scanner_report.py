"""What a skymap-scanner server reports to the REST API, as pure builders (wms-and-scanner notes C.4).

The scanner simulator (`skyscan_local.scanner_simulator`) drives a `ScanTally` through a scan and sends what
these functions build: the PATCH /manifest progress body, in the shape the real scanner sends
(timestamps as naive "YYYY-MM-DD HH:MM:SS", durations as `str(timedelta)`, nside keys as strings,
`rate`/`predictions` only once recos exist, pixel counts as generated and as first predicted). Its
PUT /result body comes from `skyscan_local.skymap`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

TIMELINE_FRACTIONS = ("0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.8", "0.9", "0.95", "0.99", "1.0")
EVENT_METADATA_VERSION = 1
FAKE_RUN_ID, FAKE_EVENT_ID, FAKE_MJD = 138632, 31747601, 59723.32


@dataclass(frozen=True)
class ServerArgs:
    nsides: dict[int, int]  # nside -> pixel extension, in progression order
    real_event: bool
    predictive_scanning_threshold: float


def parse_server_args(args: list[str]) -> ServerArgs:
    """The scanner server's command line, as the operator's Job passes it."""
    nsides: dict[int, int] = {}
    real, threshold = True, 1.0
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--nsides":
            while i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
                nside, _, ext = args[i].partition(":")
                nsides[int(nside)] = int(ext or 0)
        elif arg == "--simulated-event":
            real = False
        elif arg == "--real-event":
            real = True
        elif arg == "--predictive-scanning-threshold" and i + 1 < len(args):
            i += 1
            threshold = float(args[i])
        i += 1
    # The scanner refines from coarse to fine, whatever order the nsides were listed in.
    return ServerArgs(dict(sorted(nsides.items())) or {8: 0}, real, threshold)


def _find(doc: Any, key: str) -> Any:
    """The first value of `key` in a nested event document (realtime events nest it in value.data)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for value in doc.values():
            found = _find(value, key)
            if found is not None:
                return found
    return None


def event_metadata(event: dict[str, Any], real_event: bool) -> dict[str, Any]:
    """Identity of the event: from the event when it names it, else fixed realistic values.

    The scanner's library refuses a real event whose run_id is outside [1e5, 1e6)."""
    run_id, event_id, mjd = _find(event, "run_id"), _find(event, "event_id"), _find(event, "mjd")
    if not isinstance(run_id, int) or (real_event and not 100_000 <= run_id < 1_000_000):
        run_id = FAKE_RUN_ID
    return {
        "run_id": run_id,
        "event_id": event_id if isinstance(event_id, int) else FAKE_EVENT_ID,
        "event_type": str(_find(event, "event_type") or "neutrino"),
        "mjd": float(mjd) if isinstance(mjd, int | float) else FAKE_MJD,
        "is_real_event": real_event,
        "version": EVENT_METADATA_VERSION,
    }


def scan_metadata(scan_id: str, nsides: dict[int, int], position_variations: int) -> dict[str, Any]:
    return {
        "scan_id": scan_id,
        "nside_progression": {str(k): v for k, v in nsides.items()},
        "position_variations": position_variations,
    }


def timestamp(t: float) -> str:
    return str(dt.datetime.fromtimestamp(int(t)))


def duration(seconds: float) -> str:
    return str(dt.timedelta(seconds=int(max(0.0, seconds))))


@dataclass
class NsideTally:
    pixels: int  # generated (sent out) for this nside
    done: int = 0  # pixels whose every position variation came back


@dataclass
class ScanTally:
    """A simulated scan's progress: how many pixels of which nside are reconstructed, and when."""

    nsides: dict[int, int]
    estimates: dict[int, int]  # pixels per nside as predicted before they are sent
    position_variations: int
    started: float
    reco_started: float | None = None
    reco_times: list[float] = field(default_factory=list)  # completion time of each pixel
    by_nside: dict[int, NsideTally] = field(default_factory=dict)

    def send(self, nside: int, pixels: int) -> None:
        """One round of `pixels` sent out for `nside`."""
        self.by_nside[nside] = NsideTally(pixels)

    def recos_done(self, nside: int, pixels: int, now: float) -> bool:
        """`pixels` of `nside` finished; True when they are the nside's first (a forced report)."""
        if self.reco_started is None:
            self.reco_started = now
        tally = self.by_nside[nside]
        first = tally.done == 0
        tally.done += pixels
        self.reco_times.extend([now] * pixels)
        return first

    @property
    def total_pixels(self) -> int:
        """Pixels sent out so far plus the predictions for the nsides still to come."""
        return sum(t.pixels if (t := self.by_nside.get(n)) else self.estimates[n] for n in self.nsides)

    @property
    def done_pixels(self) -> int:
        return sum(t.done for t in self.by_nside.values())

    @property
    def finished(self) -> bool:
        return len(self.by_nside) == len(self.nsides) and self.done_pixels >= self.total_pixels


def _counts(done: int, generated: float, approximation: float, variations: int) -> dict[str, dict[str, Any]]:
    def block(d: float, g: float, a: float) -> dict[str, Any]:
        fraction = d / g if g else 0.0
        return {
            "done": d,
            "done est. percent": f"{d}/{g} ({fraction:.2f})",
            "generated": g,
            "initial approximation total": a,
        }

    return {
        "recos": block(done * variations, int(generated) * variations, int(approximation) * variations),
        "pixels": block(done, generated, approximation),
    }


def _rate(times: list[float], start: float) -> dict[str, Any]:
    gaps = [b - a for a, b in zip([start, *times[:-1]], times, strict=True)]
    ordered = sorted(gaps)
    stats = {
        "mean": duration(sum(gaps) / len(gaps)),
        "median": duration(ordered[len(ordered) // 2]),
        "slowest": duration(ordered[-1]),
        "fastest": duration(ordered[0]),
    }
    return {
        "worker time": stats,
        "round-trip time": stats,
        "wall time": {
            "start": timestamp(start),
            "end": timestamp(times[-1]),
            "runtime": duration(times[-1] - start),
            "mean reco": stats["mean"],
        },
    }


def progress(
    tally: ScanTally, now: float, summary: str, epilogue: str, *, final: bool = False, threshold: float = 1.0
) -> dict[str, Any]:
    """The `progress` object of PATCH /scan/{id}/manifest."""
    v = tally.position_variations
    nsides = {
        str(n): _counts(t.done, float(t.pixels), float(tally.estimates[n]), v)
        for n, t in tally.by_nside.items()
    }
    approximation = float(sum(tally.estimates.values()))
    tallies: dict[str, Any] = {
        "nsides": nsides,
        "overall": _counts(tally.done_pixels, float(tally.total_pixels), approximation, v),
    }
    stats: dict[str, Any] = {
        "start": {"scanner start": timestamp(tally.started)},
        "runtime": {"elapsed": duration(now - tally.started)},
    }
    if tally.reco_started is not None and tally.reco_times:
        done, total = tally.done_pixels, tally.total_pixels
        stats["start"]["reco start (on server)"] = timestamp(tally.reco_started)
        stats["runtime"]["reco runtime (on server)"] = duration(now - tally.reco_started)
        stats["runtime"]["startup runtime"] = duration(tally.reco_started - tally.started)
        stats["rate"] = {"all recos": _rate(tally.reco_times, tally.reco_started)}
        timeline = {f"{1 / total:.5f}": duration(tally.reco_times[0] - tally.started)}
        for fraction in TIMELINE_FRACTIONS:
            reached = int(float(fraction) * total + 0.999999)
            if 0 < reached <= done:
                timeline[fraction] = duration(tally.reco_times[reached - 1] - tally.started)
        tallies["est. scan timeline"] = timeline
        if final:
            stats["end"] = timestamp(now)
            stats["finished"] = True
        else:
            per_pixel = (now - tally.reco_started) / done
            left = per_pixel * (total - done)
            stats["predictions"] = {
                "time left": duration(left),
                "total runtime at finish": duration(now - tally.started + left),
                "total # of reconstructions": total * v,
                "end": timestamp(now + left),
                "technique": "simple moving average (window=400)",
            }
    return {
        "summary": summary,
        "epilogue": epilogue,
        "tallies": tallies,
        "processing_stats": stats,
        "predictive_scanning_threshold": threshold,
        "last_updated": timestamp(now),
        "start": int(tally.started),
        "end": int(now) if final else None,
    }
