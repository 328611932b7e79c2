"""`arcsim trace capture | profile | info`: make and inspect gradient traces and compute profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from arcsim.catalog import DATASETS
from arcsim.cli.common import (
    FORCE_TRAINING_HELP,
    MODEL_HELP,
    Count,
    console,
    input_size_option,
    json_option,
    model_arg_options,
    note,
    optimizer_options,
    optimizer_settings,
    step_progress,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath, Reads
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.units import format_duration, format_size

DATASET_HELP = f"One of: {', '.join(DATASETS)} (default: the model's own)."
DTYPE_HELP = ("How the file stores the recorded gradients: fp16 halves it (a gradient past fp16's range is refused), "
              "fp32 keeps them exact; the compressors read them as fp32. Not the precision training ran in "
              "(capture: --precision).")


@click.group()
def trace() -> None:
    """Gradient traces: capture from live training, profile compute, inspect."""


@trace.command("capture")
@click.option("--model", required=True, help=MODEL_HELP)
@model_arg_options
@click.option("--dataset", default=None, help=DATASET_HELP)
@click.option("--workers", "-w", default="8", show_default=True, type=Count(minimum=2, maximum=1024),
              help="Data-parallel workers W.")
@click.option("--steps", "-s", default="3", show_default=True, type=Count(), help="Recorded steps.")
@click.option("--every", default="1", show_default=True, type=Count(), help="Training steps between recordings.")
@click.option("--warmup", default="0", show_default=True, type=Count(minimum=0),
              help="Training steps before the first.")
@click.option("--batch", "-b", default=None, type=Count(), help="Batch per worker (default: the model's).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--dtype", type=click.Choice(["fp16", "fp32"]), default="fp16", show_default=True, help=DTYPE_HELP)
@click.option("--seed", default=0, show_default=True, type=Count(minimum=0))
@optimizer_options
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="Training as it is trained: bf16 runs forward and loss under autocast (gradients stay fp32). "
                   "Not how the file stores them: that is --dtype.")
@input_size_option
@click.option("--out", "-o", required=True, type=OutputPath(), help="Trace file to write (.npz).")
@click.option("--force", is_flag=True, help=FORCE_TRAINING_HELP)
def trace_capture(model: str, model_args: tuple[str, ...], data: str | None, dataset: str | None, workers: int,
                  steps: int, every: int, warmup: int, batch: int | None, device: str, dtype: str, seed: int,
                  input_size: int | None, precision: str, out: str, force: bool, **optimizer: Any) -> None:
    """Capture per-worker gradients and compute timings from live data-parallel training."""
    from arcsim.traces.capture import CaptureConfig, capture

    cfg = CaptureConfig(model=model, out=Path(out), dataset=dataset, workers=workers, steps=steps, every=every,
                        warmup=warmup, batch=batch, device=device, dtype=dtype, seed=seed, input_size=input_size,
                        precision=precision, model_args=model_args, data=data, **optimizer_settings(optimizer))
    cfg.check()
    if not cfg.on_gpu:
        from arcsim.traces.estimates import CAPTURE_BYTES_PER_ELEMENT, check_training, training

        estimate = check_training(f"capturing {model}",
                                  lambda: training(cfg, state_per_element=CAPTURE_BYTES_PER_ELEMENT), force)
        if estimate is not None and estimate.worth_saying:
            note(f"capture {model}: {estimate.describe()}")
    with step_progress(f"capture {model}", unit="train step") as progress:
        path = capture(cfg, progress)
    note(written(path))


@trace.command("profile")
@click.option("--model", required=True, help=MODEL_HELP)
@model_arg_options
@click.option("--dataset", default=None, help=DATASET_HELP)
@click.option("--batch", "-b", required=True, type=Count(), help="Batch per worker.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option("--repeats", default="10", show_default=True, type=Count(), help="Timed iterations (median).")
@click.option("--warmup", default="3", show_default=True, type=Count(minimum=0), help="Untimed iterations first.")
@click.option("--bf16", is_flag=True, help="bf16 autocast instead of fp32.")
@input_size_option
@click.option("--out", "-o", required=True, type=OutputPath(), help="Profile to write (.json).")
def trace_profile(model: str, model_args: tuple[str, ...], data: str | None, dataset: str | None, batch: int,
                  device: str, repeats: int, warmup: int, bf16: bool, input_size: int | None, out: str) -> None:
    """Measure forward and per-layer backward timings on a device, without storing gradients."""
    from arcsim.models.source import model_source
    from arcsim.traces.timing import measure_profile

    if not out.endswith(".json"):
        raise ArcsimError(f"--out {out}: a compute profile is a .json file")
    with step_progress(f"profile {model}", unit="iter") as progress:
        done = [0]

        def tick() -> None:
            done[0] += 1
            progress(done[0], warmup + repeats)

        prof = measure_profile(model_source(model, model_args), batch, device, dataset, input_size, repeats, warmup,
                               bf16, tick, data)
    path = Path(out)
    write_atomic(path, json.dumps(prof.to_json(), indent=1) + "\n")
    note(f"wrote {path}: {model} batch {batch} on {prof.device_name}: forward {format_duration(prof.forward_s)}, "
         f"backward {format_duration(prof.backward_s)}, {len(prof.layers)} layers")


@trace.command("merge")
@click.argument("parts", nargs=-1, required=True, type=InputPath())
@click.option("--model", default=None, help="The model the job trained (as --model takes it elsewhere), so that "
                                            "arcsim run can price its compute; checked against the recording.")
@model_arg_options
@click.option("--dataset", default=None, help="The built-in dataset it trained on, if any (not needed: the recording "
                                            "keeps the shapes of the model's input).")
@click.option("--batch", "-b", default="0", type=Count(minimum=0),
              help="Batch per rank (default: the recorded input's leading dimension).")
@click.option("--dtype", type=click.Choice(["fp16", "fp32"]), default="fp16", show_default=True, help=DTYPE_HELP)
@click.option("--out", "-o", required=True, type=OutputPath(), help="Trace file to write (.npz).")
def trace_merge(parts: tuple[str, ...], model: str | None, model_args: tuple[str, ...], data: str | None,
                dataset: str | None, batch: int, dtype: str, out: str) -> None:
    """Join the parts a recording hook wrote (one per rank of your DDP job) into one trace."""
    from arcsim.models.source import model_source
    from arcsim.traces.merge import merge_recordings

    if not out.endswith(".npz"):
        raise ArcsimError(f"--out {out}: a trace file name must end in .npz")
    source = model_source(model, model_args) if model else None
    path = merge_recordings([Path(p) for p in parts], Path(out), source, dataset, batch, dtype, data)
    note(written(path))


def written(path: Path) -> str:
    """What a trace just written holds, read back from its file; a pipe's stream is gone once read (reading it
    again would wait for a writer forever)."""
    from arcsim.traces.format import open_trace

    if not path.is_file():
        return f"wrote {path} (streamed: not read back)"
    t = open_trace(path)
    took = t.meta.get("capture_seconds")
    return (f"wrote {path}: {t.steps} steps × {t.workers} workers × {t.elements:,} elements "
            f"({t.meta['dtype']}, {format_size(path.stat().st_size)})" + (f" in {took:.1f} s" if took else ""))


@trace.command("info")
@click.argument("file", required=False, type=Reads("trace"))
@click.option("--no-stats", is_flag=True, help="Skip the per-step gradient statistics (no gradient reads).")
@click.option("--no-capture", is_flag=True, help="Do not capture a missing known-model trace.")
@json_option
def trace_info_cmd(file: str | None, no_stats: bool, no_capture: bool, json_out: str | None) -> None:
    """Metadata, layer table, compute timings and gradient statistics of a trace (default: the shipped one)."""
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace
    from arcsim.traces.stats import trace_info

    with step_progress("capture", unit="train step") as progress:
        path = resolve_trace(file, allow_capture=not no_capture, announce=note, progress=progress)
    info = trace_info(open_trace(path), with_stats=not no_stats)
    write_json(info, json_out)
    if tables_wanted(json_out):
        _render_info(info)


def _origin_rows(meta: dict) -> tuple[tuple[str, str], tuple[str, str]]:
    """The workers and where their gradients came from: a capture's device, seed and time; or, for a trace merged
    from a recording hook's parts (which has no seed or capture time of arcsim's), the ranks it recorded of its
    job's world."""
    workers, batch = meta["workers"], meta["batch_per_worker"]
    if meta.get("device") != "recorded":
        took = f", {meta['capture_seconds']} s" if "capture_seconds" in meta else ""
        return (("workers × batch", f"{workers} × {batch}"),
                ("captured on", f"{meta['device']} ({meta.get('device_name', '?')}), torch {meta['torch_version']}, "
                                f"seed {meta['seed']}{took}"))
    ranks = meta.get("recorded_ranks") or list(range(workers))
    world = meta.get("job_world_size", workers)
    return (("workers × batch", f"{workers} × {batch}" if batch else f"{workers} × ? (the forward's input was not "
                                                                     "recorded)"),
            ("recorded from", f"ranks {', '.join(map(str, ranks))} of a job of {world} ranks (RecordingState), torch "
                              f"{meta['torch_version']}"))


