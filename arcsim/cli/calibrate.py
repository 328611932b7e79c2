"""`arcsim calibrate`: microbenchmark the collectives, fit them, write a topology file; or fit a topology's network on
the cluster's own nccl-tests logs (--nccl-tests)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from arcsim.cli.cluster import prefix_option
from arcsim.cli.common import (
    TOPOLOGY_HELP,
    Count,
    SizeGrid,
    console,
    given_options,
    json_option,
    note,
    step_progress,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath, Reads
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.processes import refuse_stray_rank, torchrun_world
from arcsim.units import parse_size

if TYPE_CHECKING:
    from arcsim.testbed.nccl_fit import Calibration
    from arcsim.topology import Topology


MEASURING = ("cluster", "loopback", "ranks", "bandwidth", "delay", "burst", "sizes", "ranks_per_node", "repeats",
             "prefix")


@click.command("calibrate")
@click.argument("logs", nargs=-1, type=InputPath(), metavar="[LOG]...")
@click.option("--nccl-tests", "nccl_tests", is_flag=True,
              help="Measure nothing: read the nccl-tests output in LOG... (all_reduce_perf, all_gather_perf, "
                   "reduce_scatter_perf, broadcast_perf; one run per file) and fit the network of --topology to it.")
@click.option("--topology", "-t", default=None, type=Reads("topology"),
              help=f"With --nccl-tests: the topology the logs ran on, whose network is fitted. {TOPOLOGY_HELP}")
@click.option("--cluster", type=click.Choice(["emulated"]), default=None,
              help="Build an emulated cluster (root) and measure inside it.")
@click.option("--loopback", is_flag=True, help="Measure ranks on this machine's loopback.")
@click.option("--ranks", "-p", type=Count(), default=None, help="Ranks to launch (not under torchrun).")
@click.option("--bandwidth", "-b", default=None, help="Emulated cluster link rate, e.g. 1Gbit.")
@click.option("--delay", default="0s", show_default=True, help="Emulated cluster one-way delay, e.g. 0.5ms.")
@click.option("--burst", default=None, help="Emulated cluster tbf burst, e.g. 16kB (default: 2 packets or 1 ms of "
                                           "tokens, the larger).")
@click.option("--sizes", default=None, type=SizeGrid(),
              help="Per-rank sizes, e.g. 4KB,64KB,1MB (default 1 KiB … 4 MiB, ×4); fits are against the size as "
                   "nccl-tests counts it (all-gather: the total output, size × ranks).")
@click.option("--ranks-per-node", type=Count(), default="1", show_default=True,
              help="Ranks per node (numbered node by node): also measure inside a node and along the rails between "
                   "nodes, for node-aware compression. Under torchrun: its --nproc_per_node.")
@click.option("--repeats", default="5", show_default=True, type=Count(), help="Timed repeats per size (median).")
@prefix_option
@click.option("--out", "-o", required=True, type=OutputPath(companions=(".samples.csv",)),
              help="Topology YAML to write (and its samples beside it, as .samples.csv).")
@json_option
def calibrate(logs: tuple[str, ...], nccl_tests: bool, topology: str | None, cluster: str | None, loopback: bool,
              ranks: int | None, bandwidth: str | None, delay: str, burst: str | None, sizes: tuple[int, ...] | None,
              ranks_per_node: int, repeats: int, prefix: str, out: str, json_out: str | None) -> None:
    """Measure all_reduce, all_gather and broadcast over sizes; fit α and bandwidth per collective.

    \b
    Or fit a cluster's network on its own nccl-tests output:
      arcsim calibrate --nccl-tests all_reduce.log all_gather.log --topology 2x8-ib400x8-h100 -o mine.yaml
    """
    path = Path(out)
    if path.suffix not in (".yaml", ".yml"):
        raise ArcsimError(f"--out {out}: a topology file ends in .yaml")
    if nccl_tests or logs or topology:
        _check_nccl_tests_request(logs, nccl_tests, topology)
        from_nccl_tests(logs, topology or "", path, json_out)
        return
    if given_options("prefix") and cluster is None:
        raise ArcsimError("--prefix names the emulated cluster's namespaces (--cluster emulated); "
                          f"{'--loopback' if loopback else 'a run under torchrun'} builds none: drop it")
    if cluster or loopback:
        refuse_stray_rank("arcsim calibrate --loopback / --cluster")
    world = None if cluster or loopback else torchrun_world()
    if world is None:  # (every refusal before the fitting's imports: scipy's 0.3 s)
        from arcsim.topology import splits_into_nodes

        if bool(cluster) == loopback:
            raise ArcsimError("say where to measure: --loopback, --cluster emulated, or run under torchrun")
        if ranks is None or ranks < 2:
            raise ArcsimError("--ranks must be at least 2")
        if ranks_per_node > 1 and not splits_into_nodes(ranks, ranks_per_node):
            raise ArcsimError(f"--ranks-per-node {ranks_per_node} must divide --ranks {ranks} into two or more nodes "
                              f"(e.g. --ranks 4 --ranks-per-node 2)")
    from arcsim.testbed.calibrate import (
        DEFAULT_SIZES,
        describe,
        fits_from,
        group_fits,
        measure_in_job,
        run_microbench,
        samples_text,
        topology_text,
        write_topology,
    )

    size_list = sizes or DEFAULT_SIZES
    if world is not None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        ranks_per_node = local if 1 < local < world and world % local == 0 else 1  # one node: no groups between
        how = "under torchrun"
        measured = measure_in_job(size_list, repeats, ranks_per_node)
        if measured is None:
            return  # not rank 0
    else:
        assert ranks is not None
        where = "loopback" if loopback else "emulated"
        how = (f"{where}, {ranks} ranks" + (f" as nodes of {ranks_per_node}" if ranks_per_node > 1 else "")
               + (f", {bandwidth} per {'rank' if ranks_per_node == 1 else 'node'}" if bandwidth else "")
               + (f", {delay} one way" if delay not in ("0", "0s") else ""))
        note(f"measuring all_reduce, all_gather and broadcast on {how} over {len(size_list)} sizes"
             + (" (and inside nodes and along rails)" if ranks_per_node > 1 else "") + " …")
        measured = run_microbench(ranks, where, bandwidth, size_list, repeats, delay=delay,
                                  burst=parse_size(burst) if burst else None, announce=note,
                                  ranks_per_node=ranks_per_node, prefix=prefix)
    fits, groups = fits_from(measured, measured["world"]), group_fits(measured)
    for fit in [*fits.values(), *(f for by_op in groups.values() for f in by_op.values())]:
        note(describe(fit))
        for warning in fit.warnings():
            note(f"warning: {warning}")
    write_topology(path, topology_text(path.stem, measured["world"], fits, how, ranks_per_node, groups))
    samples = path.with_suffix(".samples.csv")
    write_atomic(samples, samples_text(fits))
    note(f"wrote {path} (raw medians in {samples})")
    write_json({"topology": str(path), "ranks": measured["world"], "how": how, "measured": measured,
                "fits": {op: vars(fit) for op, fit in fits.items()},
                "group_fits": {g: {op: vars(fit) for op, fit in by_op.items()} for g, by_op in groups.items()}},
               json_out)


def _check_nccl_tests_request(logs: tuple[str, ...], nccl_tests: bool, topology: str | None) -> None:
    """--nccl-tests, its logs and its --topology come together, and with nothing that measures."""
    if not nccl_tests:
        raise ArcsimError("LOG files and --topology are read with --nccl-tests (arcsim calibrate --nccl-tests LOG... "
                          "--topology BASE -o mine.yaml)")
    if not logs:
        raise ArcsimError("--nccl-tests needs the logs to read: arcsim calibrate --nccl-tests LOG... --topology BASE "
                          "-o mine.yaml")
    twice = [log for log in dict.fromkeys(logs) if sum(os.path.realpath(o) == os.path.realpath(log) for o in logs) > 1]
    if twice:
        raise ArcsimError(f"{twice[0]} is given twice; give each log once (a run counted twice weighs twice)")
    if topology is None:
        raise ArcsimError("--nccl-tests needs --topology: the topology the logs ran on (a preset, a name such as "
                          "2x8-ib400x8-h100, an instance such as 2xp5, or a YAML file), whose network it fits")
    given = given_options(*MEASURING)
    if given:
        raise ArcsimError(f"--nccl-tests reads logs and measures nothing: drop {', '.join(given)}")


def from_nccl_tests(logs: tuple[str, ...], topology: str, path: Path, json_out: str | None) -> None:
    """Read the logs, check them against the topology, fit its network, report per size band, write the topology."""
    from arcsim.testbed.calibrate import write_topology
    from arcsim.testbed.nccl_fit import calibrate as fit_network
    from arcsim.testbed.nccl_fit import calibrated_topology, check_base, describe
    from arcsim.testbed.nccl_tests import read_log
    from arcsim.topology import load_topology, topology_yaml

    read = [read_log(Path(log)) for log in logs]
    base = load_topology(topology)
    warnings = check_base(base, read)
    for log in read:
        note(f"read {describe(log)}")
    for warning in warnings:
        note(f"warning: {warning}")
    with step_progress("fitting (each size held out in turn)", "fit") as progress:
        result = fit_network(base, read, progress)
    samples = path.with_suffix(".samples.csv")
    header = (f"Written by arcsim calibrate --nccl-tests {' '.join(logs)} --topology {topology}\n"
              f"(docs/calibration.md, 'From nccl-tests logs'; every size, measured and priced: {samples.name})")
    write_topology(path, topology_yaml(calibrated_topology(base, result, path.stem), header))
    write_atomic(samples, result.samples_csv())
    note(f"wrote {path} (every size, measured and priced, in {samples})")
    notes = [f"{log.path}: {n}" for log in read for n in log.notes] + result.notes()
    write_json({"topology": str(path), "base": base.name, "logs": [dataclasses.asdict(log) for log in read],
                **result.to_dict(), "notes": notes, "warnings": warnings}, json_out)
    if tables_wanted(json_out):
        console.print(bands_table(result, base))
        for line in notes:
            console.print(f"[yellow]note:[/] {line}")


def bands_table(result: Calibration, base: Topology) -> Table:
    """Per size band: the MAPE of the topology alone, of the fit on every fitted size, and held out."""
    c = result.constants
    fitted = "nothing fitted" if c is None else \
        f"network efficiency {c.efficiency:.3f}, {c.crossing_us:g} µs per network crossing"
    table = Table(title=f"{base.name} from nccl-tests: {fitted} (MAPE of the out-of-place times)")
    for col in ("size band", "sizes", f"{base.name} alone", "fitted (every size)", "held out (each size without it)"):
        table.add_column(col, justify="left" if col == "size band" else "right")
    for name, b in result.bands().items():
        table.add_row(name, str(int(b["sizes"])), *(f"{b[k]:.1f} %" for k in ("base", "fit", "held_out")))
    return table
