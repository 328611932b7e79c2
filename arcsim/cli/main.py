"""The `arcsim` command line: thin; parses, calls the library, renders."""

from __future__ import annotations

import errno
import re
import sys
import traceback
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from arcsim import __version__
from arcsim.catalog import COMPRESSORS, MEMORIES, SYNTHETIC_KINDS
from arcsim.cli.cache import cache_group
from arcsim.cli.calibrate import calibrate as calibrate_command
from arcsim.cli.cluster import cluster as cluster_group
from arcsim.cli.common import (
    DENSITY,
    TOPOLOGY_HELP,
    Count,
    Number,
    Verbosity,
    console,
    des_progress,
    force_option,
    json_option,
    library_option,
    note,
    progress_bar,
    scope_option,
    step_progress,
    table_width,
    tables_wanted,
    write_json,
)
from arcsim.cli.device import device_group
from arcsim.cli.paths import Reads, guard_commands
from arcsim.cli.run import run as run_command
from arcsim.cli.shard import shard as shard_command
from arcsim.cli.sweep import plot as plot_command
from arcsim.cli.sweep import sweep as sweep_command
from arcsim.cli.trace import trace as trace_group
from arcsim.cli.train import train as train_command
from arcsim.cli.validate import validate as validate_command
from arcsim.collectives.libraries import get_library
from arcsim.collectives.limits import allow_any
from arcsim.collectives.tree import MAX_CHUNKS
from arcsim.errors import ArcsimError
from arcsim.files import packaged, write_error
from arcsim.netsim import ENGINES
from arcsim.pricing import ALGO_CHOICES, price_collective
from arcsim.processes import keep_freed_memory
from arcsim.topology import (
    DEFAULT_TOPOLOGY,
    GRAMMAR,
    INSTANCE_GRAMMAR,
    Topology,
    instance_names,
    load_topology,
    preset_names,
)
from arcsim.units import format_bits, format_duration, format_rate, format_size, parse_duration, parse_size

MAX_MESSAGE_BYTES = 1e15  # 1 PB: no gradient message is larger; past it the answer is an overflow, not a time


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="arcsim")
@click.option("--debug", is_flag=True, help="Show the full traceback on errors (read by main()).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars or status notes: only results and errors.")
def cli(debug: bool, quiet: bool) -> None:
    """arcsim: which gradient compressor, collective and ratio train fastest on your cluster.

    \b
    Every command that computes takes --json FILE, or --json - for JSON on stdout instead of the table.
    Shell completion (bash; zsh and fish alike): eval "$(_ARCSIM_COMPLETE=bash_source arcsim)"
    """
    Verbosity.quiet = quiet
    console.width = table_width()
    keep_freed_memory()  # gradient-sized temporaries reused, not page-faulted in afresh (arcsim.processes)


# -- topologies ----------------------------------------------------------------------------------------
@cli.group()
def topo() -> None:
    """Cluster topologies: presets, YAML files and the name grammar."""


@topo.command("list")
@json_option
def topo_list(json_out: str | None) -> None:
    """List preset topologies, and the instance types of clouds and vendors (<N>x<instance>, e.g. 4xp5)."""
    topologies = [load_topology(name) for name in preset_names()]
    instances = {name: load_topology(f"1x{name}") for name in instance_names()}  # one node of each
    write_json([{"kind": "preset", "name": t.name, "ranks": t.ranks, "nodes": t.nodes,
                 "gpus_per_node": t.gpus_per_node, "gpu": t.gpu, "node_bandwidth_Bps": t.node_bandwidth,
                 "description": t.description} for t in topologies]
               + [{"kind": "instance", "name": name, "usage": f"<N>x{name}", "ranks": None, "nodes": None,
                   "gpus_per_node": t.gpus_per_node, "gpu": t.gpu, "node_bandwidth_Bps": t.node_bandwidth,
                   "description": t.description} for name, t in instances.items()], json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title="Preset topologies", caption=f"Also any YAML path, or the grammar {escape(GRAMMAR)}")
    for col in ("name", "ranks", "inter-node per node", "description"):
        table.add_column(col)
    for t in topologies:
        table.add_row(t.name, str(t.ranks), format_bits(t.node_bandwidth), t.description)
    console.print(table)
    console.print(_instance_table(instances))


