"""A scanner result survives icecube-skyreader's own round trip, `SkyScanResult.serialize` then
`deserialize` (through JSON, as it travels): what `skyscan plot` and IceCube's clients do with it. It is
the check that the plot extra's pins fit skyreader: 1.6.3's serialize calls `DataFrame.applymap`, which
pandas 3 removed (pyproject's `pandas<3`).

skyreader is imported where used: every xdist worker collects this module, one runs it."""

from __future__ import annotations

import json
import math

import numpy as np

from skyscan_local import skymap
from tests.unit.test_skymap import METADATA


def test_a_result_round_trips_through_skyreaders_serialize_and_deserialize() -> None:
    from skyreader import SkyScanResult
    from skyreader.result import NAN_SENTINEL

    sky = skymap.ScanSky(skymap.true_event(METADATA), "scan-roundtrip", {8: 0, 64: 12})
    for n in (8, 64):
        sky.finish(n, sky.send(n))
    written = sky.result(METADATA, final=True)
    written["nside-64"]["data"][0][2] = math.nan  # a reconstruction that failed: skyreader's NaN path
    result = SkyScanResult.deserialize(written)

    serialized = json.loads(json.dumps(result.serialize()))  # the pandas part of skyreader
    assert serialized.keys() == written.keys()
    assert serialized["nside-64"]["data"][0][2] == NAN_SENTINEL
    again = SkyScanResult.deserialize(serialized)
    assert again.nsides == result.nsides == [8, 64]
    for nside in result.result:
        before, after = result.result[nside], again.result[nside]
        assert before.dtype == after.dtype and before.dtype.metadata == after.dtype.metadata
        for field in before.dtype.names or ():
            assert np.array_equal(before[field], after[field], equal_nan=True), (nside, field)
    assert again.get_event_metadata().run_id == METADATA["run_id"]
    assert again.best_dir == result.best_dir
