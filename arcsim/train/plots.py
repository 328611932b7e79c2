"""Accuracy against training step and against predicted wall-clock, one line per compressor (mean over
seeds, shaded between the lowest and highest seed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from arcsim.plotting import PALETTE, save_png


def _curves(history: pd.DataFrame, x: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per compressor: x, mean, min and max accuracy over seeds at each evaluation step."""
    evals = history.dropna(subset=["accuracy"])
    out = {}
    for name, rows in evals.groupby("compressor", sort=False):
        by_step = rows.groupby("step")
        out[name] = (by_step[x].mean().to_numpy(), by_step["accuracy"].mean().to_numpy(),
                     by_step["accuracy"].min().to_numpy(), by_step["accuracy"].max().to_numpy())
    return out


def accuracy_plot(history: pd.DataFrame, x: str, path: Path, title: str, target: float | None) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    names = list(dict.fromkeys(history["compressor"]))
    for i, (name, (xs, mean, lo, hi)) in enumerate(_curves(history, x).items()):
        colour = PALETTE[names.index(name) % len(PALETTE)] if name in names else PALETTE[i]
        ax.plot(xs * (1e3 if x == "time_s" else 1), mean, color=colour, label=name)
        ax.fill_between(xs * (1e3 if x == "time_s" else 1), lo, hi, color=colour, alpha=0.15, lw=0)
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls="--", label=f"target {target:.0%}")
    ax.set_xlabel("training step" if x == "step" else "predicted wall-clock (ms)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    seeds = history["seed"].nunique()
    ax.set_title(f"{title}\n(mean over {seeds} seed{'s' if seeds != 1 else ''}; band: lowest to highest seed)",
                 fontsize=10)
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)