def _render_info(info: dict) -> None:
    meta = info["metadata"]
    head = Table(title=f"{info['path']} ({format_size(info['size_bytes'])})", show_header=False)
    head.add_column(style="bold")
    head.add_column()
    data = f"{meta['dataset']} — {meta.get('dataset_description', '')}"
    if meta["synthetic_data"]:
        data += "  [bold yellow](SYNTHETIC data: gradient statistics are not those of real training)[/]"
    workers, origin = _origin_rows(meta)
    rows = [("model", f"{meta['model']} ({meta['params']:,} parameters)"), ("data", data), workers,
            ("training", f"{meta.get('optimizer', '?')}, {meta.get('precision', 'fp32')}"),
            ("recorded steps", f"{meta['steps']} at training steps {meta['recorded_steps']}"),
            ("gradients", f"{meta['dtype']} [{meta['steps']}, {meta['workers']}, {info['layers']['elements']:,}]"),
            origin,
            ("compute (per worker)", f"forward {format_duration(info['compute']['forward_s'])}, "
                                     f"backward {format_duration(info['compute']['backward_s'])}"),
            ("command", meta["command"])]
    for key, value in rows:
        head.add_row(key, value)
    console.print(head)
    layers = info["layers"]
    lt = Table(title=f"{layers['count']} layers in backward order (first ready: {layers['first_ready']}, "
                     f"last: {layers['last_ready']}); largest")
    for col in ("layer", "shape", "elements", "share"):
        lt.add_column(col, justify="left" if col == "layer" else "right")
    for row in layers["largest"]:
        lt.add_row(row["name"], "×".join(map(str, row["shape"])), f"{row['numel']:,}", f"{row['share']:.1%}")
    console.print(lt)
    if "steps" not in info:
        return
    st = Table(title="Gradient statistics per recorded step",
               caption="agreement = ||mean||² / mean ||g_w||² (1: workers agree; 1/W: orthogonal)")
    for col in ("step", "loss", "||g_w|| mean", "||mean||", "kurtosis", "cos mean", "cos min…max", "agreement"):
        st.add_column(col, justify="right")
    for s in info["steps"]:
        loss = f"{s['loss']:.4f}" if meta.get("losses_recorded", True) else "-"  # a recording keeps none
        st.add_row(str(s["step"]), loss, f"{s['worker_norm']:.4g}", f"{s['mean_norm']:.4g}",
                   f"{s['kurtosis']:.1f}", f"{s['cosine_mean']:.3f}", f"{s['cosine_min']:.3f}…{s['cosine_max']:.3f}",
                   f"{s['agreement']:.3f}")
    console.print(st)
