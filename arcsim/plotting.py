"""Shared chart helpers (torch-free): atomic PNG writes and plain log-axis labels."""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from arcsim.files import atomic_path

PALETTE: tuple = tuple(matplotlib.colormaps["tab10"](i) for i in range(10))  # one colour per series


def save_png(fig: Figure, path: Path) -> Path:
    """Write the figure beside its final name, then rename: no half-written PNG is ever left."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight")
    return path


def plain_log_ticks(ax: Axes, axes: str = "xy") -> None:
    """Log axes labelled 2, 5, 10 rather than 2×10⁰."""
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(fmt)
