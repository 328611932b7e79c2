"""Charts of a sweep's results table (torch-free, but for the heatmap, which asks `arcsim run`'s rule).

Each kind needs some axes to vary; the other varied axes are held at their first value (or where
``arcsim plot --where`` puts them), and the chart's subtitle and a note say which. ``plot_all`` draws every kind
the table supports and says why it skipped the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap, TwoSlopeNorm
from matplotlib.ticker import NullFormatter

from arcsim.catalog import AG_FAMILY, AR_TOPK_FAMILY, DENSITY_FREE
from arcsim.errors import ArcsimError
from arcsim.plotting import PALETTE, save_png
from arcsim.sweep.spec import SweepError
from arcsim.units import parse_duration, parse_rate

# result columns that identify a point's setting (the swept axes as they came out)
DIMENSIONS = ("topology_name", "nic_gbps", "latency_us", "world", "model", "trace", "density", "bucket_mb", "engine",
              "gpu", "library", "fusion", "hierarchy")
LABELS = {"topology_name": "topology", "nic_gbps": "NIC Gb/s", "latency_us": "latency µs", "world": "ranks",
          "model": "model", "trace": "trace", "density": "density", "bucket_mb": "bucket MiB", "engine": "engine",
          "gpu": "GPU", "library": "library", "fusion": "fusion", "hierarchy": "hierarchy"}


class PlotUnsupported(SweepError):
    """The table does not vary what this kind of chart needs."""


INCOMPLETE = "incomplete"  # DataFrame.attrs key: the banner every chart of a partial sweep carries


def _varied(df: pd.DataFrame, col: str) -> bool:
    return df[col].nunique(dropna=False) > 1


Held = list[tuple[str, object, list[object]]]  # (column, the value kept, the values left out)


def hold_others(df: pd.DataFrame, keep: tuple[str, ...]) -> tuple[pd.DataFrame, str]:
    """Fix every varied dimension that ``keep`` does not determine at its first value; say which."""
    df, held = _hold(df, keep)
    return df, (f"held at {', '.join(f'{LABELS[col]} {_fmt(first)}' for col, first, _ in held)}" if held else "")


def held_note(df: pd.DataFrame, keep: tuple[str, ...]) -> str:
    """What a chart keeping ``keep`` leaves out of ``df``, and how to draw it instead (empty: nothing)."""
    _, held = _hold(df, keep)
    if not held:
        return ""
    col, _, rest = held[-1]
    return (f"holds {', '.join(f'{LABELS[c]} at {_fmt(v)} (not drawn: {_join(r)})' for c, v, r in held)}; "
            f"draw another with --where, e.g. --where {WHERE_NAME[col]}={_fmt(rest[0])}{WHERE_UNIT.get(col, '')}")


def _join(values: list[object]) -> str:
    return ", ".join(map(_fmt, values[:6])) + (f" and {len(values) - 6} more" if len(values) > 6 else "")


def _hold(df: pd.DataFrame, keep: tuple[str, ...]) -> tuple[pd.DataFrame, Held]:
    """``df`` with every varied dimension that ``keep`` does not determine at its first value, and which."""
    held: Held = []
    for col in DIMENSIONS:
        if col not in df:  # a table written before the column existed
            continue
        sparse = df[~df["compressor"].isin(DENSITY_FREE)] if col == "density" else df  # dense has no density
        if col in keep or not _varied(sparse, col):
            continue
        groups = df.groupby(list(keep), dropna=False)[col].nunique(dropna=False) if keep else None
        if groups is not None and groups.max() <= 1:
            continue  # determined by the kept axes (e.g. the topology name when the topologies differ in bandwidth)
        values = df.loc[~df["compressor"].isin(DENSITY_FREE), col] if col == "density" else df[col]
        first, *rest = sorted(values.dropna().unique(), key=lambda v: (str(type(v)), v))
        keep_free = df["compressor"].isin(DENSITY_FREE) if col == "density" else False  # dense has no density
        df = df[(df[col] == first) | keep_free]
        held.append((col, first, rest))
    return df, held


# `arcsim plot --where NAME=VALUE`: the sweep's axis names, the results column each selects, how a value reads
WHERE: dict[str, tuple[str, Callable[[str], object]]] = {
    "topology": ("topology_name", str), "bandwidth": ("nic_gbps", lambda v: parse_rate(v) * 8 / 1e9),
    "latency": ("latency_us", lambda v: parse_duration(v) * 1e6), "ranks": ("world", int), "model": ("model", str),
    "trace": ("trace", str), "density": ("density", float), "bucket_mb": ("bucket_mb", float),
    "engine": ("engine", str), "gpu": ("gpu", str), "library": ("library", str), "fusion": ("fusion", str),
    "hierarchy": ("hierarchy", str)}
WHERE_NAME = {col: name for name, (col, _) in WHERE.items()}
WHERE_UNIT = {"nic_gbps": "Gbit", "latency_us": "us"}  # what --where's value needs after a column's number


def select(df: pd.DataFrame, conditions: tuple[str, ...]) -> pd.DataFrame:
    """The rows where every ``NAME=VALUE`` holds (dense and fp16 keep any density); the chart says so."""
    said = []
    for condition in conditions:
        name, _, text = condition.partition("=")
        name = name.strip()
        if name not in WHERE or not text.strip():
            raise SweepError(f"--where {condition!r}: write NAME=VALUE with NAME one of {', '.join(WHERE)} "
                             "(e.g. --where ranks=32)")
        col, read = WHERE[name]
        if col not in df:
            have = ", ".join(n for n, (c, _) in WHERE.items() if c in df)
            raise SweepError(f"--where {condition!r}: this table has no {col} column (written before that axis "
                             f"existed, or by a sweep without it); --where takes {have}")
        try:
            value = read(text.strip())
        except (ValueError, ArcsimError):
            raise SweepError(f"--where {condition!r}: cannot read {text.strip()!r} as a {name}") from None
        match = np.isclose(df[col].astype(float), float(value)) if isinstance(value, float | int) else df[col] == value
        free = (df["compressor"].isin(DENSITY_FREE) if col == "density"  # dense has no density: kept
                else pd.Series(False, index=df.index))
        if not bool(np.any(match & ~free)):
            present = ", ".join(_fmt(v) for v in sorted(df[col].dropna().unique(), key=str)[:12])
            raise SweepError(f"--where {condition!r} matches no point; the table has {name} {present}")
        df = df[match | free]
        said.append(f"{LABELS[col]} {_fmt(value)}")
    out = df.copy()
    out.attrs["where"] = ", ".join(said)
    return out


def _fmt(v: object) -> str:
    return f"{v:g}" if isinstance(v, float | np.floating) else str(v)


def _title(ax: plt.Axes, main: str, df: pd.DataFrame, held: str) -> None:
    model = ", ".join(sorted(map(str, df["model"].unique()))) if "model" in df else "a model the table does not name"
    worlds = sorted(df["world"].unique()) if "world" in df else []
    ranks = f", {worlds[0]} ranks" if len(worlds) == 1 and "ranks " not in held else ""
    topologies = sorted(map(str, df["topology"].unique())) if "topology" in df else []
    on = f" on {', '.join(topologies)}" if 0 < len(topologies) <= 3 else ""
    banner = df.attrs.get(INCOMPLETE, "").upper()
    where = df.attrs.get("where", "")
    sub = " · ".join(s for s in (f"{model}{on}{ranks}", f"where {where}" if where else "", held, banner) if s)
    ax.set_title(f"{main}\n{sub}", fontsize=10, color="#c44e52" if banner else "black")


def _log_ticks_at(ax: plt.Axes, values: list, base: float = 10) -> None:
    """A log x axis labelled only at the swept values."""
    ax.set_xscale("log", base=base)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_formatter(NullFormatter())


def _colour_of(names: list[str]) -> dict[str, tuple]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sorted(names))}


RULES = {"auto": "the soonest to the target", "none": "the knee of the usable time/error front"}
ANY_ERROR = "the fastest, whatever its error"


def fastest_by_cell(df: pd.DataFrame, policy: str | None = "auto") -> tuple[list, list, np.ndarray, np.ndarray]:
    """Bandwidths, densities, and per (bandwidth, density) cell the compressor `arcsim run --policy <policy>`
    recommends among the cell's settings (RULES), with its speed-up over dense; dense and fp16 (no density)
    compete in every cell of their bandwidth. ``policy`` None: the fastest, whatever its error."""
    sparse = df[~df["compressor"].isin(DENSITY_FREE)]
    bws, dens = sorted(df["nic_gbps"].unique()), sorted(sparse["density"].unique())
    winners = np.empty((len(bws), len(dens)), dtype=object)
    speedup = np.zeros((len(bws), len(dens)))
    for i, bw in enumerate(bws):
        at_bw = df[df["nic_gbps"] == bw]
        for j, d in enumerate(dens):
            cell = at_bw[(at_bw["density"] == d) | at_bw["compressor"].isin(DENSITY_FREE)]
            best = cell.loc[run_pick(cell, policy) if policy is not None else cell["iteration_s"].idxmin()]
            winners[i, j], speedup[i, j] = best["compressor"], best["dense_iteration_s"] / best["iteration_s"]
    return bws, dens, winners, speedup


@dataclass
class Row:
    """A results row as `arcsim run`'s decisions read a setting."""

    compressor: str
    iteration_s: float
    rel_error: float
    label: Hashable


