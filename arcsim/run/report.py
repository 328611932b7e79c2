"""Render an `arcsim run` result: terminal tables, JSON, CSV and plots."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from arcsim.files import write_atomic
from arcsim.run.analysis import MEASURED_AHEAD, MEASURED_AHEAD_PROCESSES, MEASURING_WALL, RunResult
from arcsim.run.candidates import Candidate
from arcsim.run.decisions import UNUSABLE_ERROR, UNUSABLE_NOTE, Crossover, ParetoPoint, Policy, usable
from arcsim.run.doubt import LEVEL, TOO_CLOSE, setting_text, speedup_text
from arcsim.strategy.plan import BucketPlan
from arcsim.units import format_size


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def best_per_compressor(result: RunResult) -> list[Candidate]:
    """Each compressor (each way, flat or node-aware) with its fastest collective, fastest first."""
    best: dict[tuple[str, str], Candidate] = {}
    for c in result.candidates:
        key = (c.compressor, c.hierarchy)
        if key not in best or c.iteration_s < best[key].iteration_s:
            best[key] = c
    return sorted(best.values(), key=lambda c: c.iteration_s)


def to_json(result: RunResult) -> dict[str, Any]:
    t, cfg = result.ctx.trace_file, result.config
    return {
        "topology": {"name": result.ctx.topo.name, "ranks": result.ctx.topo.ranks,
                     "bandwidth_per_nic_bytes_s": result.ctx.topo.network.bandwidth_per_nic,
                     "latency_s": result.ctx.topo.network.latency},
        "trace": {"path": None if t.meta.get("live") else str(t.path), "live": bool(t.meta.get("live")),
                  "model": t.meta["model"], "workers": t.workers, "steps": t.steps,
                  "elements": t.elements, "synthetic_data": t.meta["synthetic_data"]},
        "config": {"density": cfg.density, "engine": cfg.engine, "bucket_mb": cfg.bucket_cap_mb, "policy": cfg.policy,
                   "memory": cfg.memory or "default (ef14; none for dense, fp16)", "ratios": list(cfg.ratios),
                   "compute_profile": cfg.compute_profile, "seed": cfg.seed, "hierarchy": cfg.hierarchy,
                   "exact": cfg.exact},
        "sampling": sampling(result),
        "compute_basis": result.compute_basis,
        "assumptions": result.assumptions,
        "buckets": [{"index": b.index, "elements": b.numel, "layers": len(b.layers), "ready_s": b.ready_s}
                    for b in result.ctx.buckets],
        "recommendation": result.recommendation.to_dict(),
        "dense": result.dense.to_dict(),
        "candidates": [{**c.to_dict(), "usable": usable(c)} for c in result.candidates],
        "policy": result.policy.to_dict() if result.policy else None,
        "pareto": result.pareto.to_dict(),
        "crossover": result.crossover.to_dict(),
        "speedup_errors": result.speedup_errors,
        "timings_s": result.timings,
        "kernel_check": result.kernel_check.to_dict() if result.kernel_check else None,
        # --sharding: the answer the report leads with (the strategies' ★ row); "recommendation" stays DDP's own
        "strategy_recommendation": _strategy_recommendation(result),
    }


def _strategy_recommendation(result: RunResult) -> dict[str, Any] | None:
    from arcsim.run.strategies import strategy_recommendation

    return strategy_recommendation(result.strategies) if result.strategies else None


CSV_FIELDS = ("compressor", "collective", "hierarchy", "op", "density", "memory", "iteration_s", "compute_s",
              "effects_s", "compress_s", "comm_s", "exposed_comm_s", "speedup_vs_dense", "speedup_low", "speedup_high",
              "verdict", "speedup_vs_dense_ring", "rel_error",
              "update_error", "compression_gain", "density_achieved", "bytes_per_rank")


def write_csv(result: RunResult, path: Path) -> None:
    """One row per evaluated (compressor, collective, density), marking the front and the chosen point."""
    def key(c: Candidate | ParetoPoint) -> tuple:
        return c.compressor, c.collective, c.hierarchy, c.density

    front = {key(p) for p in result.pareto.points}
    chosen = result.pareto.chosen
    rows: dict[tuple, Candidate | ParetoPoint] = {key(c): c for c in result.candidates}
    for p in result.pareto.evaluated:
        rows.setdefault(key(p), p)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*CSV_FIELDS, "at_density", "on_front", "chosen"])
    writer.writeheader()
    at = {key(c) for c in result.candidates}
    for k, row in rows.items():
        data = row.to_dict()
        writer.writerow({**{f: data.get(f, "") for f in CSV_FIELDS}, "at_density": k in at,
                         "on_front": k in front, "chosen": k == key(chosen)})
    write_atomic(path, buf.getvalue())


def sampling(result: RunResult) -> dict[str, Any] | None:
    """The bucket sample the run's measurements at --density were taken on (arcsim.run.sampling), with the
    fraction of buckets and of elements it holds; or the layer sample (arcsim.run.layer_sample: ``layers``, its
    stride, groups and ``elements_fraction``), with the bucket sample of those measured whole, if any, as
    ``buckets``; None: every element measured."""
    measured = [c.measurement for c in result.candidates if c.measurement is not None]
    sample = next((m.sample for m in measured if m.sample is not None), None)
    chosen = None
    if sample is not None:
        buckets = result.ctx.buckets
        got = sum(buckets[i].numel for i in sample["measured"])
        chosen = {**sample, "buckets_fraction": len(sample["measured"]) / len(buckets),
                  "elements_fraction": got / sum(b.numel for b in buckets)}
    layers = next((m.layer_sample for m in measured if m.layer_sample is not None), None)
    if layers is None:
        return chosen
    return {"layers": layers, "elements_fraction": layers["sampled_fraction"],
            **({"buckets": chosen} if chosen is not None else {})}


def render(result: RunResult, console: Console, every_collective: bool = False) -> None:
    t, topo = result.ctx.trace_file, result.ctx.topo
    source = "a synthetic sample" if "sample_of" in t.meta else t.label
    console.print(f"[bold]arcsim run[/]: {t.meta['model']} ({int(t.meta['params']):,} parameters, {source}, "
                  f"{t.workers} workers × {t.steps} steps) on {topo.name} ({topo.ranks} ranks, {topo.library}), "
                  f"density {result.config.density:g}, {result.config.engine} engine")
    _render_recommendation(result, console)
    for note in result.assumptions:
        console.print(f"  [dim]• {note}[/]")
    rows = result.candidates if every_collective else best_per_compressor(result)
    rows = sorted(rows, key=lambda c: (not usable(c), c.iteration_s))  # the unusable last, however fast
    table = _iteration_table(result, rows, every_collective)
    if console.measure(table, options=console.options.update_width(10**4)).maximum > console.width:  # too wide:
        table = _iteration_table(result, rows, every_collective, stacked=True)  # each interval under its speed-up
    console.print(table)
    _render_too_close([c for c in rows if usable(c)], console)
    if result.policy:
        _render_policy(result, console)
    _render_crossover(result, console)
    _render_hierarchy(result, console)
    _render_pareto(result, console)
    _render_kernel_check(result, console)
    _render_timings(result, console)


def _render_kernel_check(result: RunResult, console: Console) -> None:
    """Compression timed on a GPU beside the kernel model's price (arcsim.run.kernel_check)."""
    check = result.kernel_check
    if check is None:
        return
    if not check.rows:
        console.print(f"[yellow]No kernel check[/] for compression timed on {check.device}: {check.why}")
        return
    table = Table(title=f"Compression timed on {check.device} beside the kernel model ({check.model})",
                  title_justify="left")
    for column in ("compressor", "density", "memory", "measured ms", "model ms", "model ÷ measured"):
        table.add_column(column, justify="left" if column in ("compressor", "memory") else "right")
    for r in check.rows:
        table.add_row(r.compressor, "-" if r.density is None else f"{r.density:g}", r.memory,
                      _ms(r.measured_s), _ms(r.modelled_s), f"{r.ratio:.2f}")
    console.print(table)