def _instance_table(instances: dict[str, Topology]) -> Table:
    """Nodes as clouds and vendors sell them: one row per instance type, named as ``<N>x<instance>``."""
    table = Table(title="Instance types: N nodes of one as <N>x<instance>",
                  caption=f"e.g. {escape(INSTANCE_GRAMMAR.split('e.g. ')[-1])}; sources: arcsim topo show 1x<instance>")
    for col in ("instance", "GPUs per node", "inside", "inter-node per node", "node"):
        table.add_column(col)
    for name, t in instances.items():
        inside = f"{t.intra.kind} {format_size(t.intra.bandwidth)}/s" if t.intra else "-"
        table.add_row(name, f"{t.gpus_per_node} × {t.gpu or '?'}", inside, format_bits(t.node_bandwidth),
                      re.split(r": | \(", t.description, maxsplit=1)[0])  # its product name
    return table


def summary_rows(t: Topology) -> list[tuple[str, str]]:
    """What `arcsim topo show` lists of a topology, a (field, value) row each."""
    net = t.network
    rows = [
        ("ranks", f"{t.ranks} ({t.nodes} nodes × {t.gpus_per_node} GPUs)"),
        ("gpu", t.gpu or "none named (compute as measured with the trace)"),
        ("library", f"{t.library}: {get_library(t.library).summary}"),
        ("intra-node", f"{t.intra.kind}: {format_rate(t.intra.bandwidth)} per GPU per direction, "
                       f"latency {format_duration(t.intra.latency)}"),
        ("inter-node", f"{net.kind}: {net.physical_nics} NIC(s) per node × "
                       f"{format_bits(net.bandwidth_per_physical_nic)}"
                       + (f" ({net.nics_per_rail} per GPU, striped: one {format_bits(net.bandwidth_per_nic)} rail "
                          "per GPU)" if net.nics_per_rail > 1 else "")
                       + f" = {format_bits(t.node_bandwidth)} per node, latency {format_duration(net.latency)}"),
        ("fabric", net.fabric if net.fabric == "switch" else
         f"fat-tree, {net.nodes_per_leaf} nodes per leaf, {net.oversubscription:g}:1 oversubscribed "
         f"(uplink {format_bits(t.uplink_bandwidth)} per leaf)"),
        ("reduction γ", f"{t.gamma:g} s/byte"),
        ("stragglers", ", ".join(f"rank {r}: {s:g}×" for r, s in sorted(t.stragglers.items())) or "none"),
        ("jitter per network crossing", f"{format_duration(t.crossing_jitter_s)} (mean, exponential)"
         if t.crossing_jitter_s else "none"),
        ("step effects", "none" if t.effects.none else
         f"compute σ/μ {t.effects.compute_cv:g} (the slowest of {t.ranks} ranks), "
         f"{format_duration(t.effects.step_jitter_s)} mean jitter per network step, "
         f"backward slowed {t.effects.interference:g} × the communication it overlaps"),
    ]
    measured = [("", op, c) for op, c in t.calibration.items()] + [
        (f"{group} ", op, c) for group, fits in t.group_calibration.items() for op, c in fits.items()]
    for group, op, c in measured:
        rows.append((f"measured {group}{op}", f"{format_duration(c.latency)} + size / {format_rate(c.bandwidth)} "
                                       f"(R² {c.r2:.4f}, {c.ranks} ranks"
                                       + (f", run by {c.library})" if c.library else ")")
                                       + ("" if c.small is None else
                                          f"; up to {format_size(c.small.up_to)}: "
                                          f"{format_duration(c.small.latency)} + size / "
                                          f"{format_rate(c.small.bandwidth)}")))
    return rows


