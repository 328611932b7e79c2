"""`arcsim device list | show | predict`: the GPU catalogue and what a step costs on each."""

from __future__ import annotations

import click
from rich.table import Table

from arcsim.catalog import model_ref_problem
from arcsim.cli.common import (
    Count,
    console,
    json_option,
    model_options,
    tables_wanted,
    write_json,
)
from arcsim.devices.catalog import PRECISIONS, device, devices, modelled_device
from arcsim.errors import ArcsimError
from arcsim.units import format_duration


@click.group("device")
def device_group() -> None:
    """GPUs arcsim can price a cluster's compute and compression on (devices/*.yaml)."""


@device_group.command("list")
@json_option
def device_list(json_out: str | None) -> None:
    """Every device in the catalogue with its datasheet figures."""
    rows = [d.to_dict() for d in devices().values()]
    write_json(rows, json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title="Devices (dense peaks, without sparsity)", caption="arcsim device show NAME: sources")
    for col in ("name", "device", "fp32", "tf32", "bf16", "fp16", "memory", "launch"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right", no_wrap=col == "name")
    for d in devices().values():
        peaks = [f"{d.peak_tflops[k]:g} TF" if k in d.peak_tflops else "–" for k in ("fp32", "tf32", "bf16", "fp16")]
        table.add_row(d.name, d.full_name, *peaks,
                      f"{d.memory_bandwidth_GBps / 1e3:g} TB/s" if d.modelled else "–",
                      f"{d.launch_us:g} µs" if d.modelled else "–")
    console.print(table)


@device_group.command("show")
@click.argument("name")
@json_option
def device_show(name: str, json_out: str | None) -> None:
    """One device: every figure and where it comes from."""
    d = device(name)
    write_json(d.to_dict(), json_out)
    if not tables_wanted(json_out):
        return
    table = Table(title=d.full_name, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in d.to_dict().items():
        table.add_row(k, ", ".join(f"{p} {t:g} TFLOP/s" for p, t in v.items()) if isinstance(v, dict) else str(v))
    console.print(table)


@device_group.command("predict")
@model_options
@click.option("--gpu", required=True, help="A catalogue device (arcsim device list).")
@click.option("--batch", "-b", default=32, show_default=True, type=Count(), help="Batch per GPU.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
              help="fp32 (TF32 convolutions, as PyTorch's defaults), or bf16 or fp16 autocast (V100: fp16 only).")
@click.option("--modelled", is_flag=True, help="Use the model even where a measured profile matches.")
@json_option
def device_predict(model: str, model_args: tuple[str, ...], data: str | None, dataset: str | None,
                   input_size: int | None, gpu: str, batch: int, precision: str, modelled: bool,
                   json_out: str | None) -> None:
    """Forward, backward and per-parameter gradient-ready times of one training step on one GPU."""
    modelled_device(gpu, precision, batch)  # these, and a zoo name, answered before torch loads
    problem = model_ref_problem(model, bool(model_args))
    if problem:
        raise ArcsimError(problem)
    from arcsim.devices.predict import predict_compute
    from arcsim.models.source import model_source

    pred = predict_compute(model_source(model, model_args), gpu, batch, precision, modelled, dataset, data,
                           input_size)
    write_json(pred.to_dict(), json_out)
    if not tables_wanted(json_out):
        return
    p = pred.profile
    console.print(f"[bold]{p.model}[/] ({sum(la.numel for la in p.layers):,} parameters), batch {batch} per GPU, "
                  f"{precision}, on {pred.device.full_name}: forward {format_duration(p.forward_s)}, backward "
                  f"{format_duration(p.backward_s)}, {len(p.layers)} parameter tensors")
    console.print(f"  source: {pred.source} — {pred.detail}")
