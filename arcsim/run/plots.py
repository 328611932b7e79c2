"""PNG charts of an `arcsim run` result: iteration breakdown, Pareto front, AG/AR crossover."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from arcsim.plotting import MARKERS, PALETTE, data_axis, save_png
from arcsim.run.analysis import RunResult
from arcsim.run.candidates import Candidate
from arcsim.run.report import best_per_compressor, short_collective


def _subtitle(result: RunResult) -> str:
    t, topo = result.ctx.trace_file, result.ctx.topo
    return f"{t.meta['model']} ({t.label}) on {topo.name}, {topo.ranks} ranks"


def _is_baseline(c: Candidate, result: RunResult) -> bool:
    return c.compressor == "dense" and c.collective == result.dense.collective


PARTS = (("compute (forward + backward)", "#4c72b0"), ("the cluster's effects (stragglers, interference)", "#8172b3"),
         ("compression on the compute stream", "#dd8452"), ("exposed communication", "#c44e52"))


Row = tuple[float, float, float, float]  # ms of each of PARTS


def _breakdown_rows(result: RunResult) -> tuple[list[str], list[Row]]:
    """Labels and (compute, the cluster's effects, compression, exposed communication) ms of dense, each
    compressor's best, the policy."""
    best = [c for c in best_per_compressor(result) if not _is_baseline(c, result)]
    labels = [f"dense fp32\n{result.dense.collective} (baseline)"] + [
        f"{c.compressor}\n{short_collective(c.op, c.collective, c.hierarchy)}" for c in best]
    rows: list[Row] = [(c.compute_s * 1e3, c.effects_s * 1e3, c.compress_s * 1e3, c.exposed_comm_s * 1e3)
                       for c in [result.dense, *best]]
    if result.policy:
        pol, d = result.policy, result.dense
        labels.append(f"policy ({pol.name})\n{'per bucket' if pol.deploy == 'mix' else 'one choice'}")
        compress = pol.iteration_s - d.compute_stream_s - pol.exposed_comm_s
        rows.append((d.compute_s * 1e3, d.effects_s * 1e3, compress * 1e3, pol.exposed_comm_s * 1e3))
    return labels, rows


def _draw_breakdown(ax, labels: list[str], rows: list[Row], xmax: float) -> None:  # type: ignore[no-untyped-def]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for k, (label, colour) in enumerate(PARTS):
        widths = [r[k] for r in rows]
        if not any(widths):  # e.g. no effects on InfiniBand: no empty entry in the legend
            continue
        ax.barh(y, widths, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, total in enumerate(left):
        ax.text(total, i, f" {total:.3g} ms", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per training iteration (ms)")
    ax.set_xlim(0, xmax * 1.2)


def breakdown(result: RunResult, path: Path) -> Path:
    labels, rows = _breakdown_rows(result)
    fig = Figure(figsize=(9, 0.45 * len(rows) + 1.6))
    ax = fig.subplots()
    _draw_breakdown(ax, labels, rows, max(sum(r) for r in rows))
    ax.set_title(f"Where one iteration's time goes, density {result.config.density:g}\n{_subtitle(result)}",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    return save_png(fig, path)


def gpu_comparison(results: list[RunResult], path: Path) -> Path:
    """The iteration breakdown of each run side by side (one per GPU), on one time axis."""
    drawn = [_breakdown_rows(r) for r in results]
    fig = Figure(figsize=(6 * len(results), 0.45 * max(len(r) for _, r in drawn) + 2), layout="constrained")
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    longest = max(sum(row) for _, rows in drawn for row in rows)
    for ax, result, (labels, rows) in zip(axes, results, drawn, strict=True):
        _draw_breakdown(ax, labels, rows, longest)
        gpu = result.ctx.gpu.full_name if result.ctx.gpu else "compute as measured with the trace"
        dense = result.dense.iteration_s * 1e3
        best = min([*result.candidates, result.dense], key=lambda c: c.iteration_s)
        ax.set_title(f"{gpu}\nfastest: {best.compressor} ({best.iteration_s * 1e3:.3g} ms vs dense {dense:.3g} ms)",
                     fontsize=9)
    axes[0].legend(loc="lower right", fontsize=7)
    first = results[0]
    fig.suptitle(f"Where one iteration's time goes on each GPU: {_subtitle(first)}, density "
                 f"{first.config.density:g}", fontsize=10)
    return save_png(fig, path)


def pareto(result: RunResult, path: Path) -> Path:
    par = result.pareto
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    names = sorted({(p.compressor, p.hierarchy) for p in par.evaluated})
    for i, (name, way) in enumerate(names):
        pts = [p for p in par.evaluated if (p.compressor, p.hierarchy) == (name, way)]
        ax.scatter([p.iteration_s * 1e3 for p in pts], [p.rel_error for p in pts], s=18, alpha=0.6,
                   color=PALETTE[i % len(PALETTE)], marker=MARKERS[i % len(MARKERS)],
                   label=name if way == "flat" else f"{name}, {way}")
    front = par.points
    ax.plot([p.iteration_s * 1e3 for p in front], [p.rel_error for p in front], "k-", lw=1.5, marker="o", ms=5,
            mfc="none", label=f"Pareto front ({len(front)} point{'s' if len(front) != 1 else ''})", zorder=3)
    ch = par.chosen
    where = "" if ch.density is None else f" at density {ch.density:g}"
    ax.scatter([ch.iteration_s * 1e3], [ch.rel_error], marker="*", s=300, color="gold", edgecolor="k",
               zorder=4, label=f"chosen: {ch.compressor}/{ch.collective}{where}")
    ax.annotate(f"{ch.iteration_s * 1e3:.3g} ms, error {ch.rel_error:.3g}", (ch.iteration_s * 1e3, ch.rel_error),
                textcoords="offset points", xytext=(12, 10), fontsize=8,
                arrowprops={"arrowstyle": "-", "color": "0.4"})
    data_axis(ax, "x", [p.iteration_s * 1e3 for p in par.evaluated])
    ax.set_xlabel("predicted iteration time (ms)")
    ax.set_ylabel("relative aggregate error after error feedback ‖agg − ū‖² / ‖ū‖²")
    ax.set_title(f"Speed vs gradient fidelity over ratios {min(par.ratios):g} … {max(par.ratios):g}\n"
                 f"{_subtitle(result)}; {par.rule.split(':')[0]}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    return save_png(fig, path)


def crossover(result: RunResult, path: Path) -> Path:
    cx = result.crossover
    assert cx.bandwidth is not None and cx.nic_gbps is not None  # write_plots skips the chart otherwise
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    ax = axes[0]
    bw = [r["nic_gbps"] for r in cx.bandwidth]
    series = [("best all-gather top-k", "allgather_s", "o-"), ("best all-reduce top-k", "allreduce_s", "s-")]
    for label, key, style in series:
        ax.plot(bw, [r[key] * 1e3 for r in cx.bandwidth], style, ms=3, label=label)
    ax.plot(bw, [r["dense_s"] * 1e3 for r in cx.bandwidth], ":", color="grey", label="dense fp32 (fastest collective)")
    ax.axvline(cx.nic_gbps, color="k", lw=0.8, ls="--", label=f"this cluster ({cx.nic_gbps:g} Gb/s)")
    for f in cx.bandwidth_flips_gbps or []:
        ax.axvline(f["nic_gbps"], color="red", lw=1, label=f"crossover {f['nic_gbps']:.3g} Gb/s")
    ax.set_xscale("log")
    data_axis(ax, "y", [r[k] * 1e3 for r in cx.bandwidth for k in ("allgather_s", "allreduce_s", "dense_s")],
              log_from=2)
    ax.set_xlabel("inter-node bandwidth per NIC (Gb/s, log)")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title(f"AG vs AR top-k as bandwidth varies (density {cx.density:g})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax = axes[1]
    if cx.ratio:
        dens = [r["density"] for r in cx.ratio]
        for label, key, style in series:
            ax.plot(dens, [r[key] * 1e3 for r in cx.ratio], style, ms=3, label=label)
        dense_ms = result.dense.iteration_s * 1e3
        ax.axhline(dense_ms, color="grey", ls=":", label=f"dense fp32 ({result.dense.collective})")
        for f in cx.ratio_flips or []:
            ax.axvline(f["density"], color="red", lw=1, label=f"crossover at density {f['density']:.3g}")
        ax.set_xscale("log")
        data_axis(ax, "y", [r[k] * 1e3 for r in cx.ratio for k in ("allgather_s", "allreduce_s")] + [dense_ms],
                  log_from=2)
        ax.legend(fontsize=7)
    ax.set_xlabel("density k/d (log)")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title(f"AG vs AR top-k as the ratio varies (on {result.ctx.topo.name})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(_subtitle(result), fontsize=10)
    return save_png(fig, path)


def hierarchy(result: RunResult, path: Path) -> Path:
    """Fastest flat against fastest node-aware compression as the inter-node bandwidth varies."""
    cx = result.crossover
    assert cx.hierarchy is not None and cx.nic_gbps is not None  # write_plots skips the chart otherwise
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    bw = [r["nic_gbps"] for r in cx.hierarchy]
    for label, key, style in (("fastest flat (compress across all ranks)", "flat_s", "o-"),
                              ("fastest node-aware (dense in node, compress between)", "node_s", "s-")):
        ax.plot(bw, [r[key] * 1e3 for r in cx.hierarchy], style, ms=3, label=label)
    ax.axvline(cx.nic_gbps, color="k", lw=0.8, ls="--", label=f"this cluster ({cx.nic_gbps:g} Gb/s)")
    for f in cx.hierarchy_flips_gbps or []:
        ax.axvline(f["nic_gbps"], color="red", lw=1, label=f"crossover {f['nic_gbps']:.3g} Gb/s")
    ax.set_xscale("log")
    data_axis(ax, "y", [r[k] * 1e3 for r in cx.hierarchy for k in ("flat_s", "node_s")], log_from=2)
    ax.set_xlabel("inter-node bandwidth per NIC (Gb/s, log)")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title(f"Flat vs node-aware compression (density {cx.density:g})\n{_subtitle(result)}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save_png(fig, path)


def write_plots(result: RunResult, directory: Path) -> tuple[list[Path], list[str]]:
    """The charts written, and a reason for each chart that had nothing to show (not drawn blank)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [breakdown(result, directory / "breakdown.png"), pareto(result, directory / "pareto.png")]
    skipped = []
    if result.crossover.bandwidth is None or result.crossover.nic_gbps is None:
        skipped.append(f"crossover.png: {result.crossover.note}")
    else:
        written.append(crossover(result, directory / "crossover.png"))
    if result.crossover.hierarchy:
        written.append(hierarchy(result, directory / "hierarchy.png"))
    return written, skipped
