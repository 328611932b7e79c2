"""Shared chart helpers (torch-free): atomic PNG writes, series styles, axes labelled where the data lie."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from arcsim.files import atomic_path

PALETTE: tuple = tuple(matplotlib.colormaps["tab10"](i) for i in range(10))  # one colour per series
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<", ">")  # with PALETTE: series told apart without colour


def save_png(fig: Figure, path: Path) -> Path:
    """Write the figure beside its final name, then rename: no half-written PNG is ever left."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
    return path


def data_axis(ax: Axes, axis: str, values: Iterable[float], log_from: float = 4.0) -> None:
    """Scale an axis to its data and label it where the data lie: log when they span ``log_from``× or more,
    with about six plain ticks (1.2, 2, 5, 10 rather than 10⁰) from the smallest to the largest value."""
    data = np.asarray([v for v in values if v > 0 and np.isfinite(v)], dtype=float)
    if data.size == 0:
        return
    lo, hi = float(data.min()), float(data.max())
    if hi / lo < log_from:
        return
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    ticks = sorted({float(f"{v:.2g}") for v in np.geomspace(lo, hi, 6)})
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
