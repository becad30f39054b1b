"""A simulated scan's sky: the event's true direction, an llh landscape around it, the pixels the real
scanner would reconstruct at each nside, and the result in icecube-skyreader's serialization.

The real scanner (skymap_scanner `server/pixels.py`) reconstructs every pixel of the coarsest nside;
for each finer nside it takes the pixels of the previous nside whose centres lie within
sqrt(extension * pixel area / pi) of the best fit so far (about `extension` pixels) and reconstructs
their sub-pixels, about extension * (nside / previous nside)^2 of them. The default progression
8:0 64:12 512:24 gives 768 + ~768 + ~1536 pixels, a final result of about 0.5 MB of JSON.

Everything is deterministic: the truth from the event's identity (rescans of an event share it), the
reconstruction noise from the scan id. Pure: numpy and healpy for the pixel geometry, no I/O. healpy
is imported where it is used: it takes a second (it brings matplotlib), which every importer of the
scanner simulator would pay, most never drawing a sky.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# skyreader's version-1 pixel fields: llh, deposited energy inside and in total, the vertex and its time.
RESULT_COLUMNS = ("index", "llh", "E_in", "E_tot", "X", "Y", "Z", "T")
# A progression that skips many nsides (or starts fine) would ask for millions of pixels, which the real
# scanner spends days on; the simulator stops at this many per nside, the ones nearest the centre.
MAX_PIXELS_PER_NSIDE = 20_000

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


@dataclass(frozen=True)
class TrueEvent:
    """What the reconstruction would find: a direction and the shape of the llh around it."""

    ra: float  # radians
    dec: float  # radians
    llh_min: float  # -ln L at the true direction
    depth: float  # how much worse the llh gets far from it
    width: float  # radians: the llh rises as depth * (1 - exp(-angle^2 / (2 width^2)))
    energy: float  # GeV deposited
    vertex: tuple[float, float, float]  # metres, in the detector
    time: float  # ns

    @property
    def vector(self) -> Floats:
        import healpy

        return np.asarray(healpy.ang2vec(math.pi / 2 - self.dec, self.ra), dtype=np.float64)


def true_event(event_metadata: dict[str, Any]) -> TrueEvent:
    """The event's truth, drawn from its identity (run, event, type)."""
    rng = _rng("event", event_metadata.get("run_id"), event_metadata.get("event_id"),
               event_metadata.get("event_type"))  # fmt: skip
    # A 90% region (2 dLLH = 4.61) between about 0.8 and 2 degrees across, as for a good track.
    radius90 = math.radians(rng.uniform(0.8, 2.0))
    depth = rng.uniform(400.0, 1200.0)
    return TrueEvent(
        ra=rng.uniform(0.0, 2 * math.pi),
        dec=math.asin(rng.uniform(-1.0, 1.0)),  # uniform over the sphere
        llh_min=rng.uniform(300.0, 3000.0),
        depth=depth,
        width=radius90 * math.sqrt(depth / (2 * 4.61)),
        energy=10 ** rng.uniform(3.5, 5.5),
        vertex=(rng.uniform(-500, 500), rng.uniform(-500, 500), rng.uniform(-450, 450)),
        time=rng.uniform(9_000.0, 12_000.0),
    )


