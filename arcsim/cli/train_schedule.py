"""`arcsim train --network-schedule FILE`: static and adaptive policies under a changing network, and the bound."""

from __future__ import annotations

import math
import time
from pathlib import Path

from rich.table import Table

from arcsim.cli.common import console, note, step_progress, tables_wanted, write_json
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.run.target import Target
from arcsim.train.loop import TrainConfig

DEFAULT_SCHEDULE_TOPOLOGY = "8x1-eth10"  # one GPU per node: every collective crosses the changing network


def train_under_schedule(cfg: TrainConfig, schedule_path: str, topology: str | None, engine: str, gpu: str | None,
                         library: str | None, target: Target | None, out: str | None, json_out: str | None,
                         policies: str | None, candidates: str | None, ratios: tuple[float, ...] | None,
                         warmup: int | None, stop_at_target: bool = False,
                         objective: str = "time-to-target", hierarchy: str = "flat") -> None:
    from arcsim.network_schedule import load_schedule
    from arcsim.train.plots import schedule_plot
    from arcsim.train.policies import PAPER_RATIOS
    from arcsim.train.scheduled import (
        POLICIES,
        ScheduledConfig,
        ScheduledExperiment,
        decisions,
        headline,
        load_bounds,
        summarise,
    )

    schedule = load_schedule(schedule_path)
    scfg = ScheduledConfig(
        cfg, schedule, topology or DEFAULT_SCHEDULE_TOPOLOGY,
        policies=_names(policies, POLICIES), candidates=_names(candidates, ("topk", "arctopk", "adaptive")),
        ratios=ratios if ratios is not None else PAPER_RATIOS, target=target,
        warmup=warmup, engine=engine, gpu=gpu, library=library, stop_at_target=stop_at_target, objective=objective,
        hierarchy=hierarchy)
    scfg.check()
    if topology is None:
        note(f"priced on {DEFAULT_SCHEDULE_TOPOLOGY} (one GPU per node) with the schedule's networks; --topology "
             "to change")
    grouping = scfg.grouping()
    if grouping is not None:
        note(f"node-aware candidates ({grouping.label()}): the {cfg.workers} workers as nodes of "
             f"{grouping.priced_gpus} GPUs, dense inside each, compressed between them"
             + ("; the warm-up is flat" if hierarchy == "both" else ""))
    directory = Path(out or f"reports/train/{cfg.source.label.replace(':', '-')}-{cfg.dataset}-{schedule.name}")
    started = time.perf_counter()
    with step_progress("training", unit="step") as progress:
        experiment = ScheduledExperiment(scfg, directory, announce=note, progress=progress)
        history = experiment.run()
    took = time.perf_counter() - started
    bounds = load_bounds(directory)
    summary = summarise(history, target, bounds[bounds["seed"].isin(cfg.seeds)] if "bound" in scfg.policies else None)
    top = headline(summary, target)
    write_atomic(directory / "summary.csv", summary.to_csv(index=False))
    log = [d for d in decisions(directory) if d["seed"] in cfg.seeds]
    phases = [(p.start, p.label) for p in schedule.phases]
    chart = schedule_plot(history, top, phases, scfg.warmup_steps, directory / "accuracy_vs_time.png",
                          f"{cfg.source.label} on {cfg.dataset} under {schedule.name} ({scfg.topology}), "
                          f"{len(cfg.seeds)} seed{'s' if len(cfg.seeds) != 1 else ''}", target)
    if tables_wanted(json_out):
        _table(top, target, len(cfg.seeds))
        _decision_table(log, cfg.seeds[0])
    note(f"{len(experiment.runs())} runs in {took:.1f} s; wrote {directory / 'history.csv'}, summary.csv, "
         f"decisions.jsonl and {chart.name}")
    from arcsim.cli.sweep import records

    write_json({"directory": str(directory), "schedule": schedule.name, "topology": scfg.topology,
                "hierarchy": scfg.hierarchy,
                "phases": [p.to_dict() for p in schedule.phases], "warmup_steps": scfg.warmup_steps,
                **(target.key() if target else {"target": None}), "headline": records(top),
                "summary": records(summary), "decisions": log,
                "charts": [str(chart)]}, json_out)


def _names(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if text is None:
        return default
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ArcsimError(f"an empty list where names were expected; e.g. {','.join(default)}")
    return names


def _table(top, target: Target | None, seeds: int) -> None:
    title = (f"Time to {target.label} under the schedule" if target is not None
             else "Final held-out accuracy under the schedule")
    table = Table(title=f"{title}, {seeds} seed{'s' if seeds != 1 else ''} (mean ± sd over the seeds that reached it)")
    cols = ["policy", "choice", "final acc", "wall-clock s"]
    if target is not None:
        cols += ["reached", "steps", "time to target s", "vs best static"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("policy", "choice") else "right", no_wrap=True)
    for _, r in top.iterrows():
        row = [r["policy"], r["choice"] if r["policy"] == "static" else "",
               f"{r['final_acc_mean']:.3f}" + (f"±{r['final_acc_std']:.3f}" if r["seeds"] > 1 else ""),
               f"{r['total_time_s']:.2f}"]
        if target is not None:
            t = r["time_to_target_s"]
            row += [f"{int(r['reached'])}/{int(r['seeds'])}",
                    "–" if math.isnan(r["steps_to_target"]) else f"{r['steps_to_target']:.0f}",
                    "not reached" if math.isnan(t) else f"{t:.2f} ± {r['time_to_target_std']:.2f}",
                    "–" if math.isnan(r.get("vs_best_static", math.nan)) else f"{r['vs_best_static']:+.1%}"]
        table.add_row(*row)
    console.print(table)
    if target is not None:
        console.print("  best static: the one choice that reached the target in most seeds, soonest; vs best "
                      "static: relative saving in predicted time to target (positive: sooner)")


def _decision_table(log: list[dict], seed: int) -> None:
    from arcsim.run.report import short_collective

    mine = [d for d in log if d["seed"] == seed]
    if not mine:
        return
    table = Table(title=f"Adaptive decisions (seed {seed}): what it chose, and why")
    columns = ("step", "phase", "network", "reason", "chosen", "step ms", "descent", "est. steps", "est. s")
    for c in columns:
        table.add_column(c, justify="left" if c in ("network", "reason", "chosen") else "right")
    for d in mine:
        ch = d["chosen"]
        steps, seconds = ch.get("steps_to_target", math.nan), ch.get("time_to_target_s", math.nan)
        table.add_row(str(d["step"]), str(d["phase"] or "–"), d["network"], d["reason"],
                      f"{ch['compressor']}@{ch['density']:g} "
                      f"({short_collective(ch['op'], ch['collective'], ch.get('hierarchy', 'flat'))})",
                      f"{ch['time_s'] * 1e3:.1f}", f"{ch.get('descent', math.nan):.3f}",
                      "–" if not math.isfinite(steps) else f"{steps:.0f}",
                      "–" if not math.isfinite(seconds) else f"{seconds:.2f}")
    console.print(table)
