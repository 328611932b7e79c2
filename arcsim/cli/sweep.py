"""`arcsim sweep` (what-if grids over clusters, traces, compressors and ratios) and `arcsim plot`."""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import click

from arcsim.catalog import DDP_BUCKET_MB, LIVE_DEFAULTS
from arcsim.cli.common import (
    Count,
    Verbosity,
    json_option,
    note,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath, Place, Reads, topology_places, trace_places
from arcsim.errors import ArcsimError
from arcsim.sweep.spec import CHART_KINDS, RESULTS, SPEC

SWEEP_OPTIONS = {  # option → spec key; every value is a comma list, strings may hold {a,b} groups
    "topology": "topology", "bandwidth": "bandwidth", "latency": "latency", "ranks": "ranks", "trace": "trace",
    "compressors": "compressor", "density": "density", "bucket_mb": "bucket_mb", "engine": "engine", "gpu": "gpu",
    "library": "library", "fusion": "fusion", "params": "params", "live": "live", "hierarchy": "hierarchy",
}
LIVE_OPTIONS = {"live_workers": "live_workers", "live_steps": "live_steps", "live_device": "live_device",
                "live_dataset": "live_dataset"}


def spec_places(path: Path) -> list[Place]:
    """The topology and trace files a sweep file names (a bad file names none here: the sweep itself says what is
    wrong with it; read as strictly, so an alias bomb is refused, not expanded)."""
    from arcsim.files import read_yaml

    try:
        raw = read_yaml(path, "sweep file", ArcsimError)
    except ArcsimError:
        return []
    if not isinstance(raw, dict):
        return []
    found = []
    for axis, resolve in (("topology", topology_places), ("trace", trace_places)):
        values = raw.get(axis)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str):
                found += resolve(value)
    return found


@click.command("sweep")
@click.argument("spec_file", required=False, type=InputPath(expand=spec_places))
@click.option("--topology", "-t", default=None, type=Reads("topology"),
              help="Topologies, e.g. 8x8-ib{25,100,400} or a,b (default 8x8-ib100).")
@click.option("--bandwidth", "-b", default=None, help="Per-NIC bandwidth overrides, e.g. 10Gbit,100Gbit.")
@click.option("--latency", default=None, help="Network latency overrides, e.g. 2us,20us.")
@click.option("--ranks", default=None, help="Rank counts (whole nodes of the topology), e.g. 16,64,256.")
@click.option("--trace", default=None, type=Reads("trace"),
              help="Traces (.npz), e.g. traces/cnn-digits-small.npz,resnet18.npz.")
@click.option("--compressors", "-c", default=None, help="Compressors (default dense,topk,randk,arctopk,star,powersgd).")
@click.option("--density", "-d", default=None, help="Densities k/d, e.g. 1e-3,1e-2,0.1 (default 0.01).")
@click.option("--bucket-mb", default=None, help=f"DDP bucket caps in MiB (default {DDP_BUCKET_MB:g}).")
@click.option("--engine", default=None, help="Engines: analytic, des, or analytic,des for both (default analytic).")
@click.option("--gpu", default=None, help="GPUs to price on, e.g. v100,h100 (default: the topology's; cpu: "
                                          "as measured here).")
@click.option("--library", default=None, help="Communication libraries, e.g. nccl,gloo (default: the topology's).")
@click.option("--params", default=None, help="Synthetic models instead of traces, e.g. 125M,7B,100B.")
@click.option("--fusion", default=None, help="bucket, model, or bucket,model for both (default bucket).")
@click.option("--hierarchy", default=None, help="flat, node, or flat,node for both (default flat): node-aware "
                                                "compression, dense inside each node (multi-GPU topologies).")
@click.option("--live", default=None, help="Models trained here instead of traces (arcsim run --live): zoo names "
                                          "(e.g. cnn) or your own (file.py:build).")
@click.option("--live-workers", default=None, type=Count(minimum=2, maximum=1024),
              help=f"With --live: data-parallel workers (default {LIVE_DEFAULTS['workers']}).")
@click.option("--live-steps", default=None, type=Count(),
              help=f"With --live: training steps measured (default {LIVE_DEFAULTS['steps']}).")
@click.option("--live-device", default=None, type=click.Choice(["cpu", "cuda"]),
              help=f"With --live (default {LIVE_DEFAULTS['device']}).")
@click.option("--live-dataset", default=None,
              help="With --live: the built-in dataset they train on (default: each zoo model's own).")
@click.option("--memory", "-m", default=None, help="Error feedback for every compressor (default ef14).")
@click.option("--seed", default=None, type=Count(minimum=0))
@click.option("--out", "-o", default=None,
              type=OutputPath(directory=True, writes=(RESULTS, "*.png")),  # and its SPEC, only where there is none
              help="Results directory (default reports/sweeps/<date-time>); an existing one resumes.")
@click.option("--scheduler", default=None, help="Run on this Dask scheduler (tcp://host:8786) instead of here.")
@click.option("--workers", "-j", default=None, type=click.IntRange(1, 256),
              help="Local worker processes (default: one per core).")
