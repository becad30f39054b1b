"""The scanner simulator's results look like real ones: the whole sky at the coarsest nside, refinement
around the best fit, icecube-skyreader's serialization, a realistic size (wms-and-scanner C.5/C.6).

healpy and skyreader are imported where used: every xdist worker collects this module, one runs it."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from skyscan_local import skymap

DEFAULT = {8: 0, 64: 12, 512: 24}
METADATA = {"run_id": 123456, "event_id": 42, "event_type": "neutrino", "mjd": 60000.5,
            "is_real_event": True, "version": 1}  # fmt: skip


def scanned(nsides: dict[int, int], scan_id: str = "scan-1", batches: int = 3) -> skymap.ScanSky:
    """A scan played as the simulator plays it: each nside sent, then finished in batches; every
    partial result on the way reads with skyreader."""
    from skyreader import SkyScanResult

    sky = skymap.ScanSky(skymap.true_event(METADATA), scan_id, nsides)
    for nside in nsides:
        sent = sky.send(nside)
        for _ in range(batches):
            sky.finish(nside, math.ceil(sent / batches))
            partial = SkyScanResult.deserialize(sky.result(METADATA, final=False))
            assert partial.nsides[-1] == nside and partial.min_llh >= sky.truth.llh_min - 1
    return sky


def degrees_between(nside: int, pixel: int, towards: np.ndarray[Any, Any]) -> float:
    import healpy

    return math.degrees(math.acos(min(1.0, float(np.dot(healpy.pix2vec(nside, pixel), towards)))))


def test_a_final_result_is_a_real_sized_skyreader_result_around_the_true_direction() -> None:
    import healpy
    from skyreader import SkyScanResult

    sky = scanned(DEFAULT)
    body = {"scan_result": sky.result(METADATA, final=True), "is_final": True}
    size = len(json.dumps(body))
    assert 300_000 <= size <= 700_000, size  # real final results: 0.3-0.7 MB

    result = SkyScanResult.deserialize(json.loads(json.dumps(body))["scan_result"])
    assert result.nsides == [8, 64, 512]
    coarse = result.get_results_per_nside(8)
    assert sorted(coarse["index"]) == list(range(768))  # the whole sky
    for nside, estimate in skymap.estimated_pixels(DEFAULT).items():
        pixels = result.get_results_per_nside(nside)
        assert estimate / 2 <= len(pixels) <= estimate * 2, (nside, len(pixels))
        assert len(set(pixels["index"])) == len(pixels)
    assert result.get_event_metadata().run_id == 123456
    assert result.get_results_per_nside(512).dtype.metadata["complete"] is True  # type: ignore[index]

    # Refinement: every nside-64 pixel lies in one of 12-odd nside-8 pixels, all 512s near the best fit.
    truth = sky.truth.vector
    parents = set(healpy.vec2pix(8, *healpy.pix2vec(64, result.get_results_per_nside(64)["index"])))
    assert 6 <= len(parents) <= 20
    assert max(degrees_between(512, p, truth) for p in result.get_results_per_nside(512)["index"]) < 5
    ra, dec = result.best_dir
    assert degrees_between(512, healpy.ang2pix(512, math.pi / 2 - dec, ra), truth) < 1.0
    assert result.best_fit.dtype.metadata["nside"] == 512
    # The llh rises away from the best fit: the far sky is much worse than the best pixel.
    assert np.median(coarse["llh"]) > result.min_llh + 100


def test_partial_results_grow_and_deserialize_and_the_draws_are_reproducible() -> None:
    from skyreader import SkyScanResult

    sky = skymap.ScanSky(skymap.true_event(METADATA), "scan-2", DEFAULT)
    assert sky.result(METADATA, final=False) == {}  # nothing finished: the scanner PUTs {}
    assert sky.send(8) == 768
    sky.finish(8, 100)
    partial = SkyScanResult.deserialize(sky.result(METADATA, final=False))
    assert len(partial.get_results_per_nside(8)) == 100 and partial.nsides == [8]
    assert partial.get_results_per_nside(8).dtype.metadata["complete"] is False  # type: ignore[index]

    # The truth comes from the event; the noise from the scan: the same scan gives the same result.
    assert skymap.true_event(METADATA) == skymap.true_event(dict(METADATA))
    assert skymap.true_event(METADATA) != skymap.true_event({**METADATA, "event_id": 43})
    assert scanned(DEFAULT, "scan-3").result(METADATA, final=True) == scanned(DEFAULT, "scan-3").result(
        METADATA, final=True
    )


def test_other_progressions_stay_small_and_bounded() -> None:
    # Extension 0 after the first nside (the e2e tests' long progressions): the best pixel is refined.
    tiny = scanned({2**k: 0 for k in range(1, 9)})
    assert [r.pixels.size for r in tiny.rounds.values()] == [48] + [4] * 7
    # A jump the real scanner would spend days on is capped.
    jump = scanned({8: 0, 8192: 12})
    assert jump.rounds[8192].pixels.size <= skymap.MAX_PIXELS_PER_NSIDE * 1.1
    assert skymap.estimated_pixels({8: 0, 8192: 12})[8192] == skymap.MAX_PIXELS_PER_NSIDE
