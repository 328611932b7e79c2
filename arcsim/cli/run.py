"""`arcsim run`: which compressor, collective and ratio train fastest for this trace on this cluster."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import click

from arcsim.catalog import (
    COMPRESSORS,
    DDP_BUCKET_MB,
    DEEPSPEED_BUFFER_MB,
    DEFAULT_RATIOS,
    FRAMEWORKS,
    FUSIONS,
    HOROVOD_FUSION_MB,
    LIVE_DEFAULTS,
    MAX_BUCKET_MB,
    MEASURE_DEVICES,
    MEMORIES,
    POLICIES,
    check_compression,
    options_for,
)
from arcsim.cli.common import (
    DENSITY,
    FORCE_TRAINING_HELP,
    TOPOLOGY_HELP,
    Count,
    ListOf,
    Number,
    compressor_option,
    console,
    given_options,
    input_size_option,
    json_option,
    library_option,
    model_arg_options,
    note,
    parse_compressor_options,
    progress_bar,
    scope_option,
    step_progress,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath, Reads
from arcsim.collectives.limits import allow_any
from arcsim.devices.catalog import PRECISIONS
from arcsim.errors import ArcsimError
from arcsim.netsim import ENGINES
from arcsim.topology import DEFAULT_TOPOLOGY
from arcsim.traces.estimates import NOTE_SECONDS, rough_duration
from arcsim.units import parse_duration, parse_params, parse_rate

if TYPE_CHECKING:  # torch stays unimported until a command needs it
    from arcsim.run.config import RunConfig
    from arcsim.traces.training import TrainingConfig


@click.command("run")
@click.option("--topology", "-t", default=DEFAULT_TOPOLOGY, show_default=True, type=Reads("topology"),
              help=TOPOLOGY_HELP)
@click.option("--trace", default=None, type=Reads("trace"),
              help="Gradient trace (.npz); a known model's name (resnet50.npz) is captured if missing. "
                   "Default: the shipped traces/cnn-digits-small.npz.")
@click.option("--no-capture", is_flag=True, help="Stop instead of capturing a missing known-model trace.")
@click.option("--params", default=None,
              help="Instead of a trace: a synthetic model of this many fp32 parameters, e.g. 125M, 7B, 100B "
                   "(message sizes exact, errors from a small synthetic sample; no compute).")
@click.option("--layers", type=Count(maximum=100_000), default=None,
              help="With --params: its number of equal layers (default 32).")
@click.option("--live", is_flag=True,
              help="Instead of a trace: train --model data-parallel here and feed each step's gradients straight "
                   "to the compressors (no file; memory does not grow with --steps).")
@click.option("--model", default=None, help="With --live: a model of the zoo (arcsim trace capture --help lists them), "
                                            "or your own: path/to/file.py:build or package.module:build.")
@model_arg_options
@click.option("--dataset", default=None, help="With --live: its dataset (default: the model's own).")
@input_size_option
@click.option("--workers", "-w", type=Count(minimum=2, maximum=1024),
              default=LIVE_DEFAULTS["workers"], show_default=True,
              help="With --live: data-parallel workers.")
@click.option("--steps", type=Count(), default=LIVE_DEFAULTS["steps"], show_default=True,
              help="With --live: training steps measured (after one untimed warm-up step).")
@click.option("--device", "live_device", type=click.Choice(["cpu", "cuda"]), default=LIVE_DEFAULTS["device"],
              show_default=True,
              help="With --live: where training runs; cuda also measures compute and compression there (CUDA events).")
@click.option("--compressors", "-c", default=",".join(COMPRESSORS), show_default=True,
              help="Comma-separated compressors to compare.")
@click.option("--density", "-d", default=0.01, show_default=True, type=DENSITY, help="k/d for the candidate table.")
@click.option("--memory", "-m", default=None, help=f"Error feedback for every compressor: {', '.join(MEMORIES)} "
                                                   "(default: ef14; none for dense and fp16).")
@click.option("--engine", type=click.Choice(ENGINES), default="analytic", show_default=True)
@library_option
@click.option("--bandwidth", default=None, help="Per-NIC bandwidth instead of the topology's, e.g. 25Gbit.")
@click.option("--latency", default=None,
              help="One-way network latency per message instead of the topology's, e.g. 2us.")
@click.option("--bucket-mb", default=None, type=Number(above=0, maximum=MAX_BUCKET_MB),
              help=f"DDP bucket cap (MiB of fp32; default {DDP_BUCKET_MB:g}); with --framework horovod the fusion "
                   f"threshold (default {HOROVOD_FUSION_MB:g}); with deepspeed its buffer (default "
                   f"{DEEPSPEED_BUFFER_MB:g}: 5e8 elements).")
@click.option("--framework", type=click.Choice(list(FRAMEWORKS)), default="ddp", show_default=True, metavar="NAME",
              help="ddp: DDP buckets sent as each is ready; horovod: tensors ready in one cycle fused into buffers "
                   "of the fusion threshold, sparsified tensors all-gathered one by one; deepspeed: buffers sent "
                   "after backward (docs/run.md).")
@click.option("--cycle-ms", default=None, type=Number(minimum=0),
              help="Horovod's cycle time (HOROVOD_CYCLE_TIME; default 1 ms, 5 in versions before 0.21).")
@click.option("--fusion", type=click.Choice([*FUSIONS, "both"]), default="bucket", show_default=True,
              help="bucket: DDP buckets, each compressed and sent as its gradients are ready; model: the whole "
                   "gradient as one vector after backward (as the AR-Top-k and Gaussian-k reference code); both: "
                   "also report what fusion changes.")
@click.option("--hierarchy", default="flat", show_default=True,
              help="flat: compress across every rank; node: reduce dense inside each node and compress only between "
                   "nodes (each GPU its slice, one rail per GPU); both: price every compressor both ways and let "
                   "the policy choose.")
@click.option("--sharding", default="none", show_default=True,
              help="Parallel strategies to price side by side: none (DDP, with the compressors), full (FSDP / "
                   "ZeRO-3), hybrid (HSDP), joined by commas; the sharded ones with ZeRO++'s quantised collectives, "
                   "memory per GPU on every row (docs/sharding.md).")
@click.option("--policy", default="auto", show_default=True,
              help=f"One of: {', '.join(POLICIES)}. auto: the soonest to the target (iteration time × the steps its "
                   "error needs); paper: Tyagi & Swany's per-bucket NSGA-II over time and compression gain; gate: "
                   "per bucket the fastest whose error is within --slack of Top-K's (the rule before); none.")
@click.option("--slack", default=None, type=Number(minimum=0),
              help="--policy gate only: error allowed above Top-K's, relative (default 0.25).")
@click.option("--dense-steps", default=1000.0, show_default=True, type=Number(above=0),
              help="Steps dense fp32 takes to the target: scales every time_to_target_s (never the ranking).")
@click.option("--ratios", default=",".join(f"{r:g}" for r in DEFAULT_RATIOS), show_default=True,
              type=ListOf(DENSITY, unique=True, example="1e-3,1e-2,0.1"),
              help="Density grid for the speed/fidelity trade-off.")
@click.option("--weights", default=None, type=ListOf(Number(minimum=0), length=2, example="1,1"),
              help="Pick from the front by ASF with weights TIME,ERROR instead of the knee.")
@click.option("--gpu", default=None, help="Price compute and compression on this GPU (arcsim device list); "
                                          "default: the topology's, cpu for what this machine measures.")
@click.option("--batch", "-b", type=Count(), default=None,
              help="Batch per GPU for the GPU's compute (default: the trace's, else 32).")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None,
              help="The GPU's compute: fp32 (TF32 convolutions, PyTorch's defaults), bf16 or fp16 autocast (fp16: "
                   "a V100's tensor cores; default: the trace's, else fp32).")
@click.option("--compare-gpu", default=None,
              help="With --plot: also run on this GPU and draw both breakdowns side by side (breakdown-gpus.png).")
@click.option("--compute-profile", type=InputPath(directory=True), default=None,
              help="Compute timings from this profile (arcsim trace profile) instead of the trace's own.")
@click.option("--seed", default=0, show_default=True, type=Count(minimum=0))
@click.option("--grid-steps", type=Count(), default=None,
              help="Trace steps for the ratio grid (default: all; the first only for large traces).")
@click.option("--measure-device", type=click.Choice(list(MEASURE_DEVICES)), default="cpu", show_default=True,
              help="Run the trace's compressors here on this device: cuda also times them with CUDA events beside the "
                   "kernel model's price (docs/devices.md).")
@click.option("--exact", is_flag=True,
              help="Measure every element (default: a large trace's measurements compress a random sample of every "
                   "layer's columns — PowerSGD a stratified sample of its buckets —, the error's ± including "
                   "the sampling; docs/run.md).")
@click.option("--network-schedule", "schedule", type=InputPath(), default=None,
              help="Also the best choice on each phase's network of this schedule (examples/schedule-c1.yaml).")
@click.option("--history", "history_dir", default=None,
              type=InputPath(directory=True, file=False, reads=("config.json", "history.csv", "target.json")),
              help="An arcsim train directory with a target: each candidate's steps to the target there, times its "
                   "iteration time here, estimate its time to target (shown beside the front's pick).")
@click.option("--all-collectives", is_flag=True, help="Show every (compressor, collective) pair, not the best.")
@json_option
@click.option("--csv", "csv_out", type=OutputPath(), default=None, help="Write every point as CSV.")
@click.option("--plot", "plot_dir", type=OutputPath(directory=True, writes=("*.png",)), default=None,
              help="Write PNG charts here.")
@click.option("--write-plan", "plan_out", type=OutputPath(), default=None,
              help="Write the recommendation per DDP bucket as JSON, for the hook: "
                   "arcsim.hooks.MixedState.load(FILE) (docs/ddp-hooks.md).")
@scope_option
@compressor_option
@click.option("--force", is_flag=True, help=f"{FORCE_TRAINING_HELP} With --engine des: price past its work limits.")
def run(topology: str, trace: str | None, no_capture: bool, params: str | None, layers: int | None,
        live: bool, model: str | None, model_args: tuple[str, ...], data: str | None, dataset: str | None,
        input_size: int | None, workers: int, steps: int, live_device: str,
        compressors: str, density: float, memory: str | None,
        engine: str, library: str | None, bandwidth: str | None, latency: str | None, bucket_mb: float | None,
        framework: str, cycle_ms: float | None, fusion: str, hierarchy: str, sharding: str, policy: str,
        slack: float | None, dense_steps: float, ratios: tuple[float, ...],
        weights: tuple[float, float] | None,
        gpu: str | None, batch: int | None, precision: str | None, compare_gpu: str | None, compute_profile: str | None,
        seed: int,
        grid_steps: int | None, all_collectives: bool, json_out: str | None, csv_out: str | None, plot_dir: str | None,
        scope: str, schedule: str | None = None, history_dir: str | None = None, force: bool = False,
        exact: bool = False, plan_out: str | None = None, measure_device: str = "cpu",
        compressor_options: tuple[str, ...] = ()) -> None:
    """Predict the iteration time of every compressor and collective for a trace on a topology."""
    chosen = tuple(c.strip() for c in compressors.split(",") if c.strip())
    check_compression(chosen, memory, ArcsimError)  # before torch is imported: a typo answered at once
    own_options = parse_compressor_options(compressor_options)
    training = live_training(live, model, dataset, workers, steps, live_device, batch, seed, model_args, data,
                             input_size)
    from arcsim.run.config import RunConfig  # torch-free: every check below is answered before torch loads

    cfg = RunConfig(topology=topology, trace=trace, compressors=chosen,
                    density=density, memory=memory, engine=engine, bucket_mb=bucket_mb, policy=policy,
                    ratios=tuple(sorted(ratios)), weights=weights,
                    compute_profile=compute_profile, slack=slack, dense_steps=dense_steps, seed=seed,
                    allow_capture=not no_capture, force=force,
                    grid_steps=grid_steps, options={"scope": scope, **own_options}, gpu=gpu, batch=batch,
                    precision=precision,
                    library=library, bandwidth=parse_rate(bandwidth) if bandwidth else None,
                    latency=parse_duration(latency) if latency else None,
                    fusion="bucket" if fusion == "both" else fusion,
                    params=parse_params(params) if params is not None else None, layers=layers, live=training,
                    hierarchy=hierarchy, framework=framework, cycle_ms=cycle_ms, exact=exact,
                    measure_device=measure_device)
    cfg.check()
    if own_options:  # a value each compressor refuses (qsgd block=-1) is refused now, before any trace is read
        from arcsim.compressors.registry import make_compressor

        if plan_out:
            raise ArcsimError("--write-plan deploys each bucket's compressor with its default options: give it "
                              "without --option")
        for name in chosen:
            try:
                make_compressor(name, density, **options_for(name, cfg.options))
            except (TypeError, ValueError, OverflowError) as exc:
                raise ArcsimError(f"--option: {name} cannot take {own_options} ({exc})") from None
    if plan_out and (framework != "ddp" or fusion != "bucket"):
        raise ArcsimError("--write-plan plans DDP's buckets for its comm hook: give it with --framework ddp and "
                          "--fusion bucket (the defaults)")
    strategies = _strategies(sharding, cfg)
    network_schedule = None
    if schedule is not None:
        from arcsim.network_schedule import load_schedule

        if bandwidth or latency:
            raise ArcsimError("--network-schedule sets each phase's bandwidth and latency: give it without "
                              "--bandwidth and --latency")
        network_schedule = load_schedule(schedule)
    trained = None
    if history_dir is not None:
        from arcsim.run.convergence import load_trained

        trained = load_trained(history_dir)
    if compare_gpu:
        from arcsim.devices.catalog import device

        device(compare_gpu)  # an unknown name fails before any work
        if not plot_dir:
            raise ArcsimError("--compare-gpu draws a chart: give --plot DIR too")
    if training is not None and not training.on_gpu:
        from arcsim.run.analysis import LIVE_MEMORY_BYTES
        from arcsim.traces.estimates import check_training, live_run

        estimate = check_training(f"--live training of {model}", functools.partial(
            live_run, training, cfg.planned_measurements_at_most(), LIVE_MEMORY_BYTES), force)
        if estimate is not None and estimate.worth_saying:
            note(f"--live {model}: {estimate.describe()}")
    from arcsim.run import report
    from arcsim.run.analysis import Analysis

    with step_progress("training" if live else "capture", unit="train step") as capture_progress:
        analysis = Analysis(cfg, announce=note, capture_progress=capture_progress)
    todo, seconds = analysis.measuring_work()
    if todo and seconds >= NOTE_SECONDS:
        note(f"measuring {todo} compressor run(s) on the trace ({analysis.planned_measurements() - todo} cached): "
             f"~{rough_duration(seconds)} here{analysis.measuring_load.describe()}")
    with progress_bar(analysis.planned_measurements(), "measuring compressors on the trace", "run") as bar:
        def progress(label: str) -> None:
            bar.set_postfix_str(label)
            bar.update()

        analysis.progress = progress
        analysis.detail = bar.set_postfix_str
        with allow_any(force):
            result = analysis.run()
    fused = None
    if fusion == "both":
        from arcsim.run.analysis import fusion_comparison

        note("pricing again with the whole model fused into one vector …")
        fused = fusion_comparison(analysis, result)
    refused: dict[str, str] = {}
    if strategies != ("none",):
        from arcsim.run.strategies import not_under_full_sharding, strategy_rows

        note("pricing the parallel strategies …")
        result.strategies = strategy_rows(analysis, result, strategies)
        refused = not_under_full_sharding(cfg.compressors) if "full" in strategies else {}
    if tables_wanted(json_out):
        report.render(result, console, every_collective=all_collectives)
        if fused is not None:
            report.render_fusion(fused, console)
    payload = report.to_json(result)
    if fused is not None:
        payload["fusion"] = fused
    if result.strategies:
        from arcsim.run.strategies import render_strategies

        payload["strategies"] = [r.to_dict() for r in result.strategies]
        payload["not_under_full_sharding"] = refused
        if tables_wanted(json_out):
            render_strategies(result.strategies, result.ctx.topo.name, console, refused)
    if network_schedule is not None:
        from arcsim.run.phases import per_phase, render_phases

        note(f"pricing again on each of the {len(network_schedule.phases)} networks of {network_schedule.name} …")
        payload["phases"] = per_phase(analysis, network_schedule)
        if tables_wanted(json_out):
            render_phases(payload["phases"], network_schedule, console)
    if trained is not None:
        from arcsim.run.convergence import render_time_to_target, time_to_target

        rec = result.recommendation
        if result.policy is not None and result.policy.name in ("auto", "paper"):  # the pick is the policy's
            pick = next((p for p in result.pareto.evaluated if (p.compressor, p.collective, p.hierarchy, p.density)
                         == (rec.compressor, rec.collective, rec.hierarchy, rec.density)), None)
            payload["time_to_target"] = time_to_target(result.pareto.evaluated, pick, trained,
                                                       f"{result.policy.name}'s pick (steps from its model of error)")
        else:
            payload["time_to_target"] = time_to_target(result.pareto.evaluated, result.pareto.chosen, trained)
        priced = analysis.trace.meta.get("model")
        if trained.model != priced:
            note(f"warning: --history trained {trained.model}, this run prices {priced}: its steps to target are "
                 "another model's")
        if tables_wanted(json_out):
            render_time_to_target(payload["time_to_target"], console)
    write_json(payload, json_out)
    if plan_out:
        write_plan(result.recommendation.plan, Path(plan_out))
    if csv_out:
        report.write_csv(result, Path(csv_out))
        note(f"wrote {csv_out}")
    if plot_dir:
        from arcsim.run.plots import write_plots

        written, skipped = write_plots(result, Path(plot_dir))
        if compare_gpu:
            from arcsim.run.plots import gpu_comparison

            note(f"running again on {compare_gpu} for the side-by-side chart …")
            again = Analysis(dataclasses.replace(cfg, gpu=compare_gpu), announce=note, source=analysis.trace)
            again.share_measurements(analysis)  # the compressors ran on the trace once
            other = again.run()
            written.append(gpu_comparison([result, other], Path(plot_dir) / "breakdown-gpus.png"))
        for path in written:
            note(f"wrote {path}")
        for reason in skipped:
            note(f"no chart: {reason}")



def _strategies(sharding: str, cfg: RunConfig) -> tuple[str, ...]:
    """--sharding's strategies, refused before any work where the run or its cluster cannot shard."""
    from arcsim.run.config import check_sharding, parse_sharding
    from arcsim.topology import load_topology

    strategies = parse_sharding(sharding)
    if strategies != ("none",):
        topo = load_topology(cfg.topology)
        check_sharding(strategies, topo.ranks, topo.gpus_per_node, topo.nodes, topo.name, cfg.params is not None)
    return strategies