def run_pick(rows: pd.DataFrame, policy: str) -> Hashable:
    """The label of the row `arcsim run --policy <policy>` recommends among ``rows`` (one setting each): auto, the
    soonest to the target (arcsim.run.policies.soonest); none, the knee of the usable front
    (arcsim.run.decisions.front_pick)."""
    from arcsim.run.convergence import fit_steps_model
    from arcsim.run.decisions import front_pick, usable
    from arcsim.run.policies import soonest

    found = [Row(r.compressor, float(r.iteration_s), float(r.rel_error), r.Index) for r in rows.itertuples()]
    if policy == "auto":
        best = soonest(found, fit_steps_model())
    else:
        best = found[front_pick(found)[0]] if any(usable(r) for r in found) else None
    if best is None:
        raise PlotUnsupported(f"heatmap: no setting at {_fmt(rows['nic_gbps'].iloc[0])} Gb/s that arcsim run would "
                              "recommend (every one unusable or unknown to its steps model): add dense to the "
                              "compressors, or draw with --any-error")
    return best.label


def ag_over_ar(df: pd.DataFrame) -> pd.Series:
    """Per (model, bandwidth): the best all-gather top-k time over the best all-reduce top-k time."""
    ag = df[df["compressor"].isin(AG_FAMILY)].groupby(["model", "nic_gbps"])["iteration_s"].min()
    ar = df[df["compressor"].isin(AR_TOPK_FAMILY)].groupby(["model", "nic_gbps"])["iteration_s"].min()
    return ag / ar