def _iteration_table(result: RunResult, rows: list[Candidate], every_collective: bool, stacked: bool = False
                     ) -> Table:
    """The candidates' table, each speed-up's interval beside it or (``stacked``) under it."""
    t, d = result.ctx.trace_file, result.dense
    table = Table(title="Iteration time per compressor" + ("" if every_collective else " (its fastest collective)"),
                  caption=f"ms per iteration, {_compute_text(d)}; speed-up against dense fp32 on "
                          f"its fastest collective (dense (baseline), {d.op} {d.collective}), with its {LEVEL} "
                          "interval from the model's held-out errors (one spanning 1: too close to call); AR "
                          "all-reduce, AG all-gather; error = ‖agg − ū‖²/‖ū‖² after error feedback"
                          + (f" (± its 95 % interval over the trace's {t.steps} steps"
                             + (", and over the bucket sample" if sampling(result) else "") + ")"
                             if t.steps > 1 or sampling(result) else "")
                          + f"; gain = ‖C(u)‖/‖u‖; ✗ {UNUSABLE_NOTE}",
                  box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    names = max(len(c.compressor) for c in rows) if rows else 0
    for col in ("compressor", "collective", "ms/iter", "compress", "comm", "exposed", "speed-up", "error", "gain",
                "B/rank"):
        left = col in ("compressor", "collective")  # never cut: the other columns give way first
        table.add_column(col, justify="left" if left else "right", no_wrap=left, overflow="fold",
                         min_width={"compressor": max(names, 10), "collective": 8}.get(col))
    rows = [c for c in rows if not (c.compressor == "dense" and c.collective == d.collective)]
    table.add_row("dense", short_collective(d.op, d.collective), _ms(d.iteration_s), _ms(d.compress_s),
                  _ms(d.comm_s), _ms(d.exposed_comm_s), "1.00×", "0", "1", format_size(d.bytes_per_rank), style="dim")
    for c in rows:
        table.add_row(c.compressor, short_collective(c.op, c.collective, c.hierarchy), _ms(c.iteration_s),
                      _ms(c.compress_s), _ms(c.comm_s), _ms(c.exposed_comm_s),
                      speedup_text(c.speedup_vs_dense, c.speedup_low, c.speedup_high, stacked), _error(c),
                      f"{c.compression_gain:.3f}", format_size(c.bytes_per_rank))
    return table


def _compute_text(dense: Candidate) -> str:
    """One rank's compute, the same in every row, and apart from it what the cluster's effects add (dense's)."""
    text = f"compute {_ms(dense.compute_s)} ms in each"
    if dense.effects_s > 1e-9:
        text += f" + {_ms(dense.effects_s)} ms the cluster's effects (stragglers, interference; dense's)"
    return text


def _error(c: Candidate) -> str:
    """The error, with its interval's half-width when the trace's steps give one; ✗ when unusable."""
    mark = "" if usable(c) else " ✗"
    if c.rel_error_ci is None:
        return f"{c.rel_error:.3f}{mark}"
    return f"{c.rel_error:.3f}±{(c.rel_error_ci[1] - c.rel_error_ci[0]) / 2:.3f}{mark}"


def _render_recommendation(result: RunResult, console: Console) -> None:
    """The one answer, first: what to deploy, what it gives, and why the other "winners" lost; with --sharding, the
    strategies' recommended row (picked by --policy's rule where it ranks strategies) and the rule, DDP's own choice
    under it."""
    best = next((row for row in result.strategies if row.recommended), None)
    if best is not None and not best.ddp_choice:  # the strategies' answer (the JSON's strategy_recommendation)
        soon = "" if best.time_to_target_s is None else f", ~{best.time_to_target_s:.3g} s to the target"
        console.print(f"[bold green]Recommended:[/] [bold]{best.headline()}[/]: {_ms(best.iteration_s)} ms per "
                      f"iteration, error {best.rel_error:.3g}{soon}, {best.memory.total_bytes / 1e9:.3g} GB per GPU "
                      "(the strategies' table below; docs/sharding.md)")
        console.print(f"  picked by {best.picked_by}")
        console.print("  [dim]without sharding, DDP's choice:[/]" if best.strategy != "none" else
                      f"  [dim]DDP's choice of compressor by --policy {result.config.policy}, which the strategies' "
                      "rule ranks lower:[/]")
    elif best is None and result.strategies:
        console.print("[bold yellow]No row of the strategies' table fits the GPU's memory[/] (below); DDP's choice "
                      "as if memory were no limit:")
    r = result.recommendation
    ratio = "no ratio (it compresses nothing away)" if r.density is None else f"density {r.density:g}"
    where = "" if r.hierarchy == "flat" else " between nodes (dense inside each node)"
    what = (f"[bold]per-bucket mix[/] — {_mix_text(result)}" if r.is_mix else
            f"[bold]{r.compressor}[/] over {OP_NAME.get(r.op, r.op)} ({r.collective}){where}, {ratio}")
    soon = f", ~{r.time_to_target_s:.3g} s to the target" if r.is_mix and r.time_to_target_s is not None else ""
    console.print(f"[bold green]Recommended:[/] {what}: {_ms(r.iteration_s)} ms per iteration, "
                  f"{_verdict(r.speedup_vs_dense, r.speedup_low, r.speedup_high, r.verdict)}, error {r.rel_error:.3f}"
                  f"{soon}")
    if r.verdict == TOO_CLOSE:
        console.print("  [yellow]what would make it clear:[/] "
                      + ("; ".join(t["text"] for t in r.tips or []) or NOTHING_CLEARS))
    for reason in r.why:
        console.print(f"  why: {reason}")
    if best is not None and best.ddp_choice:  # DDP's choice is also the strategies' ★: by which rule
        console.print(f"  and the strategies' table's choice too, picked by {best.picked_by}")
    if r.is_mix and r.plan is not None:
        console.print("  deploy: --write-plan plan.json, then in the job ddp.register_comm_hook("
                      "MixedState.load(\"plan.json\"), mixed_hook) (arcsim.hooks; docs/ddp-hooks.md)")


def _mix_text(result: RunResult) -> str:
    """``buckets 0–3 topk@0.01 allgather, 4–9 fp16 allreduce``: the mix, runs of buckets that share a setting."""
    plan = result.recommendation.plan
    if plan is not None:
        return BucketPlan.from_dict(plan).summary()
    pol = result.policy
    assert pol is not None
    return ", ".join(sorted({f"{c.compressor}{'' if c.density is None else f'@{c.density:g}'} {c.op}"
                             for c in pol.choices}))


NOTHING_CLEARS = "no bandwidth (1/100 to 100×), ratio of the grid or batch tried makes it clear"


def _verdict(speedup: float, low: float | None, high: float | None, verdict: str | None) -> str:
    """``1.42× dense (1.21–1.66: faster)``; the baseline's ``1.00× dense``."""
    if low is None or high is None or low == high:
        return f"{speedup:.2f}× dense"
    return f"{speedup:.2f}× dense ({low:.2f}–{high:.2f}: {verdict})"


def _render_too_close(rows: list[Candidate], console: Console) -> None:
    """The usable rows too close to call, each with the settings that would make it clear."""
    for c in rows:
        if c.verdict == TOO_CLOSE:
            tips = "; ".join(f"clearly {t['verdict']} at {setting_text(t['axis'], t['side'], t['value'])}"
                             for t in c.tips)
            which = f"{c.compressor} {short_collective(c.op, c.collective, c.hierarchy)}"
            console.print(f"  [dim]too close to call, {which}: {tips or NOTHING_CLEARS}[/]")


def render_fusion(rows: list[dict[str, Any]], console: Console) -> None:
    """What fusing the whole model into one vector changes, compressor by compressor."""
    table = Table(title="Fusion: DDP buckets against the whole model as one vector (--fusion both)",
                  caption="ms per iteration with each compressor's fastest collective; the fused vector is sent "
                          "after backward (no overlap) but pays each collective's latency once",
                  box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    for col in ("compressor", "buckets", "bucket ms", "exposed", "model ms", "exposed ", "model/bucket", "error b/m"):
        table.add_column(col, justify="left" if col == "compressor" else "right")
    for r in sorted(rows, key=lambda r: r["bucket_iteration_s"]):
        table.add_row(r["compressor"], str(r["buckets"]), _ms(r["bucket_iteration_s"]), _ms(r["bucket_exposed_comm_s"]),
                      _ms(r["model_iteration_s"]), _ms(r["model_exposed_comm_s"]),
                      f"{r['model_iteration_s'] / r['bucket_iteration_s']:.2f}×",
                      f"{r['bucket_rel_error']:.3f}/{r['model_rel_error']:.3f}")
    console.print(table)


OP_NAME = {"allreduce": "all-reduce", "allgather": "all-gather"}
OP_SHORT = {"allreduce": "AR", "allgather": "AG", "broadcast": "BC", "reducescatter": "RS"}


def short_collective(op: str, algo: str, hierarchy: str = "flat") -> str:
    """``AR rhd``, ``AG hier.``, ``AG ring, node``: a collective in a narrow column (node: node-aware, the
    collective the one between nodes)."""
    return f"{OP_SHORT.get(op, op)} {'hier.' if algo == 'hierarchical' else algo}" + \
        ("" if hierarchy == "flat" else f", {hierarchy}")


def way(compressor: str, collective: str, hierarchy: str = "flat") -> str:
    """``topk/ring``, ``topk/ring/node``: a candidate in a sentence."""
    return f"{compressor}/{collective}" + ("" if hierarchy == "flat" else f"/{hierarchy}")


def _render_timings(result: RunResult, console: Console) -> None:
    measuring = {k.removeprefix("measure "): v for k, v in result.timings.items() if k.startswith("measure ")}
    rest = result.timings.get("pricing, policy, front and crossover", 0.0)
    slowest = sorted(measuring.items(), key=lambda kv: -kv[1])[:3]
    wall = result.timings.get(MEASURING_WALL, sum(measuring.values()))
    ahead = int(result.timings.get(MEASURED_AHEAD, 0))
    side = (f"{ahead} side by side on {int(result.timings[MEASURED_AHEAD_PROCESSES])} processes, "
            f"{sum(measuring.values()):.1f} s of work; " if ahead else "")
    console.print(f"[dim]analysis took {wall + rest:.1f} s: running compressors on the gradients "
                  f"{wall:.1f} s ({len(measuring)} runs; {side}slowest "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in slowest) + f"), pricing and the rest {rest:.1f} s[/]")


def _render_policy(result: RunResult, console: Console) -> None:
    pol = result.policy
    assert pol is not None
    head = (f"Switching policy ({pol.name}): {_ms(pol.iteration_s)} ms per iteration, "
            f"{result.dense.iteration_s / pol.iteration_s:.2f}× dense, error {pol.rel_error:.3f}")
    if pol.time_to_target_s is not None and pol.time_to_target_interval_s is not None:
        lo, hi = pol.time_to_target_interval_s
        head += f", ~{pol.time_to_target_s:.3g} s to the target [{lo:.3g}, {hi:.3g}]"
    if pol.name == "auto":
        _render_estimates(pol, head, console)
        return
    table = Table(title=head, caption=pol.rule)
    for col in ("bucket", "elements", "choice", "time ms", "runners-up (ms)"):
        table.add_column(col, justify="left" if col in ("choice", "runners-up (ms)") else "right")
    for ch in pol.choices[:16]:
        runners = ", ".join(f"{way(r['compressor'], r['collective'], r['hierarchy'])} {_ms(r['time_s'])}"
                            for r in ch.runners_up)
        if ch.pareto is not None:
            runners = f"Pareto set of {len(ch.pareto)}: " + ", ".join(
                f"{p['compressor']}@{p['density']:g} {_ms(p['time_s'])} gain {p['gain']:.2f}" for p in ch.pareto[:4])
        where = "" if ch.hierarchy == "flat" else f", {ch.hierarchy}"
        ratio = "" if ch.density is None or pol.name == "gate" else f"@{ch.density:g}"
        table.add_row(str(ch.bucket), f"{ch.elements:,}", f"{ch.compressor}{ratio} ({ch.op} {ch.collective}{where})",
                      _ms(ch.time_s), runners)
    if len(pol.choices) > 16:
        table.add_row("…", f"{len(pol.choices) - 16} more", "", "", "")
    console.print(table)
    if pol.name != "gate":
        return
    if pol.unsettled and sampling(result):
        console.print(f"  [yellow]not settled by the trace's steps and the bucket sample:[/] the error limit "
                      f"{pol.error_limit:.3f} lies inside the 95 % interval of {', '.join(pol.unsettled)}: a "
                      "longer trace, or --exact, could change which candidates qualify")
    elif pol.unsettled:
        console.print(f"  [yellow]not settled by the trace's steps:[/] the error limit {pol.error_limit:.3f} lies "
                      f"inside the 95 % interval of {', '.join(pol.unsettled)}: a longer trace could change "
                      "which candidates qualify")
    elif any(c.rel_error_ci is not None for c in result.candidates):
        console.print("  [dim]every candidate's error interval lies clearly on one side of the limit: the trace's "
                      "steps settle which qualify[/]")


def _render_estimates(pol: Policy, head: str, console: Console) -> None:
    """auto: the soonest candidates to the target, and why the faster-per-step ones lost."""
    table = Table(title=head, caption=pol.rule, box=box.SIMPLE_HEAD)
    for col in ("candidate", "ms/step", "error", "steps ×", "to target (s)", "95 % interval"):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    rows = pol.estimates or []
    shown = [r for r in rows if r["excluded"] is None][:8]
    for r in shown:
        ratio = "" if r["density"] is None else f"@{r['density']:g}"
        lo, hi = r["time_to_target_interval_s"]
        table.add_row(f"{way(r['compressor'], r['collective'], r['hierarchy'])}{ratio}", _ms(r["iteration_s"]),
                      f"{r['rel_error']:.3f}", f"{r['steps_factor']:.2f}", f"{r['time_to_target_s']:.3g}",
                      f"{lo:.3g}–{hi:.3g}")
    console.print(table)
    picked = {(c.compressor, c.collective, c.hierarchy, c.density) for c in pol.choices}
    which = ", ".join(f"{way(c, k, h)}{'' if d is None else f'@{d:g}'}" for c, k, h, d in sorted(
        picked, key=lambda t: (t[0], t[1], t[2], t[3] or 0)))
    console.print(f"  chosen ({'one compressor for the job' if pol.deploy == 'single' else 'a per-bucket mix'}): "
                  f"{which}")
    for line in pol.why or []:
        console.print(f"  why not: {line}")
    if pol.unsettled:
        console.print(f"  [yellow]not told apart by the steps model[/] (95 % intervals overlap the pick's, within "
                      f"25 %): {', '.join(pol.unsettled)}")


def _render_hierarchy(result: RunResult, console: Console) -> None:
    cx = result.crossover
    if not cx.hierarchy or cx.nic_gbps is None:
        return
    nic_gbps = cx.nic_gbps
    here = min(cx.hierarchy, key=lambda r: abs(r["nic_gbps"] - nic_gbps))
    faster = "node-aware" if here["node_s"] < here["flat_s"] else "flat"
    console.print(f"[bold]Flat / node-aware crossover[/] at density {cx.density:g}: on this cluster ({nic_gbps:g} "
                  f"Gb/s per NIC) {faster} compression is faster (node-aware {here['node_best']} "
                  f"{_ms(here['node_s'])} ms vs flat {here['flat_best']} {_ms(here['flat_s'])} ms).")
    lo, hi = cx.hierarchy[0]["nic_gbps"], cx.hierarchy[-1]["nic_gbps"]
    for f in cx.hierarchy_flips_gbps or []:
        console.print(f"  bandwidth: {'node-aware' if f['below'] == 'node' else 'flat'} wins below "
                      f"{f['nic_gbps']:.3g} Gb/s per NIC, {'node-aware' if f['above'] == 'node' else 'flat'} above")
    if not cx.hierarchy_flips_gbps:
        console.print(f"  bandwidth: no flip between {lo:.3g} and {hi:.3g} Gb/s per NIC")
    rows = cx.hierarchy_by_gpus or []
    for f in cx.hierarchy_flips_gpus or []:
        console.print(f"  GPUs per node (same {result.ctx.topo.ranks} ranks): "
                      f"{'node-aware' if f['below'] == 'node' else 'flat'} wins below {f['gpus_per_node']:.3g}, "
                      f"{'node-aware' if f['above'] == 'node' else 'flat'} above")
    if rows and not cx.hierarchy_flips_gpus:
        faster = "node-aware" if rows[0]["node_s"] < rows[0]["flat_s"] else "flat"
        console.print(f"  GPUs per node (same {result.ctx.topo.ranks} ranks): {faster} at every count from "
                      f"{rows[0]['gpus_per_node']} to {rows[-1]['gpus_per_node']}")


def _render_crossover(result: RunResult, console: Console) -> None:
    cx = result.crossover
    if cx.bandwidth is None or cx.nic_gbps is None or cx.density is None:
        console.print(f"[yellow]AG/AR crossover:[/] {cx.note}")
        _render_ratio_flips(cx, console)
        return
    rows = cx.bandwidth
    nic_gbps = cx.nic_gbps
    here = min(rows, key=lambda r: abs(r["nic_gbps"] - nic_gbps))
    faster = "all-reduce" if here["allreduce_s"] < here["allgather_s"] else "all-gather"
    console.print(f"[bold]AG/AR crossover[/] at density {cx.density:g}: on this cluster ({nic_gbps:g} Gb/s "
                  f"per NIC) {faster} top-k is faster ({here['allreduce_best']} {_ms(here['allreduce_s'])} ms vs "
                  f"{here['allgather_best']} {_ms(here['allgather_s'])} ms).")
    lo, hi = rows[0]["nic_gbps"], rows[-1]["nic_gbps"]
    if cx.bandwidth_flips_gbps:
        for f in cx.bandwidth_flips_gbps:
            console.print(f"  bandwidth: {f['below']} wins below {f['nic_gbps']:.3g} Gb/s per NIC, "
                          f"{f['above']} above")
    else:
        console.print(f"  bandwidth: no flip between {lo:.3g} and {hi:.3g} Gb/s per NIC")
    _render_ratio_flips(cx, console)


def _render_ratio_flips(cx: Crossover, console: Console) -> None:
    for f in cx.ratio_flips or []:
        console.print(f"  ratio: {f['below']} wins below density {f['density']:.3g}, {f['above']} above")
    if cx.ratio and not cx.ratio_flips:
        console.print(f"  ratio: no flip over densities {cx.ratio[0]['density']:g} … {cx.ratio[-1]['density']:g}")


def _render_pareto(result: RunResult, console: Console) -> None:
    par = result.pareto
    chosen, rec = par.chosen, result.recommendation
    same = (chosen.compressor, chosen.collective, chosen.hierarchy, chosen.density) == \
        (rec.compressor, rec.collective, rec.hierarchy, rec.density)
    whose = "the recommendation" if same or result.policy is None else \
        f"the front's pick (the recommendation above is --policy {result.policy.name}'s)"
    table = Table(title=f"Pareto front: iteration time vs error over {len(par.evaluated)} evaluated "
                        f"(compressor, collective, ratio) points",
                  caption=f"★ {whose}, chosen by {par.rule}; ✗ error ≥ {UNUSABLE_ERROR:g}, unusable")
    for col in ("", "compressor", "collective", "density", "iteration ms", "speed-up", "error", "gain"):
        table.add_column(col, justify="left" if col in ("", "compressor", "collective") else "right")
    for p in par.points:
        mark = "★" if p == chosen else "" if usable(p) else "✗"
        table.add_row(mark, p.compressor, p.collective + ("" if p.hierarchy == "flat" else f", {p.hierarchy}"),
                      "-" if p.density is None else f"{p.density:g}",
                      _ms(p.iteration_s), f"{p.speedup_vs_dense:.2f}×", f"{p.rel_error:.3f}",
                      f"{p.compression_gain:.3f}", style="bold" if mark else None)
    console.print(table)