def write_plan(plan: dict | None, path: Path) -> None:
    """The recommendation's per-bucket plan to ``path``, for arcsim.hooks.MixedState."""
    from arcsim.strategy.plan import BucketPlan

    assert plan is not None  # DDP buckets: checked before any work
    loaded = BucketPlan.from_dict(plan)
    loaded.save(path)
    note(f"wrote {path}: {loaded.summary()}; in the job: ddp.register_comm_hook(MixedState.load({str(path)!r}), "
         "mixed_hook)")


def live_training(live: bool, model: str | None, dataset: str | None, workers: int, steps: int, live_device: str,
                  batch: int | None, seed: int, model_args: tuple[str, ...] = (),
                  data: str | None = None, input_size: int | None = None) -> TrainingConfig | None:
    """The live training --live asks for (None without it); --model, --dataset, --workers, --steps and --device
    go with --live only."""
    if not live:
        given = given_options("model", ("--model-arg", "model_args"), "data", "dataset", ("--seq-len", "input_size"),
                              "workers", "steps", ("--device", "live_device"))
        if given:
            raise ArcsimError(f"{', '.join(given)} choose{'s' if len(given) == 1 else ''} what --live trains: add "
                              "--live (a trace's workers and steps are the ones it recorded)")
        return None
    from arcsim.traces.training import live_config

    if not model:
        raise ArcsimError("--live needs --model, e.g. --live --model resnet18 (arcsim trace capture --help lists them)")
    return live_config(model, workers, steps, live_device, seed, dataset, batch, model_args, data,
                       input_size=input_size)