@topo.command("show")
@click.argument("spec", type=Reads("topology"))
@json_option
def topo_show(spec: str, json_out: str | None) -> None:
    """Show a topology: SPEC is a preset name, a YAML path, or a grammar name such as 8x8-ib100."""
    t = load_topology(spec)
    write_json(t.to_dict(), json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title=f"{t.name}", caption=t.description, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in summary_rows(t):
        table.add_row(key, value)
    table.add_row("source", t.source)
    console.print(table)


# -- examples ------------------------------------------------------------------------------------------
@cli.command("examples")
def examples() -> None:
    """Print the folder of the README's examples (my_model.py, sweep.yaml, record_ddp.py, …).

    \b
    Copy it beside you to run the README's commands as written:
      cp -r "$(arcsim examples)" examples
    """
    click.echo(packaged("examples"))


# -- collectives ---------------------------------------------------------------------------------------
@cli.command()
@click.option("--topology", "-t", default=DEFAULT_TOPOLOGY, show_default=True, type=Reads("topology"),
              help=TOPOLOGY_HELP)
@click.option("--op", default="allreduce", show_default=True,
              help="allreduce, allgather, broadcast, reducescatter or alltoall.")
@click.option("--algo", type=click.Choice(ALGO_CHOICES), default="auto", show_default=True,
              help="Algorithm; 'auto': the library's own choice, 'all': every one the library offers.")
@library_option
@click.option("--chunks", type=Count(maximum=MAX_CHUNKS), default=None,
              help="Pieces a pipelined algorithm (tree all-reduce, chain broadcast) sends in; default: the library's.")
@click.option("--size", default="100MB", show_default=True,
              help="Bytes per rank; for all-gather the TOTAL output, as nccl-tests counts it (e.g. 100MB, 64MiB).")
@click.option("--engine", type=click.Choice([*ENGINES, "both"]), default="analytic", show_default=True)
@click.option("--compute", default="0s", show_default=True,
              help="Compute time before the collective; stragglers arrive slowdown × this (DES only).")
@click.option("--seed", default=0, show_default=True, type=Count(minimum=0), help="Seed for latency jitter (DES).")
@force_option
@json_option
def collective(topology: str, op: str, algo: str, library: str | None, chunks: int | None, size: str, engine: str,
               compute: str, seed: int, force: bool, json_out: str | None) -> None:
    """Price one collective on a topology with the closed form and/or the SimPy DES.

    \b
    Units: sizes in B/kB/MB/GB are decimal (MB = 10^6 B), KiB/MiB/GiB are binary
    (MiB = 2^20 B); rates in Gbps are 10^9 bit/s; durations in ns/us/ms/s.
    """
    topo_obj = load_topology(topology).with_overrides(library=library)
    nbytes = parse_size(size)
    if not 0 < nbytes <= MAX_MESSAGE_BYTES:
        raise ArcsimError(f"--size {size} is {'not positive' if nbytes <= 0 else 'beyond 1 PB'}; give the bytes one "
                          "rank sends, e.g. 100MB")
    engines = ENGINES if engine == "both" else (engine,)
    with allow_any(force), des_progress() as follow:
        results = price_collective(topo_obj, op, algo, nbytes, engines, parse_duration(compute), seed, follow,
                                   chunks)
    rows = [r.to_dict() for r in results]
    write_json(rows[0] if len(rows) == 1 else rows, json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title=f"{results[0].op} of {format_size(nbytes)} on {topo_obj.name} ({topo_obj.ranks} ranks), "
                        f"{topo_obj.library}")
    for col in ("algorithm", "protocol", "engine", "time", "algbw", "busbw", "steps", "notes"):
        table.add_column(col, justify="right" if col in ("time", "algbw", "busbw", "steps") else "left")
    best = min(r.time_s for r in results)
    for r in results:
        notes = [r.detail] if r.detail else []
        if r.auto:
            notes.append(f"chosen by {r.library}")
        if r.engine == "des":
            notes.append(f"{r.events:,} events" + (f", {r.simulated_ranks}/{r.ranks} ranks simulated (symmetry)"
                                                   if r.simulated_ranks < r.ranks else ""))
        style = "bold green" if r.time_s == best and len(results) > 1 else None
        table.add_row(r.algo, r.protocol or "-", r.engine, format_duration(r.time_s), format_rate(r.algbw_Bps),
                      format_rate(r.busbw_Bps), str(r.steps), "; ".join(notes), style=style)
    console.print(table)
    if "analytic" in engines and not topo_obj.is_homogeneous:
        console.print("[yellow]note:[/] the closed form ignores stragglers and jitter; the DES includes them.")


@cli.command()
@click.option("--compressor", "-c", default="arctopk", show_default=True,
              help=f"One of: {', '.join(COMPRESSORS)}.")
@click.option("--density", "-d", default=0.01, show_default=True, type=DENSITY,
              help="Fraction of elements kept, in (0, 1].")
@click.option("--memory", "-m", default=None,
              help=f"One of: {', '.join(MEMORIES)} (default: the compressor's, as arcsim run: ef14; none for "
                   "dense and fp16).")
@click.option("--seed", default=0, show_default=True, type=Count(minimum=0),
              help="Seed for data, projections and random indices.")
@click.option("--rank", type=Count(), default=None, help="PowerSGD rank, or ARC-Top-K sketch columns r (default 4).")
@click.option("--trace", default=None, type=Reads("trace"),
              help="A gradient trace (.npz), a known model's name (resnet50.npz: captured if missing), "
                   "or nothing for the shipped default.")
@click.option("--no-capture", is_flag=True, help="Stop instead of capturing a missing known-model trace.")
@click.option("--synthetic", type=click.Choice(SYNTHETIC_KINDS), default=None,
              help="Synthetic gradients instead of a trace (see docs/compressors.md).")
@click.option("--workers", "-w", default=8, show_default=True, type=Count(minimum=2), help="Synthetic: workers P.")
@click.option("--elements", "-n", default="1e6", show_default=True, type=Count(), help="Synthetic: elements d.")
@click.option("--steps", "-s", default=5, show_default=True, type=Count(), help="Synthetic: steps.")
@click.option("--shared", default=0.8, show_default=True, type=Number(minimum=0, maximum=1),
              help="correlated: share of energy common to workers.")
@click.option("--spread", default=1.5, show_default=True, type=Number(minimum=0, maximum=10),
              help="correlated: log-normal spread of block scales.")
@json_option
@scope_option
def compress(compressor: str, density: float, memory: str | None, seed: int, rank: int | None, trace: str | None,
             no_capture: bool, synthetic: str | None, workers: int, elements: int, steps: int, shared: float,
             spread: float, json_out: str | None, scope: str) -> None:
    """Run a compressor with error feedback on real tensors and measure every step."""
    from arcsim.catalog import check_compression, memory_for, options_for
    from arcsim.traces.synthetic import synthetic_steps

    check_compression((compressor,), memory, ArcsimError)
    if trace is not None and synthetic is not None:
        raise ArcsimError("give either --trace or --synthetic, not both")
    if synthetic is not None:  # its size checked before torch loads
        batches = synthetic_steps(synthetic, workers, elements, steps, seed, shared, spread)
    from arcsim.compressors.memory import Memory, make_memory
    from arcsim.compressors.registry import Compressor, make_compressor  # torch: imported by the commands that need it
    from arcsim.compressors.session import compress_steps
    from arcsim.run.streamed import compress_streamed
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    comp = make_compressor(compressor, density, seed=seed, rank=rank, **options_for(compressor, {"scope": scope}))
    memory = memory_for(compressor, memory)  # its default when not given; DGC and onebit keep their own (none)
    mem = make_memory(memory)
    if synthetic is not None:
        source = f"synthetic:{synthetic}"
        title_source = f"synthetic {synthetic} ({workers} workers × {elements:,} elements, seed {seed})"
    else:
        with step_progress("capture", unit="train step") as progress:
            path = resolve_trace(trace, allow_capture=not no_capture, announce=note, progress=progress)
        tr = open_trace(path)
        steps, workers, elements = tr.steps, tr.workers, tr.elements
        source = str(path)
        title_source = f"{path.name} ({tr.meta['model']}, {workers} workers × {elements:,} elements, {steps} steps)"

        def per_group(index: int) -> tuple[Compressor, Memory]:
            return (make_compressor(compressor, density, seed=seed + index, rank=rank,
                                    **options_for(compressor, {"scope": scope})), make_memory(memory))

    rows = []
    with progress_bar(steps, f"{compressor}/{memory}", "step") as bar:  # a trace: a group of layers at a time
        measured = (compress_steps(batches, comp, mem) if synthetic is not None else compress_streamed(tr, per_group))
        for metrics in measured:
            rows.append(metrics)
            bar.update()
    dense_bytes = 4 * elements
    write_json({"compressor": compressor, "memory": memory, "density_requested": density, "seed": seed,
                "options": options_for(compressor, {"scope": scope}), "source": source, "workers": workers,
                "elements": elements, "dense_bytes_per_rank": dense_bytes, "steps": [m.to_dict() for m in rows]},
               json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title=f"{compressor} + {memory} at density {density:g} on {title_source}")
    for col in ("step", "density", "agg density", "rel error", "update error", "energy", "top-k overlap",
                "bytes/rank", "vs dense", "collectives"):
        table.add_column(col, justify="left" if col == "collectives" else "right")
    for m in rows:
        ops = ", ".join(f"{c['op']}:{c['tag']}" for c in m.collectives)
        table.add_row(str(m.step), f"{m.density_achieved:.4g}", f"{m.density_aggregate:.4g}", f"{m.rel_error:.4f}",
                      f"{m.update_error:.4f}", f"{m.energy_captured:.4f}",
                      "-" if m.overlap_topk is None else f"{m.overlap_topk:.3f}",
                      format_size(m.bytes_per_rank), f"{m.bytes_per_rank / dense_bytes:.4f}",
                      ops + (" (dense first step)" if m.dense_step else ""))
    console.print(table)


cli.add_command(trace_group)
cli.add_command(device_group)
cli.add_command(run_command)
cli.add_command(shard_command)
cli.add_command(cluster_group)
cli.add_command(calibrate_command)
cli.add_command(validate_command)
cli.add_command(sweep_command)
cli.add_command(plot_command)
cli.add_command(train_command)
cli.add_command(cache_group)


def _quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        Verbosity.quiet = True


def accept_anywhere(group: click.Group) -> None:
    """``-q``/``--quiet`` and ``--debug`` after the command too (``arcsim run -q``), as before it (``arcsim -q run``):
    they had been 'No such option' there."""
    for command in group.commands.values():
        command.params += [
            click.Option(["--quiet", "-q"], is_flag=True, expose_value=False, callback=_quiet,
                         help="As arcsim -q: no progress bars or status notes."),
            click.Option(["--debug"], is_flag=True, expose_value=False,
                         help="As arcsim --debug: the full traceback on errors."),
        ]
        if isinstance(command, click.Group):
            accept_anywhere(command)


accept_anywhere(cli)
guard_commands(cli)  # every command checks its outputs against its inputs first (arcsim.cli.paths)


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    debug = "--debug" in sys.argv[1:]
    try:
        cli.main(standalone_mode=False)
    except ArcsimError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # `arcsim` or `arcsim trace` alone: the help, not an error
        click.echo(exc.format_message())
    except click.exceptions.ClickException as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as exc:  # a full disk or a read-only place met by a write no helper wrapped: still one line
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        if debug:
            traceback.print_exc()
        click.echo(f"error: {write_error(Path(exc.filename or 'a file'), exc)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
