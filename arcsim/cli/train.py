"""`arcsim train`: time-to-accuracy of each compressor from real data-parallel training."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from arcsim.catalog import COMPRESSORS, FUSIONS, MEMORIES, MODELS, check_compression, model_ref_problem
from arcsim.cli.common import (
    DENSITY,
    INPUT_SIZE,
    Count,
    ListOf,
    Number,
    console,
    json_option,
    library_option,
    model_arg_options,
    note,
    optimizer_options,
    optimizer_settings,
    scope_option,
    step_progress,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath, Reads
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic

if TYPE_CHECKING:
    from arcsim.run.target import Target


TRAIN_WRITES = ("*.csv", "*.json", "*.jsonl", "*.png", "checkpoints/*")  # what a training folder holds


@click.command("train")
@click.option("--model", default="cnn", show_default=True,
              help=f"One of {', '.join(MODELS)}, or your own: file.py:build, package.module:build, hf:CONFIG.json.")
@model_arg_options
@click.option("--dataset", default=None, help="A dataset with a held-out split: digits, mnist1d or python-text "
                                              "(default: the model's own).")
@click.option("--workers", "-w", default="8", show_default=True, type=Count(minimum=2, maximum=1024),
              help="Simulated data-parallel workers.")
@click.option("--compressors", "-c", default="dense,topk,arctopk,star,randk", show_default=True,
              help=f"Comma-separated, from {', '.join(COMPRESSORS)}.")
@click.option("--density", "-d", default=0.1, show_default=True, type=DENSITY, help="k/d for every sparsifier.")
@click.option("--memory", "-m", default="ef14", show_default=True, help=f"Error feedback: {', '.join(MEMORIES)}.")
@click.option("--steps", default="300", show_default=True, type=Count())
@click.option("--batch", "-b", default="16", show_default=True, type=Count(), help="Batch per worker.")
@click.option("--input-size", type=INPUT_SIZE, default=None,
              help="Image side or sequence length (default: the dataset's; python-text: 256).")
@optimizer_options
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="bf16 runs forward and loss under autocast (gradients stay fp32).")
@click.option("--eval-every", default="10", show_default=True, type=Count(), help="Held-out accuracy every N steps.")
@click.option("--seeds", default="0", show_default=True, type=ListOf(Count(minimum=0), unique=True, example="0,1,2"),
              help="Seeds, comma-separated (≥ 3 to judge noise).")
@click.option("--topology", "-t", default=None, type=Reads("topology"),
              help="Price every step on this topology (wall-clock axis).")
@click.option("--engine", default="analytic", show_default=True, type=click.Choice(["analytic", "des"]))
@click.option("--hierarchy", default="flat", show_default=True,
              help="flat, or node: dense inside each node of --topology, compressed between nodes (the workers "
                   "grouped into nodes as arcsim run groups them); with --network-schedule also both: the policies "
                   "choose flat or node-aware as they choose compressor and ratio.")
@click.option("--gpu", default=None, help="Price steps on this GPU instead of the topology's (cpu: as measured here).")
@library_option
@click.option("--fusion", type=click.Choice(FUSIONS), default="bucket", show_default=True,
              help="bucket: DDP buckets; model: the whole gradient compressed as one vector (as arcsim run).")
@click.option("--compute-profile", type=InputPath(), default=None,
              help="Compute timings for pricing (default: the topology's GPU, else measured here on the CPU).")
@click.option("--target", default=None, type=Number(above=0, maximum=1), help="Held-out accuracy to reach, e.g. 0.95.")
@click.option("--target-loss", default=None, type=Number(above=0),
              help="Held-out loss to get under instead (cross-entropy in nats; perplexity is its exponential), "
                   "e.g. 6.5 for a language model.")
@click.option("--out", "-o", default=None, type=OutputPath(directory=True, writes=TRAIN_WRITES),
              help="Results directory (default reports/train/<model>-<dataset>-d<density>); an existing one resumes.")
@click.option("--network-schedule", "schedule", type=InputPath(), default=None,
              help="Inter-node latency and bandwidth that change at given steps (examples/schedule-c1.yaml); each "
                   "step is priced on the network in force, and --policy picks what is sent.")
@click.option("--policy", "policies", default=None,
              help="With --network-schedule, comma-separated (default all): static (one choice), adaptive "
                   "(re-decides as the network and the progress change), bound (the best switching sequence of "
                   "the static choices over the phases, from their runs; needs a target).")
@click.option("--objective", type=click.Choice(["time-to-target", "asf"]), default="time-to-target",
              show_default=True,
              help="With --network-schedule: what adaptive minimises — the estimated time to the target on the "
                   "networks to come, or the per-step trade-off of step time against gain (asf).")
@click.option("--candidates", default=None,
              help="With --network-schedule: the compressors the policies choose among (default topk,arctopk,"
                   "adaptive).")
@click.option("--ratios", default=None, type=ListOf(DENSITY, unique=True, example="0.1,0.01"),
              help="With --network-schedule: the compression ratios they choose among (default the paper's "
                   "0.1,0.033,0.011,0.004,0.001).")
@click.option("--warmup", default=None, type=Count(minimum=0),
              help="With --network-schedule: warm-up steps, Top-K from ratio 1.0 to 0.1 (default: 10 % of --steps).")
@click.option("--stop-at-target", is_flag=True,
              help="With --network-schedule and a target: end each run when it first reaches the target.")
@json_option
@scope_option
def train(model: str, model_args: tuple[str, ...], data: str | None, dataset: str | None, workers: int,
          compressors: str, density: float, memory: str, steps: int, batch: int, input_size: int | None,
          eval_every: int,
          seeds: tuple[int, ...], topology: str | None, engine: str, hierarchy: str, gpu: str | None,
          library: str | None,
          fusion: str, compute_profile: str | None, target: float | None, target_loss: float | None,
          out: str | None, json_out: str | None, scope: str, precision: str, schedule: str | None = None,
          policies: str | None = None, candidates: str | None = None, ratios: tuple[float, ...] | None = None,
          warmup: int | None = None, stop_at_target: bool = False, objective: str = "time-to-target",
          **optimizer: Any) -> None:
    """Train W workers in one process through each compressor; accuracy against steps and predicted time."""
    problem = model_ref_problem(model, bool(model_args))  # these answered before torch loads
    if problem:
        raise ArcsimError(problem)
    check_compression(tuple(c.strip() for c in compressors.split(",") if c.strip()), memory, ArcsimError)
    for flag, named in (("--gpu", gpu), ("--library", library)):
        if named and not topology and schedule is None:  # (a schedule prices on its own default topology)
            raise ArcsimError(f"{flag} prices the steps on a cluster: give --topology too")
    from arcsim.devices.catalog import device, priced_gpu
    from arcsim.topology import load_topology

    topo = load_topology(topology) if topology else None  # a bad name fails before any training
    if topo is not None and gpu:
        device(gpu)
    from arcsim.models.source import model_source
    from arcsim.run.target import target_of
    from arcsim.train.experiment import run_experiment
    from arcsim.train.loop import TrainConfig
    from arcsim.train.outcome import claims, summarise

    goal = target_of(target, target_loss)
    source = model_source(model, model_args)
    source.check()
    if data is not None:
        raise ArcsimError("arcsim train measures held-out accuracy and loss on a built-in dataset's test split; "
                          "drop --data and give --dataset digits, mnist1d or python-text")
    dataset = source.dataset_for(dataset, None)
    settings = optimizer_settings(optimizer)
    per_run = hierarchy if schedule is None else "flat"  # under a schedule the policies choose it, step by step
    gpus_per_node = 0
    if per_run != "flat" and topo is not None:
        gpus_per_node = topo.gpus_per_node
    cfg = TrainConfig(model=model, model_args=model_args, dataset=dataset or "", workers=workers,
                      compressors=tuple(c.strip() for c in compressors.split(",") if c.strip()), density=density,
                      memory=memory, steps=steps, batch=batch, eval_every=eval_every,
                      seeds=seeds, compute_profile=compute_profile, scope=scope, fusion=fusion, precision=precision,
                      hierarchy=per_run, gpus_per_node=gpus_per_node, input_size=input_size, **settings)
    cfg.check()
    grouping = cfg.grouping()
    if grouping is not None:
        note(f"node-aware ({grouping.label()}): the {workers} workers as nodes, dense inside each, compressed "
             f"between them; priced on nodes of {gpus_per_node}")
    if schedule is not None:
        from arcsim.cli.train_schedule import train_under_schedule

        train_under_schedule(cfg, schedule, topology, engine, gpu, library, goal, out, json_out,
                             policies, candidates, ratios, warmup, stop_at_target, objective, hierarchy)
        return
    for flag, value in (("--policy", policies), ("--warmup", warmup), ("--candidates", candidates),
                        ("--ratios", ratios), ("--stop-at-target", stop_at_target or None),
                        ("--objective", None if objective == "time-to-target" else objective)):
        if value is not None:
            raise ArcsimError(f"{flag} goes with --network-schedule FILE (a network that changes during training)")
    if memory == "ef21m":
        note("EF21M carries its own momentum: SGD's momentum is off (the step is x ← x − γ·h̄)")
    if topo is not None:
        priced_on = priced_gpu(device(gpu).name if gpu else None, topo.gpu)
        if priced_on and priced_on != "cpu" and not compute_profile:
            note(f"each step is priced on {priced_on}: compute by the device model for {source.label} at batch "
                 f"{batch}, "
                 f"compression by the kernel model (arcsim device show {priced_on})")
    directory = Path(out or f"reports/train/{source.label.replace(':', '-')}-{dataset}-d{density:g}")
    started = time.perf_counter()
    with step_progress("training", unit="step") as progress:
        history = run_experiment(cfg, directory, topology, engine, announce=note, progress=progress, gpu=gpu,
                                 library=library)
    took = time.perf_counter() - started
    summary = summarise(history, goal)
    write_atomic(directory / "summary.csv", summary.to_csv(index=False))
    if goal is not None:  # what `arcsim run --history` times the candidates to
        write_atomic(directory / "target.json", json.dumps(goal.key()))
    else:
        (directory / "target.json").unlink(missing_ok=True)
    if tables_wanted(json_out):
        _table(summary, goal, topology)
        for line in claims(summary, goal):
            console.print(f"  {line}")
    what = (f"{source.label} on {dataset}, {workers} workers, density {density:g}, {memory}"
            + ("" if grouping is None else f", node-aware ({grouping.label()})"))
    metric = goal.metric if goal is not None else "accuracy"
    from arcsim.train.plots import accuracy_plot  # matplotlib (0.4 s) only once there is something to draw

    written = [accuracy_plot(history, "step", directory / f"{metric}_vs_step.png", f"Held-out {metric} — {what}",
                             goal)]
    if topology:
        written.append(accuracy_plot(history, "time_s", directory / f"{metric}_vs_time.png",
                                     f"Held-out {metric} against predicted wall-clock on {topology} — {what}", goal))
    note(f"{len(cfg.compressors) * len(cfg.seeds)} runs in {took:.1f} s; wrote {directory / 'history.csv'}, "
         f"summary.csv and {', '.join(p.name for p in written)}")
    from arcsim.cli.sweep import records

    write_json({"directory": str(directory), "target": target, "target_loss": target_loss, "topology": topology,
                "summary": records(summary), "claims": claims(summary, goal), "charts": [str(p) for p in written]},
               json_out)


def _table(summary, target: Target | None, topology: str | None) -> None:
    seeds = int(summary["seeds"].max())
    title = f"Time to {target.label}" if target is not None else "Final held-out accuracy"
    table = Table(title=f"{title}, {seeds} seed{'s' if seeds != 1 else ''} (mean ± sd"
                        + ("; steps: mean over the runs that reached it)" if target is not None else ")"))
    by_loss = target is not None and target.metric == "loss"
    cols = ["compressor", "final acc"] + (["final loss"] if by_loss else [])
    if topology:
        cols += ["collective", "ms/step"]
    if target is not None:
        cols += ["reached", "steps"] + (["time to target", "vs topk", "vs dense"] if topology else [])
    for c in cols:
        table.add_column(c, justify="left" if c in ("compressor", "collective") else "right", no_wrap=True)

    def num(v: float, fmt: str) -> str:
        return "not reached" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    for _, r in summary.iterrows():
        acc = f"{r['final_acc_mean']:.3f}" + (f"±{r['final_acc_std']:.3f}" if r["seeds"] > 1 else "")
        if r["diverged_runs"]:
            acc += f" ({r['diverged_runs']} div.)"
        row = [r["compressor"], acc] + ([f"{r['final_loss_mean']:.3f}"] if by_loss else [])
        if topology:
            row += [r["collective"], f"{r['step_s'] * 1e3:.3f}"]
        if target is not None:
            row += [r["reached"], num(r["steps_to_target"], ".0f")]
            if topology:
                t = r["time_to_target_s"]
                row += [num(t * 1e3 if not math.isnan(t) else t, ".1f") + (" ms" if not math.isnan(t) else ""),
                        *(f"{v:+.1%}" if not math.isnan(v) else "–" for v in (r.get("saving_vs_topk", math.nan),
                                                                              r.get("saving_vs_dense", math.nan)))]
        table.add_row(*row)
    console.print(table)
    if target is not None and topology:
        console.print("  vs topk / vs dense: relative saving in predicted time to target (positive: sooner)")
    sys.stdout.flush()
