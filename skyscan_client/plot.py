"""`skyscan plot`: a stored result drawn by icecube-skyreader, the field's own plotter.

skyreader's `SkyScanPlotter` draws the full-sky map (`create_plot`) and the zoom around the best fit
with its contours (`create_plot_zoomed`) and saves each as a PDF under fixed names, with side files
(FITS maps, contour lists; for a result of one nside it fails on those after drawing the zoom). We
let it draw exactly as it does, in a scratch directory, and take each figure at the moment it saves
it, as a PNG at our resolution; the two end side by side in one PNG.
skyreader and its scientific stack come with the `plot` extra, so the service image never carries them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'skyscan[plot]'"
DPI = 110  # skyreader's own 300/1200 dpi make multi-megabyte pictures for a screen


class PlotExtraMissing(Exception):
    """skyreader (the `plot` extra) is not installed."""


def require_extra() -> Any:
    """matplotlib's Figure class, once skyreader is known to be there; else PlotExtraMissing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: draw into memory
        import skyreader  # noqa: F401  (the extra's presence)
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotExtraMissing(f"plotting needs icecube-skyreader: {INSTALL_HINT} ({e})") from e
    return Figure


@contextlib.contextmanager
def _saved_figures(figure_class: Any, dpi: int) -> Iterator[list[bytes]]:
    """Every `Figure.savefig` inside becomes a PNG in the yielded list (and no file)."""
    pictures: list[bytes] = []
    original = figure_class.savefig

    def capture(figure: Any, *args: Any, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        original(figure, buffer, format="png", dpi=dpi, facecolor="white", bbox_inches="tight")
        pictures.append(buffer.getvalue())

    figure_class.savefig = capture
    try:
        yield pictures
    finally:
        figure_class.savefig = original


def _side_by_side(pictures: list[bytes], dpi: int) -> bytes:
    """One PNG of the pictures in a row, scaled to the same height."""
    from matplotlib import image
    from matplotlib.figure import Figure

    images = [image.imread(io.BytesIO(p), format="png") for p in pictures]
    height = max(i.shape[0] for i in images)
    widths = [i.shape[1] * height / i.shape[0] for i in images]
    figure = Figure(figsize=(sum(widths) / dpi, height / dpi), dpi=dpi, facecolor="white")
    left = 0.0
    for picture, width in zip(images, widths, strict=True):
        axes = figure.add_axes((left / sum(widths), 0.0, width / sum(widths), 1.0))
        axes.imshow(picture, interpolation="antialiased")
        axes.set_axis_off()
        left += width
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()


def _zoom(plotter: Any, result: Any) -> None:
    """skyreader's zoom around the best fit, drawn into pyplot's current figure, its legend last. For a
    result of one nside skyreader then fails on a side file (its multi-order FITS map needs two): the
    zoom it drew is kept if it got as far as the legend; else the full sky stands alone."""
    from matplotlib import pyplot

    try:
        plotter.create_plot_zoomed(result, plot_bounding_box=True)
    except ValueError:
        if len(result.nsides) > 1:
            raise
        zoom = pyplot.gcf()
        if any(axes.get_legend() for axes in zoom.axes):
            zoom.savefig(io.BytesIO())  # taken by _saved_figures like skyreader's own


def skymap_pictures(scan_result: dict[str, Any], *, dpi: int = DPI) -> list[bytes]:
    """The full-sky map and the zoom around the best fit (when it can be drawn) of a result in
    skyreader's format, each a PNG.

    Raises PlotExtraMissing without skyreader, ValueError for what skyreader cannot read."""
    figure_class = require_extra()
    from skyreader import SkyScanResult
    from skyreader.plot import SkyScanPlotter

    result = SkyScanResult.deserialize(scan_result)
    logging.getLogger("skyreader").setLevel(logging.WARNING)
    with (
        tempfile.TemporaryDirectory(prefix="skyscan-plot-") as scratch,
        _saved_figures(figure_class, dpi) as pictures,
        warnings.catch_warnings(),
        contextlib.redirect_stdout(sys.stderr),  # skyreader prints its contour areas: keep stdout clean
    ):
        warnings.simplefilter("ignore")  # numpy/healpy chatter about masked and NaN pixels
        plotter = SkyScanPlotter(output_dir=Path(scratch))
        plotter.create_plot(result)
        _zoom(plotter, result)
    from matplotlib import pyplot

    pyplot.close("all")
    return pictures


def skymap_png(scan_result: dict[str, Any], *, dpi: int = DPI) -> bytes:
    """`skymap_pictures` side by side in one PNG."""
    return _side_by_side(skymap_pictures(scan_result, dpi=dpi), dpi)


def write_skymap(scan_result: dict[str, Any], out: Path, *, dpi: int = DPI) -> Path:
    out.write_bytes(skymap_png(scan_result, dpi=dpi))
    return out