def estimated_pixels(nsides: dict[int, int]) -> dict[int, int]:
    """Pixels per nside as the scanner predicts them before it knows the best fit (its tallies' initial
    approximation): the whole sky first, then extension * (nside / previous nside)^2."""
    estimates: dict[int, int] = {}
    previous = 0
    for nside, extension in nsides.items():
        count = 12 * nside**2 if not previous else max(extension, 1) * (nside // previous) ** 2
        estimates[nside] = min(count, MAX_PIXELS_PER_NSIDE)
        previous = nside
    return estimates


def _angles(nside: int, pixels: Ints, towards: Floats) -> Floats:
    import healpy

    x, y, z = healpy.pix2vec(nside, pixels)
    cosine = np.clip(x * towards[0] + y * towards[1] + z * towards[2], -1.0, 1.0)
    return np.asarray(np.arccos(cosine), dtype=np.float64)


def _nearest(nside: int, centre: Floats, count: int) -> Ints:
    """About `count` pixels of `nside` nearest `centre` (at least the one holding it)."""
    import healpy

    radius = math.sqrt(count * healpy.nside2pixarea(nside) / math.pi)
    found = np.asarray(healpy.query_disc(nside, centre, radius), dtype=np.int64)
    return found if found.size else np.asarray([healpy.vec2pix(nside, *centre)], dtype=np.int64)


@dataclass
class NsideRound:
    """One nside's pixels in the order they finish, with their reconstructions drawn up front."""

    pixels: Ints
    rows: Floats  # one row per pixel: the RESULT_COLUMNS after "index"
    done: int = 0


class ScanSky:
    """The pixels a simulated scan reconstructs, nside after nside, and its cumulative result."""

    def __init__(self, truth: TrueEvent, scan_id: str, nsides: dict[int, int]) -> None:
        self.truth, self.scan_id, self.nsides = truth, scan_id, nsides
        self.rounds: dict[int, NsideRound] = {}

    def send(self, nside: int) -> int:
        """Choose `nside`'s pixels as the scanner would (all the sky first, then around the best fit
        so far) and return how many; they finish through `finish`."""
        rng = _rng("scan", self.scan_id, nside)
        order = list(self.nsides)
        at = order.index(nside)
        if at == 0:
            pixels = (np.arange(12 * nside**2, dtype=np.int64) if 12 * nside**2 <= MAX_PIXELS_PER_NSIDE
                      else _nearest(nside, self.truth.vector, MAX_PIXELS_PER_NSIDE))  # fmt: skip
        else:
            pixels = self._refine(order[at - 1], nside, max(self.nsides[nside], 1))
        pixels = rng.permutation(pixels)
        self.rounds[nside] = NsideRound(pixels, self._reconstruct(nside, pixels, rng))
        return int(pixels.size)

    def finish(self, nside: int, count: int) -> None:
        """`count` more of `nside`'s pixels have all their position variations back."""
        tally = self.rounds[nside]
        tally.done = min(tally.done + count, tally.pixels.size)

    def best_fit(self) -> tuple[int, int, float] | None:
        """(nside, pixel, llh) of the lowest llh among the finished pixels."""
        best: tuple[int, int, float] | None = None
        for nside, tally in self.rounds.items():
            if tally.done:
                i = int(np.argmin(tally.rows[: tally.done, 0]))
                llh = float(tally.rows[i, 0])
                if best is None or llh < best[2]:
                    best = (nside, int(tally.pixels[i]), llh)
        return best

    def _refine(self, previous: int, nside: int, extension: int) -> Ints:
        import healpy

        best = self.best_fit()
        centre = (np.asarray(healpy.pix2vec(best[0], best[1]), dtype=np.float64) if best
                  else self.truth.vector)  # fmt: skip
        parents = _nearest(previous, centre, extension)
        if parents.size * (nside / previous) ** 2 > MAX_PIXELS_PER_NSIDE:
            return _nearest(nside, centre, MAX_PIXELS_PER_NSIDE)
        # The sub-pixels: the finer pixels whose centres fall in a chosen coarser pixel.
        reach = math.sqrt(extension * healpy.nside2pixarea(previous) / math.pi) + healpy.max_pixrad(previous)
        candidates = np.asarray(healpy.query_disc(nside, centre, reach), dtype=np.int64)
        inside = np.isin(healpy.vec2pix(previous, *healpy.pix2vec(nside, candidates)), parents)
        return candidates[inside]

    def _reconstruct(self, nside: int, pixels: Ints, rng: np.random.Generator) -> Floats:
        """The best reconstruction at each pixel: llh rising with the distance to the truth, plus noise
        that grows where the fit is poor; energies and vertex scatter more there too."""
        t = self.truth
        angle = _angles(nside, pixels, t.vector)
        rise = t.depth * -np.expm1(-(angle**2) / (2 * t.width**2))
        poor = rise / t.depth  # 0 at the truth, towards 1 far from it
        n = pixels.size
        # Smooth near the minimum (so skyreader's 50%/90% contours enclose the best fit), rough far off.
        llh = t.llh_min + rise + rng.normal(0.0, 0.05 + 0.02 * rise, n)
        e_in = t.energy * np.exp(rng.normal(0.0, 0.05 + 0.5 * poor, n))
        e_tot = e_in * np.exp(np.abs(rng.normal(0.0, 0.02 + 3.0 * poor, n)))
        vertex = [c + rng.normal(0.0, 3.0 + 60.0 * poor, n) for c in t.vertex]
        time = t.time + rng.normal(0.0, 10.0 + 300.0 * poor, n)
        return np.column_stack([llh, e_in, e_tot, *vertex, time])

    def result(self, event_metadata: dict[str, Any], *, final: bool) -> dict[str, Any]:
        """The cumulative `skyscan_result` as skyreader's `SkyScanResult.serialize` writes it: per nside
        with finished pixels, its columns, rows sorted by pixel index, and metadata; `{}` before any."""
        out: dict[str, Any] = {}
        for nside, tally in self.rounds.items():
            if not tally.done:
                continue
            order = np.argsort(tally.pixels[: tally.done], kind="stable")
            indices = tally.pixels[order].tolist()
            values = tally.rows[order].tolist()
            out[f"nside-{nside}"] = {
                "columns": list(RESULT_COLUMNS),
                "data": [[i, *v] for i, v in zip(indices, values, strict=True)],
                "metadata": {"nside": nside, "complete": final, **event_metadata},
            }
        return out