@click.option("--no-plots", is_flag=True, help="Do not draw the charts at the end.")
@click.option("--dry-run", is_flag=True, help="Print how many points the sweep has and stop.")
@json_option
def sweep(spec_file: str | None, out: str | None, scheduler: str | None, workers: int | None, no_plots: bool,
          dry_run: bool, memory: str | None, seed: int | None, json_out: str | None, **axes: str | None) -> None:
    """Evaluate every combination of the given axes; rows stream to OUT/results.csv, charts beside it.

    A sweep can be a YAML file (see examples/sweep.yaml); options given here override its keys."""
    from arcsim.sweep.spec import build_spec, load_yaml_spec, merge  # the spec's checks first: pandas and charts after

    raw = load_yaml_spec(Path(spec_file)) if spec_file else {}
    cli_values: dict[str, Any] = {{**SWEEP_OPTIONS, **LIVE_OPTIONS}[k]: v for k, v in axes.items()}
    cli_values.update(memory=memory, seed=seed)
    spec = build_spec(merge(raw, cli_values), source=spec_file or "command line")
    points = spec.points()
    if dry_run:
        if json_out:
            write_json({"points": len(points), "describe": spec.describe(), "note": spec.count_note(len(points))},
                       json_out)
        else:
            click.echo(f"{_points(len(points))}: {spec.describe()}")
        return
    directory = Path(out or spec.out or f"reports/sweeps/{datetime.datetime.now():%Y%m%d-%H%M%S}")
    from arcsim.sweep.runner import check_points, run_sweep

    points = check_points(spec, note)
    from arcsim.sweep.plots import plot_all
    from arcsim.sweep.store import ResultStore

    ResultStore(directory).check(spec)
    note(f"sweep of {_points(len(points))} ({spec.describe()}) → {directory}")
    if spec.count_note(len(points)):
        note(spec.count_note(len(points)))
    started = time.perf_counter()
    outcome = run_sweep(spec, directory, scheduler=scheduler, workers=workers, announce=note,
                        show_progress=not Verbosity.quiet, points=points)
    took = time.perf_counter() - started
    if outcome.interrupted:
        note(f"interrupted: {outcome.already_done + outcome.computed} of {outcome.total} points are kept in "
             f"{directory}/results.csv; run the same command again to finish the rest")
        raise SystemExit(130)
    rate = f" ({outcome.computed / took:.2f} points/s)" if outcome.computed else ""
    note(f"{outcome.computed} points computed in {took:.1f} s{rate}; {outcome.total} in {directory}/results.csv")
    written, skipped = ([], []) if no_plots else _plots(directory, plot_all)
    if json_out:
        from arcsim.sweep.store import load_results

        write_json({"directory": str(directory), "points": outcome.total, "computed": outcome.computed,
                    "already_done": outcome.already_done, "seconds": took, "charts": [str(p) for p in written],
                    "charts_skipped": skipped, "rows": records(load_results(directory))}, json_out)


def records(df) -> list[dict]:
    """A results table as JSON records (NaN as null)."""
    import json

    return json.loads(df.to_json(orient="records"))


def _points(n: int) -> str:
    return f"{n} point{'s' if n != 1 else ''}"


def _plots(directory: Path, plot_all) -> tuple[list[Path], list[str]]:
    from arcsim.sweep.store import expected_points, load_results

    written, skipped = plot_all(load_results(directory), directory, expected=expected_points(directory),
                                announce=note)
    for path in written:
        note(f"wrote {path}")
    for reason in skipped:
        note(f"no chart: {reason}")
    return written, skipped


@click.command("plot")
@click.argument("results", type=InputPath(directory=True, reads=(RESULTS, SPEC)))
@click.option("--kind", "-k", "kinds", multiple=True, default=("all",), show_default=True,
              type=click.Choice(["all", *CHART_KINDS]),
              help="Which chart; repeat for several.")
@click.option("--out", "-o", default=None, type=OutputPath(directory=True, writes=("*.png",)),
              help="Where the PNGs go (default: beside the results).")
@click.option("--policy", default=None, type=click.Choice(["auto", "none"]),
              help="Heatmap: each cell's pick by arcsim run's rule: auto (the default), the soonest to the target; "
                   "none, the knee of the usable time/error front.")
@click.option("--any-error", is_flag=True, help="Heatmap: the fastest compressor whatever its error.")
@click.option("--where", "conditions", multiple=True, metavar="NAME=VALUE",
              help="Only the points where an axis has this value, e.g. --where ranks=32 --where bandwidth=100Gbit "
                   "(instead of holding it at its first value); repeat for several.")
@json_option
def plot(results: str, kinds: tuple[str, ...], out: str | None, policy: str | None, any_error: bool,
         conditions: tuple[str, ...], json_out: str | None) -> None:
    """Draw charts from a sweep's results (its directory or results.csv)."""
    if policy is not None and any_error:
        raise ArcsimError("--any-error picks the fastest whatever its error, so --policy would change nothing: give "
                          "one of them")
    from arcsim.sweep.plots import INCOMPLETE, KINDS, incompleteness, plot_all, select
    from arcsim.sweep.store import expected_points, finished_results

    df = finished_results(Path(results))
    path = Path(results)
    target = Path(out) if out else (path if path.is_dir() else path.parent)
    wanted = tuple(KINDS) if "all" in kinds else kinds
    expected = expected_points(path)
    missing = incompleteness(df, expected)
    if missing:
        note(f"{missing}: the charts say so; run the sweep again to finish it")
    if conditions:
        df = select(df, conditions)
        df.attrs[INCOMPLETE], expected = missing, None
    written, skipped = plot_all(df, target, wanted, None if any_error else (policy or "auto"),
                                expected, announce=note)
    for p in written:
        note(f"wrote {p}")
    if skipped and "all" not in kinds:
        raise ArcsimError(f"cannot draw it: {'; '.join(skipped)}")
    for reason in skipped:
        note(f"no chart: {reason}")
    write_json({"charts": [str(p) for p in written], "charts_skipped": skipped}, json_out)
