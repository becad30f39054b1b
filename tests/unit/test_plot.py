"""`skyscan plot` draws what a result has: the full sky and the zoom around the best fit, with the real
icecube-skyreader, for results of one nside (a quick `--nsides 8:0` scan), two and three."""

from __future__ import annotations

import io

import pytest

from skyscan_client import plot
from skyscan_local import skymap
from tests.unit.test_skymap import METADATA


def result(nsides: dict[int, int]) -> dict[str, object]:
    """A finished result over `nsides`, as the scanner simulator makes it."""
    sky = skymap.ScanSky(skymap.true_event(METADATA), "scan-plot", nsides)
    for nside in nsides:
        sky.finish(nside, sky.send(nside))
    return sky.result(METADATA, final=True)


@pytest.mark.parametrize("nsides", [{8: 0}, {8: 0, 64: 12}, {8: 0, 64: 12, 512: 24}])
def test_full_sky_and_zoom_whatever_the_nsides(nsides: dict[int, int]) -> None:
    from matplotlib import image  # here: every xdist worker collects this module, one runs it

    full, zoom = (image.imread(io.BytesIO(p), format="png") for p in plot.skymap_pictures(result(nsides)))
    assert full.shape[1] > 1.5 * full.shape[0]  # the whole sky: a wide Mollweide map
    assert zoom.shape[1] < 1.5 * zoom.shape[0]  # the zoom, with its colour bar below
