"""Held-out accuracy (or, with a loss target, held-out loss) against training step and against predicted
wall-clock, one line per compressor (mean over seeds, shaded between the lowest and highest seed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from arcsim.plotting import PALETTE, save_png
from arcsim.run.target import Target


def _curves(history: pd.DataFrame, x: str,
            y: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per compressor: x, mean, min and max of ``y`` over seeds at each evaluation step."""
    evals = history.dropna(subset=[y])
    out = {}
    for name, rows in evals.groupby("compressor", sort=False):
        by_step = rows.groupby("step")
        out[name] = (by_step[x].mean().to_numpy(), by_step[y].mean().to_numpy(),
                     by_step[y].min().to_numpy(), by_step[y].max().to_numpy())
    return out


def _metric_axis(ax: plt.Axes, target: Target | None) -> str:
    """Label the y axis for the target's metric, draw the target; the history column to plot."""
    column = target.column if target is not None else "accuracy"
    if target is not None:
        ax.axhline(target.value, color="grey", lw=0.8, ls="--", label=f"target {target.short}")
    if column == "accuracy":
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
    else:
        ax.set_ylabel("held-out loss (nats)")
    return column


def accuracy_plot(history: pd.DataFrame, x: str, path: Path, title: str, target: Target | None) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    names = list(dict.fromkeys(history["compressor"]))
    column = _metric_axis(ax, target)
    for i, (name, (xs, mean, lo, hi)) in enumerate(_curves(history, x, column).items()):
        colour = PALETTE[names.index(name) % len(PALETTE)] if name in names else PALETTE[i]
        ax.plot(xs * (1e3 if x == "time_s" else 1), mean, color=colour, label=name)
        ax.fill_between(xs * (1e3 if x == "time_s" else 1), lo, hi, color=colour, alpha=0.15, lw=0)
    ax.set_xlabel("training step" if x == "step" else "predicted wall-clock (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if column == "accuracy" else "upper right")
    seeds = history["seed"].nunique()
    ax.set_title(f"{title}\n(mean over {seeds} seed{'s' if seeds != 1 else ''}; band: lowest to highest seed)",
                 fontsize=10)
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)


def schedule_plot(history: pd.DataFrame, headline: pd.DataFrame, phases: list[tuple[int, str]], warmup: int,
                  path: Path, title: str, target: Target | None) -> Path:
    """Top: held-out accuracy against predicted wall-clock for the best static choice and adaptive
    (mean over seeds, band from the lowest to the highest seed), network phases shaded at the adaptive run's
    clock. Bottom: a timeline strip of what each policy used at every step (first seed), phases marked."""
    trained = set(zip(history["policy"], history["choice"], strict=True))
    runs = [(r["policy"], r["choice"]) for _, r in headline.iterrows() if (r["policy"], r["choice"]) in trained]
    fig, (top, strip) = plt.subplots(2, 1, figsize=(8.5, 6.6), gridspec_kw={"height_ratios": [3, 1.4]})
    policy = "adaptive" if "adaptive" in set(history["policy"]) else runs[0][0] if runs else ""
    clock = history[history["policy"] == policy].groupby("step")["time_s"].mean()  # mean over seeds
    starts = [s for s, _ in phases]
    last = int(clock.index.max()) if not clock.empty else 0
    for i, (start, label) in enumerate(phases):
        strip.axvline(start, color="grey", lw=0.8, ls=":")
        strip.text(start, 1.01, f" {i + 1}", fontsize=7, va="bottom", transform=strip.get_xaxis_transform())
        if start >= last:
            continue  # the clock's run ended before this phase
        end = min(starts[i + 1] if i + 1 < len(starts) else last, last)
        lo, hi = (float(clock.get(start, 0.0)) if start > 0 else 0.0), float(clock.get(end, clock.iloc[-1]))
        top.axvspan(lo, hi, color="grey", alpha=0.05 if i % 2 == 0 else 0.16, lw=0)
        top.text(lo, 0.985, f" {i + 1}: {label}", ha="left", va="top", fontsize=7, rotation=90,
                 transform=top.get_xaxis_transform())
    if warmup:
        strip.axvspan(0.5, warmup + 0.5, facecolor="none", hatch="////", edgecolor="grey", lw=0)
        strip.text(warmup / 2, -0.55, "warm-up", ha="center", va="center", fontsize=6)
    column = _metric_axis(top, target)
    evals = history.dropna(subset=[column])
    for i, (policy_name, choice) in enumerate(runs):
        rows = evals[(evals["policy"] == policy_name) & (evals["choice"] == choice)]
        by_step = rows.groupby("step")
        name = f"static {choice}" if policy_name == "static" else policy_name
        top.plot(by_step["time_s"].mean(), by_step[column].mean(), color=PALETTE[i], label=name)
        top.fill_between(by_step["time_s"].mean(), by_step[column].min(), by_step[column].max(),
                         color=PALETTE[i], alpha=0.15, lw=0)
    top.set_xlabel(f"predicted wall-clock (s); shaded: network phases, at the {policy} run's clock")
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="lower right" if column == "accuracy" else "upper right")
    top.set_title(title, fontsize=10)
    _strip(strip, history, runs)
    fig.tight_layout()
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)


def _strip(ax: plt.Axes, history: pd.DataFrame, runs: list[tuple[str, str]]) -> None:
    """One row per policy (its first seed): a block per stretch of steps with one (compressor, collective),
    labelled with the ratio where it changes."""
    kinds: dict[str, int] = {}
    for row, (policy, choice) in enumerate(reversed(runs)):
        run = history[(history["policy"] == policy) & (history["choice"] == choice)]
        run = run[run["seed"] == run["seed"].min()].sort_values("step")
        keys = list(zip(run["compressor"], run["collective"].fillna(""), run["density"],
                        run["hierarchy"].fillna("flat"), strict=True))
        start = 0
        for i in range(1, len(keys) + 1):
            if i < len(keys) and keys[i] == keys[start]:
                continue
            compressor, collective, density, way = keys[start]
            kind = f"{compressor} {collective}" + ("" if way == "flat" else f" {way}")
            colour = PALETTE[kinds.setdefault(kind, len(kinds)) % len(PALETTE)]
            ax.broken_barh([(start + 1, i - start)], (row - 0.4, 0.8), color=colour, alpha=0.8, lw=0)
            if i - start >= 4:
                ax.text(start + 1 + (i - start) / 2, row, f"{density:.3g}", ha="center", va="center", fontsize=6)
            start = i
    ax.set_yticks(range(len(runs)), [f"static {c}" if p == "static" else p for p, c in reversed(runs)], fontsize=8)
    ax.set_ylim(-0.6, len(runs) + 0.2)
    ax.set_xlabel("training step; blocks: compressor, collective (and node: node-aware), numbers: compression "
                  "ratio (first seed)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=PALETTE[i % len(PALETTE)], alpha=0.8) for i in kinds.values()]
    ax.legend(handles, list(kinds), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
