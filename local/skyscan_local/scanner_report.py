"""What a skymap-scanner server reports to the REST API, as pure builders (wms-and-scanner notes C.4/C.5).

The scanner simulator (`skyscan_local.scanner_simulator`) drives a `ScanTally` through a scan and sends what
these functions build: the PATCH /manifest progress body and the PUT /result body, in the shapes
the real scanner sends (timestamps as naive "YYYY-MM-DD HH:MM:SS", durations as `str(timedelta)`,
nside keys as strings, `rate`/`predictions` only once recos exist).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any

RESULT_COLUMNS = ["index", "llh", "E_in", "E_tot", "X", "Y", "Z", "T"]
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
    pixels: int  # generated for this nside
    done: int = 0  # pixels whose every position variation came back


@dataclass
class ScanTally:
    """A simulated scan's progress: which pixels of which nside are reconstructed, and when."""

    nsides: dict[int, int]
    pixels_per_nside: int
    position_variations: int
    started: float
    reco_started: float | None = None
    reco_times: list[float] = field(default_factory=list)  # completion time of each pixel
    by_nside: dict[int, NsideTally] = field(default_factory=dict)

    def send(self, nside: int) -> int:
        """One round of pixels sent out for `nside`; returns how many."""
        self.by_nside[nside] = NsideTally(self.pixels_per_nside)
        return self.pixels_per_nside

    def reco_done(self, nside: int, now: float) -> bool:
        """One pixel of `nside` finished; True when it was the nside's first (a forced report)."""
        if self.reco_started is None:
            self.reco_started = now
        tally = self.by_nside[nside]
        tally.done += 1
        self.reco_times.append(now)
        return tally.done == 1

    @property
    def total_pixels(self) -> int:
        return self.pixels_per_nside * len(self.nsides)

    @property
    def done_pixels(self) -> int:
        return sum(t.done for t in self.by_nside.values())

    @property
    def finished(self) -> bool:
        return self.done_pixels >= self.total_pixels


def _counts(done: int, generated: float, variations: int) -> dict[str, dict[str, Any]]:
    def block(d: float, g: float) -> dict[str, Any]:
        fraction = d / g if g else 0.0
        return {
            "done": d,
            "done est. percent": f"{d}/{g} ({fraction:.2f})",
            "generated": g,
            "initial approximation total": g,
        }

    return {"recos": block(done * variations, int(generated) * variations), "pixels": block(done, generated)}


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
    nsides = {str(n): _counts(t.done, float(t.pixels), v) for n, t in tally.by_nside.items()}
    tallies: dict[str, Any] = {
        "nsides": nsides,
        "overall": _counts(tally.done_pixels, float(tally.total_pixels), v),
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


def _pixel_row(scan_id: str, nside: int, index: int) -> list[float | int]:
    """A deterministic, plausible reconstruction of one pixel."""
    h = hashlib.sha256(f"{scan_id}/{nside}/{index}".encode()).digest()
    llh = 480.0 + h[0] / 8.0
    e_in = 4000.0 + h[1] * 4.0
    return [
        index,
        round(llh, 3),
        round(e_in, 1),
        round(e_in * 1.02, 1),
        round(h[2] - 128.0, 2),
        round(h[3] - 128.0, 2),
        round(h[4] - 128.0, 2),
        10000.0 + h[5],
    ]


def result(tally: ScanTally, scan_id: str, metadata: dict[str, Any], *, final: bool) -> dict[str, Any]:
    """The cumulative `skyscan_result` of PUT /scan/{id}/result; `{}` until a pixel is done."""
    out: dict[str, Any] = {}
    for nside, t in tally.by_nside.items():
        if t.done == 0:
            continue
        out[f"nside-{nside}"] = {
            "columns": RESULT_COLUMNS,
            "metadata": {"nside": nside, "complete": final, **metadata},
            "data": [_pixel_row(scan_id, nside, i) for i in range(t.done)],
        }
    return out
