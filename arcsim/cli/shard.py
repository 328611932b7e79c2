"""`arcsim shard`: DDP, full sharding (FSDP / ZeRO-3) and hybrid sharding (HSDP), with and without ZeRO++'s
quantised collectives, priced for a model on a topology (docs/sharding.md)."""

from __future__ import annotations

import dataclasses

import click
from click.core import ParameterSource
from rich.table import Table

from arcsim.cli.common import (
    TOPOLOGY_HELP,
    Count,
    console,
    json_option,
    library_option,
    model_options,
    note,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import Reads
from arcsim.devices.catalog import PRECISIONS
from arcsim.errors import ArcsimError
from arcsim.netsim import ENGINES
from arcsim.strategy.schedule import STRATEGIES, VARIANT_HELP, Quantize
from arcsim.topology import DEFAULT_TOPOLOGY
from arcsim.units import format_duration, format_size

RESHARD = {"auto": None, "true": True, "false": False}


def _count(params: int) -> str:
    """A parameter count in words: 1.24 B, 30.5 M."""
    return f"{params / 1e9:.3g} B" if params >= 1e9 else f"{params / 1e6:.3g} M"


def _names(value: str, option: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise ArcsimError(f"{option} takes comma-separated names; got {value!r}")
    if len(set(names)) != len(names):
        raise ArcsimError(f"{option} names one twice in {value!r}; give each once")
    return names


def _what_one_gpu_nodes_can_do(strategies: list[str], variants: list[Quantize],
                                gpus_per_node: int) -> tuple[list[str], list[Quantize], list[str]]:
    """On nodes of one GPU the defaults drop what shards inside a node (HSDP, hpZ), and say so (the notes, printed
    once the study has run: a refusal stays one line); what the user asked for stays, for the pricing's own
    one-line refusal."""
    notes: list[str] = []
    if gpus_per_node > 1:
        return strategies, variants, notes
    ctx = click.get_current_context()
    if ctx.get_parameter_source("sharding") is ParameterSource.DEFAULT and "hybrid" in strategies:
        strategies = [s for s in strategies if s != "hybrid"]
        notes.append("one GPU per node: no HSDP (it shards inside the node); ask for --sharding hybrid to be told why")
    if ctx.get_parameter_source("quantize") is ParameterSource.DEFAULT and any(v.hpz for v in variants):
        variants = list(dict.fromkeys(dataclasses.replace(v, hpz=False) for v in variants))
        notes.append("one GPU per node: ZeRO++ without hpZ (its secondary shard lives inside the node)")
    return strategies, variants, notes


@click.command("shard")
@model_options
@click.option("--topology", "-t", default=DEFAULT_TOPOLOGY, show_default=True, type=Reads("topology"),
              help=TOPOLOGY_HELP)
@library_option
@click.option("--gpu", default=None, help="A catalogue device (arcsim device list); default: the topology's.")
@click.option("--batch", "-b", default=8, show_default=True, type=Count(), help="Batch per GPU.")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default="fp32", show_default=True,
              help="fp32, or bf16 or fp16 autocast (parameters gathered in 16 bits, as FSDP2's MixedPrecisionPolicy).")
@click.option("--reduce-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="The dtype gradients are reduced in (DDP's all-reduce too).")
@click.option("--sharding", default="none,full,hybrid", show_default=True,
              help=f"Comma list of strategies: {', '.join(STRATEGIES)} (DDP; FSDP/ZeRO-3; HSDP: shard in the "
                   "node, replicate across nodes).")
@click.option("--quantize", default="none,zeropp", show_default=True,
              help=f"Comma list of variants for the sharded strategies: {VARIANT_HELP}.")
@click.option("--reshard-after-forward", type=click.Choice(list(RESHARD)), default="auto", show_default=True,
              help="FSDP2's reshard_after_forward for every unit and the root (auto: its default, the root kept).")
@click.option("--activations", default="0B", show_default=True,
              help="Activation memory per GPU to add (e.g. 12GB); arcsim does not estimate it.")
@click.option("--engine", type=click.Choice(ENGINES), default="analytic", show_default=True)
@click.option("--trace", default=None, type=Reads("trace"),
              help="Gradient trace (.npz) the quantised reduce-scatters' error is measured on (default: shipped).")
@click.option("--detail", is_flag=True, help="Put every collective (size, group, start, end) into the JSON.")
@json_option
def shard(model: str, model_args: tuple[str, ...], data: str | None, dataset: str | None, input_size: int | None,
          topology: str, library: str | None, gpu: str | None, batch: int, precision: str,
          reduce_dtype: str, sharding: str, quantize: str, reshard_after_forward: str, activations: str, engine: str,
          trace: str | None, detail: bool, json_out: str | None) -> None:
    """Iteration time, exposed communication, bytes per GPU across nodes and memory per GPU of DDP, FSDP and
    HSDP, with ZeRO++'s quantised collectives where asked."""
    from arcsim.compressors.sharded import ReductionError
    from arcsim.models.source import model_source
    from arcsim.sharding.price import study
    from arcsim.sharding.quant import trace_errors
    from arcsim.strategy.schedule import quantize_variant
    from arcsim.topology import load_topology
    from arcsim.units import parse_size

    strategies = _names(sharding, "--sharding")
    for s in strategies:
        if s not in STRATEGIES:
            raise ArcsimError(f"unknown --sharding {s!r}; choose among {', '.join(STRATEGIES)}")
    variants = [quantize_variant(v) for v in _names(quantize, "--quantize")]
    try:
        act = parse_size(activations)
    except ArcsimError as exc:
        raise ArcsimError(f"--activations: {exc}") from None
    if act < 0:
        raise ArcsimError(f"--activations {activations} is negative; give bytes per GPU, e.g. 12GB")
    topo = load_topology(topology).with_overrides(library=library)
    strategies, variants, left_out = _what_one_gpu_nodes_can_do(strategies, variants, topo.gpus_per_node)
    result = study(model_source(model, model_args), topo, gpu, batch, precision, strategies, variants,
                   RESHARD[reshard_after_forward], engine, act, reduce_dtype=reduce_dtype, dataset=dataset, data=data,
                   input_size=input_size)
    for line in left_out:
        note(line)
    grads_quantised = any(v.grads != "none" for v in variants) and any(s != "none" for s in strategies)
    errors: list[ReductionError] = []
    source = None
    if grads_quantised:
        source, errors = trace_errors(trace)
    out = result.to_dict(detail)
    out["reduction_error"] = {"trace": source, "errors": [e.to_dict() for e in errors]} if errors else None
    write_json(out, json_out)
    if not tables_wanted(json_out):
        return
    mem_cap = result.results[0].memory.capacity_bytes
    table = Table(title=f"{result.model} ({_count(result.params)} parameters, {result.units} units + root) on "
                        f"{topo.name} ({topo.ranks} GPUs, {result.gpu}), batch {batch} per GPU, {precision}"
                        + (f", {result.input.describe()}" if result.input else ""),
                  caption=f"compute {format_duration(result.compute.profile.forward_s)} forward + "
                          f"{format_duration(result.compute.profile.backward_s)} backward ({result.compute.source}); "
                          f"memory: fp32 parameters, gradients and Adam, + working copies"
                          + (f" + {format_size(act)} activations" if act else ", activations not counted")
                          + f"; GPU holds {format_size(mem_cap)}")
    for col in ("strategy", "quantised", "iteration", "exposed comm", "comm", "across nodes / GPU", "memory / GPU"):
        table.add_column(col, justify="left" if col in ("strategy", "quantised") else "right")
    best = min(r.iteration_s for r in result.results)
    name = {"none": "DDP", "full": "FSDP (full)", "hybrid": "HSDP (hybrid)"}
    for r in result.results:
        mem = format_size(r.memory.total_bytes) + ("" if r.memory.fits else " [red]does not fit[/]")
        table.add_row(name[r.strategy], r.quantize, format_duration(r.iteration_s), format_duration(r.exposed_comm_s),
                      format_duration(r.comm_s), format_size(r.cross_node_bytes_per_gpu), mem,
                      style="bold green" if r.iteration_s == best and len(result.results) > 1 else None)
    console.print(table)
    if errors:
        note(f"quantised reduce-scatter error ‖agg − mean‖²/‖mean‖² on {source} ({errors[0].workers} workers, "
             f"{errors[0].gpus_per_node} per node, {errors[0].steps} steps): "
             + ", ".join(f"{e.how} {e.rel_error_mean:.2e}" for e in errors))
    if not all(r.memory.fits for r in result.results):
        note("a strategy marked 'does not fit' needs more than the GPU's memory: shard more, or add GPUs")