def heatmap(df: pd.DataFrame, path: Path, policy: str | None = "auto") -> Path:
    """`arcsim run --policy <policy>`'s pick in each (bandwidth, density) cell (None: the fastest, whatever its
    error), with its speed-up over dense."""
    if not (_varied(df, "nic_gbps") and df.loc[~df["compressor"].isin(DENSITY_FREE), "density"].nunique() > 1):
        raise PlotUnsupported("heatmap needs at least two bandwidths and two densities")
    df, held = hold_others(df, KINDS["heatmap"].keep)
    bws, dens, winners, speedup = fastest_by_cell(df, policy)
    names = sorted(set(winners.ravel()))
    colours = _colour_of(names)
    index = np.vectorize(names.index)(winners)
    fig, ax = plt.subplots(figsize=(1.1 * len(dens) + 3, 0.55 * len(bws) + 2.2))
    ax.imshow(index, cmap=ListedColormap([colours[n] for n in names]), vmin=-0.5, vmax=len(names) - 0.5,
              aspect="auto", origin="lower")
    for i in range(len(bws)):
        for j in range(len(dens)):
            ax.text(j, i, f"{winners[i, j]}\n{speedup[i, j]:.2f}×", ha="center", va="center", fontsize=7,
                    color="white")
    ax.set_xticks(range(len(dens)), [f"{d:g}" for d in dens])
    ax.set_yticks(range(len(bws)), [f"{b:g}" for b in bws])
    ax.set_xlabel("density k/d (fraction of gradient entries sent)")
    ax.set_ylabel("per-NIC bandwidth (Gb/s)")
    rule = ANY_ERROR if policy is None else f"arcsim run's pick, {RULES[policy]} (--policy {policy})"
    _title(ax, f"{rule[0].upper()}{rule[1:]}, by bandwidth and density\n(label: speed-up over dense on its "
               "fastest collective)", df, held)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    ax.legend(handles, names, title="fastest" if policy is None else "run's pick", bbox_to_anchor=(1.02, 1),
              loc="upper left", fontsize=8)
    return _finish(fig, path)


