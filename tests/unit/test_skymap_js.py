"""The dashboard's skymap module (`api_shim/ui_assets/skymap.js`), run by Node: its HEALPix RING
functions agree with healpy's, and it reads a simulated scan's result as icecube-skyreader does (the
best fit, the -2 ΔlnL of each pixel). Skipped, saying so, where there is no `node`.

healpy and skyreader are imported where used: every xdist worker collects this module, one runs it."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skyscan_local import skymap
from tests.unit.test_skymap import DEFAULT, METADATA

ASSETS = Path(__file__).resolve().parents[2] / "api_shim" / "ui_assets"
# Reads {"pixels": {nside: [pixel]}, "angles": {nside: [[theta, phi]]}, "result": ...} on stdin.
DRIVER = """
import { ang2pix, pix2ang, readResult } from "./skymap.js";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const asked = JSON.parse(input);
const out = { centres: {}, pixels: {}, sky: null };
for (const [nside, pixels] of Object.entries(asked.pixels)) {
  out.centres[nside] = pixels.map((p) => pix2ang(+nside, p));
}
for (const [nside, angles] of Object.entries(asked.angles)) {
  out.pixels[nside] = angles.map(([t, f]) => ang2pix(+nside, t, f));
}
if (asked.result) {
  const sky = readResult(asked.result);
  out.sky = { best: sky.best, count: sky.count, max: sky.max,
              values: Object.fromEntries(sky.layers.map((l) => [l.nside, [...l.values]])) };
}
process.stdout.write(JSON.stringify(out));
"""
NSIDES = [1, 2, 4, 8, 64, 512, 1024, 8192]


def run_js(tmp_path: Path, asked: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("SKYMAP JS NOT TESTED: no `node` on this machine")
    for name in ("skymap.js", "dom.js"):
        shutil.copy(ASSETS / name, tmp_path / name)
    (tmp_path / "package.json").write_text('{"type": "module"}')  # the modules as the browser reads them
    (tmp_path / "driver.js").write_text(DRIVER)
    done = subprocess.run([node, "driver.js"], cwd=tmp_path, input=json.dumps(asked), capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def sample_pixels(nside: int, rng: np.random.Generator) -> list[int]:
    """Random pixels and those at the edges of the polar caps and the equatorial belt."""
    npix, ncap = 12 * nside**2, 2 * nside * (nside - 1)
    edges = {0, 1, ncap - 1, ncap, ncap + 1, npix - ncap - 1, npix - ncap, npix - 2, npix - 1}
    chosen = rng.integers(0, npix, size=min(npix, 3000))
    return sorted(int(p) for p in {*chosen.tolist(), *edges} if 0 <= p < npix)


def test_the_js_healpix_ring_functions_agree_with_healpy(tmp_path: Path) -> None:
    import healpy

    rng = np.random.default_rng(31)
    pixels = {n: sample_pixels(n, rng) for n in NSIDES}
    # Directions all over the sphere, the poles' neighbourhoods and the caps' edges (|z| = 2/3) among them.
    z = np.concatenate([rng.uniform(-1, 1, 4000), [1 - 1e-9, -1 + 1e-9, 2 / 3 + 1e-7, -2 / 3 - 1e-7, 0]])
    phi = np.concatenate([rng.uniform(-2 * math.pi, 4 * math.pi, 4000), [0.1, 6.2, 3, 0, 2 * math.pi - 1e-9]])
    theta = np.arccos(z)
    angles = [[float(t), float(f)] for t, f in zip(theta, phi, strict=True)]
    got = run_js(tmp_path, {"pixels": pixels, "angles": {n: angles for n in NSIDES}})

    for nside in NSIDES:
        expected = np.column_stack(healpy.pix2ang(nside, pixels[nside]))
        assert np.allclose(np.asarray(got["centres"][str(nside)]), expected, rtol=0, atol=1e-12), nside
        assert got["pixels"][str(nside)] == healpy.ang2pix(nside, theta, phi).tolist(), nside


def test_the_js_reads_a_result_as_skyreader_does(tmp_path: Path) -> None:
    import healpy
    from skyreader import SkyScanResult

    sky = skymap.ScanSky(skymap.true_event(METADATA), "scan-js", DEFAULT)
    for nside in DEFAULT:
        sky.finish(nside, sky.send(nside))
    written = sky.result(METADATA, final=True)
    written["nside-64"]["data"][0][1] = "<skyreader.nan>"  # a failed reconstruction, as skyreader writes it
    got = run_js(tmp_path, {"pixels": {}, "angles": {}, "result": written})["sky"]

    result = SkyScanResult.deserialize(json.loads(json.dumps(written)))
    best = result.best_fit
    assert (got["best"]["nside"], got["best"]["pixel"]) == (best.dtype.metadata["nside"], int(best["index"]))
    assert got["best"]["llh"] == pytest.approx(float(best["llh"]), abs=1e-9)
    ra, dec = result.best_dir
    assert got["best"]["ra"] == pytest.approx(math.degrees(ra), abs=1e-9)
    assert got["best"]["dec"] == pytest.approx(math.degrees(dec), abs=1e-9)
    # Each pixel's value is -2 ΔlnL from the best over all nsides; the NaN one is left out.
    assert got["count"] == sum(len(part["data"]) for part in written.values()) - 1
    for nside in DEFAULT:
        rows = result.get_results_per_nside(nside)
        values = dict(got["values"][str(nside)])
        for row in rows[:: max(1, len(rows) // 50)]:
            if np.isfinite(row["llh"]):
                assert values[int(row["index"])] == pytest.approx(2 * (row["llh"] - best["llh"]), abs=1e-6)
    assert got["max"] == pytest.approx(2 * (np.nanmax(np.concatenate(
        [result.get_results_per_nside(n)["llh"] for n in DEFAULT])) - best["llh"]), abs=1e-6)  # fmt: skip
    assert healpy.nside2npix(8) == len(dict(got["values"]["8"]))  # the whole sky at the coarsest


def test_the_js_leaves_out_what_it_cannot_read(tmp_path: Path) -> None:
    """Rows that are no rows, pixels that no nside has, llh that are no numbers, parts with no data: left
    out, the rest read (a page shows what it can rather than failing)."""
    odd = {
        "nside-8": {
            "columns": ["index", "llh"],
            "data": [None, [1, "x"], [-1, 2.0], [768, 1.0], [5, 7.5], [6, 9.0]],
        },
        "nside-64": {"columns": ["llh"], "data": [[1.0]]},  # no index column
        "nside-x": {"data": [[1, 1.0]]},
        "metadata": "not a part",
    }
    sky = run_js(tmp_path, {"pixels": {}, "angles": {}, "result": odd})["sky"]
    assert sky["count"] == 2
    assert (sky["best"]["nside"], sky["best"]["pixel"], sky["best"]["llh"]) == (8, 5, 7.5)
    assert dict(sky["values"]["8"]) == {5: 0, 6: 3}
    assert run_js(tmp_path, {"pixels": {}, "angles": {}, "result": {}})["sky"]["best"] is None
