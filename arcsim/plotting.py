"""Shared chart helpers (torch-free): atomic PNG writes and plain log-axis labels."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter


def save_png(fig: Figure, path: Path) -> Path:
    """Write the figure beside its final name, then rename: no half-written PNG is ever left."""
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}.png")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    os.replace(tmp, path)
    return path


def plain_log_ticks(ax: Axes, axes: str = "xy") -> None:
    """Log axes labelled 2, 5, 10 rather than 2×10⁰."""
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_formatter(fmt)
        axis.set_minor_formatter(fmt)