def speedup_vs_ranks(df: pd.DataFrame, path: Path) -> Path:
    """Speed-up over dense against the rank count, one line per compressor."""
    if not _varied(df, "world"):
        raise PlotUnsupported("speedup needs at least two rank counts (sweep `ranks` or topologies of different "
                              "sizes)")
    df, held = hold_others(df, KINDS["speedup"].keep)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = _colour_of(list(df["compressor"].unique()))
    for name, rows in df.groupby("compressor"):
        rows = rows.sort_values("world")
        ax.plot(rows["world"], rows["speedup_vs_dense"], marker="o", color=colours[name], label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    _log_ticks_at(ax, sorted(df["world"].unique()), base=2)
    ax.set_xlabel("ranks (GPUs)")
    ax.set_ylabel("speed-up over dense fp32 on its fastest collective (×)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="compressor", loc="best")
    _title(ax, "Iteration speed-up over dense as the cluster grows", df, held)
    return _finish(fig, path)


def crossover(df: pd.DataFrame, path: Path) -> Path:
    """Best All-Gather top-k over best All-Reduce top-k, across bandwidth (× model size when several models)."""
    have = set(df["compressor"])
    if not (have & set(AG_FAMILY) and have & set(AR_TOPK_FAMILY)):
        raise PlotUnsupported("crossover needs an all-gather top-k (topk, gaussiank) and an all-reduce top-k "
                              "(arctopk, star, var) among the compressors")
    if not _varied(df, "nic_gbps"):
        raise PlotUnsupported("crossover needs at least two bandwidths")
    df, held = hold_others(df, KINDS["crossover"].keep)
    ratio = ag_over_ar(df)
    params = df.groupby("model")["params"].first().sort_values()
    bws = sorted(df["nic_gbps"].unique())
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(bws) + 3), 0.6 * len(params) + 3))
    if len(params) == 1:
        model = params.index[0]
        ys = [ratio.get((model, b), np.nan) for b in bws]
        ax.plot(bws, ys, marker="o", color="C0")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        _log_ticks_at(ax, bws)
        ax.set_xlabel("per-NIC bandwidth (Gb/s)")
        ax.set_ylabel("best all-gather ÷ best all-reduce top-k time")
        ax.grid(alpha=0.3)
        ax.text(0.02, 0.96, "above 1: all-reduce top-k is faster", transform=ax.transAxes, va="top", fontsize=8)
    else:
        grid = np.array([[ratio.get((m, b), np.nan) for b in bws] for m in params.index], dtype=float)
        logs = np.log2(grid)
        span = max(1e-3, float(np.nanmax(np.abs(logs))))
        im = ax.imshow(logs, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -span, span), aspect="auto", origin="lower")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if not math.isnan(grid[i, j]):
                    dark = abs(logs[i, j]) > 0.6 * span
                    ax.text(j, i, f"{grid[i, j]:.2g}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
        ax.set_xticks(range(len(bws)), [f"{b:g}" for b in bws])
        ax.set_yticks(range(len(params)), [f"{m}\n{p / 1e6:.3g} M" for m, p in params.items()])
        ax.set_xlabel("per-NIC bandwidth (Gb/s)")
        ax.set_ylabel("model (parameters)")
        bar = fig.colorbar(im, ax=ax)
        bar.set_label("log₂(all-gather ÷ all-reduce top-k time); red: all-reduce wins")
    _title(ax, "All-Gather vs All-Reduce top-k: where they trade places", df, held)
    return _finish(fig, path)


def breakdown(df: pd.DataFrame, path: Path) -> Path:
    """Where each compressor's iteration goes: compute, the cluster's effects, compression, exposed communication."""
    df, held = hold_others(df, KINDS["breakdown"].keep)
    rows = df.sort_values("iteration_s")
    dense = rows["dense_iteration_s"].iloc[0]
    ways = rows["hierarchy"] if "hierarchy" in rows else pd.Series("flat", index=rows.index)
    labels = [f"{c}\n{op} {coll}" + ("" if h == "flat" else f", {h}") for c, op, coll, h in
              zip(rows["compressor"], rows["op"], rows["collective"], ways, strict=True)]
    fig, ax = plt.subplots(figsize=(max(6, 1.0 * len(rows) + 2), 4.5))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for col, name, colour in (("compute_s", "compute", "C7"), ("effects_s", "the cluster's effects", "C4"),
                              ("compress_s", "compression", "C1"), ("exposed_comm_s", "exposed communication", "C0")):
        if col not in rows or not rows[col].any():  # a table without effects (or none on its cluster)
            continue
        values = rows[col].to_numpy() * 1e3
        ax.bar(x, values, bottom=bottom, color=colour, label=name)
        bottom += values
    ax.axhline(dense * 1e3, color="black", lw=0.8, ls="--", label="dense iteration")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("time per iteration (ms)")
    ax.legend(fontsize=8)
    _title(ax, "Iteration time breakdown per compressor", df, held)
    return _finish(fig, path)


def hierarchy(df: pd.DataFrame, path: Path) -> Path:
    """Node-aware over flat iteration time per compressor, across bandwidth: below 1 node-aware is faster."""
    if "hierarchy" not in df or set(df["hierarchy"].dropna()) != {"flat", "node"}:
        raise PlotUnsupported("hierarchy needs both flat and node on the hierarchy axis")
    if not _varied(df, "nic_gbps"):
        raise PlotUnsupported("hierarchy needs at least two bandwidths")
    df, held = hold_others(df, KINDS["hierarchy"].keep)
    times = df.groupby(["compressor", "nic_gbps", "hierarchy"])["iteration_s"].min().unstack("hierarchy")
    ratio = (times["node"] / times["flat"]).dropna()
    bws = sorted(df["nic_gbps"].unique())
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(bws) + 3), 4.5))
    names = sorted(ratio.index.get_level_values("compressor").unique())
    colours = _colour_of(names)
    for name in names:
        line = ratio.loc[name]
        ax.plot(line.index, line.to_numpy(), marker="o", color=colours[name], label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    _log_ticks_at(ax, bws)
    ax.set_xlabel("per-NIC bandwidth (Gb/s)")
    ax.set_ylabel("node-aware ÷ flat iteration time")
    ax.text(0.02, 0.02, "below 1: node-aware compression is faster", transform=ax.transAxes, va="bottom", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, title="compressor")
    _title(ax, "Node-aware (dense in node, compressed between) vs flat compression", df, held)
    return _finish(fig, path)


def _finish(fig: plt.Figure, path: Path) -> Path:
    try:
        return save_png(fig, path)
    finally:
        plt.close(fig)


@dataclass(frozen=True)
class Chart:
    """One kind of chart: how it draws, the dimensions it separates (the others are held), the columns it reads."""

    draw: Callable[[pd.DataFrame, Path], Path]
    keep: tuple[str, ...]
    needs: tuple[str, ...]


KINDS: dict[str, Chart] = {
    "heatmap": Chart(heatmap, ("nic_gbps", "density"), ("nic_gbps", "density", "rel_error", "dense_iteration_s")),
    "speedup": Chart(speedup_vs_ranks, ("world",), ("world", "speedup_vs_dense")),
    "crossover": Chart(crossover, ("nic_gbps", "model"), ("nic_gbps", "model", "params")),
    "breakdown": Chart(breakdown, (), ("dense_iteration_s", "op", "collective", "compute_s", "compress_s",
                                       "exposed_comm_s")),
    "hierarchy": Chart(hierarchy, ("nic_gbps", "compressor", "hierarchy"), ("nic_gbps", "hierarchy"))}


def _check_columns(df: pd.DataFrame, kind: str, needs: tuple[str, ...]) -> None:
    missing = [c for c in needs if c not in df]
    if missing:
        raise PlotUnsupported(f"{kind} needs the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                              "this table lacks (written by an older arcsim sweep?)")


def incompleteness(df: pd.DataFrame, expected: int | None) -> str:
    """``incomplete: N of M points`` when the table holds fewer rows than its sweep has points, else empty."""
    return f"incomplete: {len(df)} of {expected} points" if expected is not None and len(df) < expected else ""


def plot_all(df: pd.DataFrame, out_dir: Path, kinds: tuple[str, ...] = tuple(KINDS),
             policy: str | None = "auto", expected: int | None = None,
             announce: Callable[[str], None] = lambda _: None) -> tuple[list[Path], list[str]]:
    """Every requested kind the table supports; returns (written files, reasons for the skipped ones), and
    ``announce``s what each chart holds and leaves out.

    With ``expected`` (the sweep's point count) a table that holds fewer rows is drawn with
    "incomplete: N of M points" on every chart. Speed-ups never need a missing row: each row carries the
    dense time of its own point (``dense_iteration_s``)."""
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    df = df.copy()
    if expected is not None:  # else: what the caller set (a table narrowed by --where keeps the whole one's banner)
        df.attrs[INCOMPLETE] = incompleteness(df, expected)
    written, skipped = [], []
    for kind in kinds:
        chart = KINDS[kind]
        try:
            _check_columns(df, kind, chart.needs)
            path = out_dir / f"{kind}.png"
            written.append(heatmap(df, path, policy) if kind == "heatmap" else chart.draw(df, path))
        except PlotUnsupported as exc:
            skipped.append(str(exc))
            continue
        left_out = held_note(df, chart.keep)
        if left_out:
            announce(f"{path.name} {left_out}")
    if created and not written and not any(out_dir.iterdir()):
        out_dir.rmdir()  # nothing drawn: leave no empty folder behind
    return written, skipped
