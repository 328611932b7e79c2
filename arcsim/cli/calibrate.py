"""`arcsim calibrate`: microbenchmark the collectives, fit them, write a topology file."""

from __future__ import annotations

import os
from pathlib import Path

import click

from arcsim.cli.common import Count, json_option, note, write_json
from arcsim.cli.paths import OutputPath
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.processes import refuse_stray_rank, torchrun_world
from arcsim.units import parse_size


@click.command("calibrate")
@click.option("--cluster", type=click.Choice(["emulated"]), default=None,
              help="Build an emulated cluster (root) and measure inside it.")
@click.option("--loopback", is_flag=True, help="Measure ranks on this machine's loopback.")
@click.option("--ranks", "-p", type=Count(), default=None, help="Ranks to launch (not under torchrun).")
@click.option("--bandwidth", "-b", default=None, help="Emulated cluster link rate, e.g. 1Gbit.")
@click.option("--delay", default="0s", show_default=True, help="Emulated cluster one-way delay, e.g. 0.5ms.")
@click.option("--burst", default=None, help="Emulated cluster tbf burst, e.g. 16kB (default: 2 packets or 1 ms of "
                                           "tokens, the larger).")
@click.option("--sizes", default=None,
              help="Per-rank sizes, e.g. 4KB,64KB,1MB (default 1 KiB … 4 MiB, ×4); fits are against the size as "
                   "nccl-tests counts it (all-gather: the total output, size × ranks).")
@click.option("--ranks-per-node", type=Count(), default="1", show_default=True,
              help="Ranks per node (numbered node by node): also measure inside a node and along the rails between "
                   "nodes, for node-aware compression. Under torchrun: its --nproc_per_node.")
@click.option("--repeats", default="5", show_default=True, type=Count(), help="Timed repeats per size (median).")
@click.option("--out", "-o", required=True, type=OutputPath(companions=(".samples.csv",)),
              help="Topology YAML to write (and its samples beside it, as .samples.csv).")
@json_option
def calibrate(cluster: str | None, loopback: bool, ranks: int | None, bandwidth: str | None, delay: str,
              burst: str | None, sizes: str | None, ranks_per_node: int, repeats: int, out: str,
              json_out: str | None) -> None:
    """Measure all_reduce, all_gather and broadcast over sizes; fit α and bandwidth per collective."""
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
    from arcsim.topology import splits_into_nodes

    path = Path(out)
    if path.suffix not in (".yaml", ".yml"):
        raise ArcsimError(f"--out {out}: a topology file ends in .yaml")
    size_list = DEFAULT_SIZES if sizes is None else tuple(int(parse_size(s)) for s in sizes.split(","))
    if len(set(size_list)) < 2:
        raise ArcsimError("--sizes needs at least two different sizes")
    if cluster or loopback:
        refuse_stray_rank("arcsim calibrate --loopback / --cluster")
    world = None if cluster or loopback else torchrun_world()
    if world is not None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        ranks_per_node = local if 1 < local < world and world % local == 0 else 1  # one node: no groups between
        how = "under torchrun"
        measured = measure_in_job(size_list, repeats, ranks_per_node)
        if measured is None:
            return  # not rank 0
    else:
        if bool(cluster) == loopback:
            raise ArcsimError("say where to measure: --loopback, --cluster emulated, or run under torchrun")
        if ranks is None or ranks < 2:
            raise ArcsimError("--ranks must be at least 2")
        if ranks_per_node > 1 and not splits_into_nodes(ranks, ranks_per_node):
            raise ArcsimError(f"--ranks-per-node {ranks_per_node} must divide --ranks {ranks} into two or more nodes "
                              f"(e.g. --ranks 4 --ranks-per-node 2)")
        where = "loopback" if loopback else "emulated"
        how = (f"{where}, {ranks} ranks" + (f" as nodes of {ranks_per_node}" if ranks_per_node > 1 else "")
               + (f", {bandwidth} per {'rank' if ranks_per_node == 1 else 'node'}" if bandwidth else "")
               + (f", {delay} one way" if delay not in ("0", "0s") else ""))
        note(f"measuring all_reduce, all_gather and broadcast on {how} over {len(size_list)} sizes"
             + (" (and inside nodes and along rails)" if ranks_per_node > 1 else "") + " …")
        measured = run_microbench(ranks, where, bandwidth, size_list, repeats, delay=delay,
                                  burst=parse_size(burst) if burst else None, announce=note,
                                  ranks_per_node=ranks_per_node)
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
