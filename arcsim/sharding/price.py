"""One training iteration per strategy on a topology, from a model's shapes and the device model (no gradients):
DDP (``none``: arcsim run's own DDP step, run.scaling.dense_timeline), full sharding and hybrid sharding (the FSDP2
schedule on the strategy layer's timeline engine), each collective priced by arcsim.pricing.Pricer on its group's
links, with the cluster's effects.

Compute comes from arcsim's device model (arcsim.devices.predict): forward and backward of one step and the
time each parameter's gradient is ready. A unit's backward is the stretch of backward in which its
gradients become ready; its forward the same share of forward."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arcsim.devices.predict import ComputePrediction, predict_compute
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer
from arcsim.run.scaling import dense_timeline
from arcsim.strategy.memory import Memory, memory_per_gpu
from arcsim.strategy.schedule import DTYPE_BYTES, STRATEGIES, Quantize, check_fits, gathered_dtype
from arcsim.strategy.sharded import StrategyResult, price_plans, sharded_model
from arcsim.strategy.units import ShardUnit, zoo_shapes
from arcsim.topology import Topology

if TYPE_CHECKING:
    from arcsim.models.source import ModelSource


def _device_compute(pred: ComputePrediction) -> float:
    p = pred.profile
    return p.forward_s + p.backward_s + p.after_backward_s


def ddp_result(pred: ComputePrediction, pricer: Pricer, memory: Memory, grad_dtype: str = "fp32") -> StrategyResult:
    """DDP as arcsim run prices it (run.scaling.dense_timeline): torch's buckets (1 MiB first, 25 MiB after) in
    ready order, each all-reduced over every rank once ready, one at a time, with the cluster's effects."""
    topo = pricer.topo
    grad_bytes = int(DTYPE_BYTES[grad_dtype])
    tl, buckets = dense_timeline(pred.profile, topo, grad_bytes=grad_bytes, engine=pricer.engine, gpu=pred.device)
    cross = sum(2.0 * b.numel * grad_bytes / topo.gpus_per_node * (topo.nodes - 1) / topo.nodes for b in buckets)
    detail = [{"op": "allreduce", "group": "world", "bytes": b.numel * grad_bytes, "ready_s": b.ready_s,
               "time_s": e - s, "start_s": s, "end_s": e}
              for b, s, e in zip(buckets, tl.comm_start, tl.comm_end, strict=True)]
    device = _device_compute(pred)
    return StrategyResult("none", "none", tl.iteration_s, device, tl.comm_s, tl.exposed_comm_s, cross,
                          len(buckets), memory, detail, max(0.0, round(tl.compute_s - device, 12)))


@dataclass(frozen=True)
class Input:
    """What one GPU's batch holds per example, as the compute was priced: a built-in dataset's (its shape; a
    token dataset's is the sequence length) or the user's own batches (--data, their shape their own)."""

    dataset: str | None
    data: str | None
    kind: str | None            # tokens, image, vector; None for the user's batches
    shape: tuple[int, ...]

    @property
    def seq_len(self) -> int | None:
        return self.shape[0] if self.kind == "tokens" and self.shape else None

    def describe(self) -> str:
        """In words, for a table: 'sequence length 64 (python-text)', 'image 3×224×224 (synthetic-images)'."""
        if self.data is not None:
            return f"your batches ({self.data})"
        what = (f"sequence length {self.seq_len}" if self.seq_len is not None else
                f"{self.kind} {'×'.join(str(n) for n in self.shape)}")
        return f"{what} ({self.dataset})"

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "data": self.data, "kind": self.kind, "shape": list(self.shape),
                "seq_len": self.seq_len}


def priced_input(pred: ComputePrediction, dataset: str | None, data: str | None,
                 input_size: int | None) -> Input:
    """The input ``pred`` was priced on: the dataset's kind, the shape the profile records (else the dataset's)."""
    from arcsim.models.datasets import data_spec

    if dataset is None:
        return Input(None, data, None, ())
    spec = data_spec(dataset, input_size)
    shape = pred.profile.extra.get("input_shape") or spec.shape
    return Input(dataset, None, spec.kind, tuple(int(n) for n in shape))


@dataclass(frozen=True)
class ShardStudy:
    model: str
    topology: str
    gpu: str
    batch: int
    precision: str
    params: int
    units: int
    root_params: int
    compute: ComputePrediction
    results: list[StrategyResult]
    input: Input | None = None

    def to_dict(self, detail: bool = False) -> dict:
        return {"model": self.model, "topology": self.topology, "gpu": self.gpu, "batch": self.batch,
                "precision": self.precision, "input": self.input.to_dict() if self.input else None,
                "params": self.params, "units": self.units,
                "root_params": self.root_params, "compute_source": self.compute.source,
                "forward_s": self.compute.profile.forward_s, "backward_s": self.compute.profile.backward_s,
                "results": [r.to_dict(detail) for r in self.results]}


def study(model: str | ModelSource, topo: Topology, gpu: str | None, batch: int, precision: str,
          strategies: Sequence[str], variants: Sequence[Quantize], reshard_after_forward: bool | int | None = None,
          engine: str = "analytic", activations_bytes: float = 0.0, wrap: str = "auto", reduce_dtype: str = "fp32",
          dataset: str | None = None, data: str | None = None, input_size: int | None = None) -> ShardStudy:
    """Every strategy asked for (sharded ones once per quantisation variant) for ``model`` (a zoo name or any
    model source, fed ``dataset`` at ``input_size`` or the user's ``data``, as arcsim device predict) on ``topo``.
    Mixed precision as torchtitan runs it: parameters gathered in 16 bits under ``precision`` bf16 or fp16 (else fp32),
    gradients reduced in ``reduce_dtype`` (fp32 by default; DDP's too)."""
    if reduce_dtype not in ("fp32", "bf16"):
        raise ArcsimError(f"--reduce-dtype is fp32 or bf16, not {reduce_dtype!r}")
    from arcsim.devices.catalog import device, priced_gpu

    for s in strategies:
        if s not in STRATEGIES:
            raise ArcsimError(f"unknown sharding {s!r}; choose among {', '.join(STRATEGIES)}")
    if topo.ranks < 2:
        raise ArcsimError(f"{topo.name} has one rank: data parallelism needs at least 2")
    for s, q in itertools.product(strategies, variants):
        check_fits(s, q, topo.gpus_per_node, topo.nodes, topo.name)
    gpu = priced_gpu(gpu, topo.gpu)
    if gpu is None:
        raise ArcsimError(f"{topo.name} names no GPU: give --gpu (arcsim device list)")
    from arcsim.models.source import as_source

    source = as_source(model)
    source.check()  # an unknown model or a factory not found: one line, before anything is counted
    fed = source.dataset_for(dataset, data, input_size)  # one line for a missing dataset, before any counting
    pred = predict_compute(source, gpu, batch, precision, dataset=dataset, data=data, input_size=input_size)
    profile = pred.profile
    sharded = sharded_model(zoo_shapes(source, fed, input_size), [(la.name, la.ready_s) for la in profile.layers],
                            profile.forward_s, profile.backward_s, wrap)
    units, root = list(sharded.units), sharded.root
    param_dtype = gathered_dtype(precision)
    capacity = device(gpu).capacity_bytes
    pricer = Pricer(topo, engine)
    results = []
    for s in strategies:
        if s == "none":
            mem = memory_per_gpu(s, units, root, topo.ranks, topo.gpus_per_node, capacity, param_dtype, reduce_dtype,
                                 activations_bytes)
            results.append(ddp_result(pred, pricer, mem, reduce_dtype))
            continue
        results += [p.result for p in price_plans(sharded, [(s, q, reduce_dtype) for q in variants], pricer, capacity,
                                                  param_dtype, _device_compute(pred), pred.profile.after_backward_s,
                                                  pred.device, activations_bytes, reshard_after_forward)]
    return ShardStudy(pred.profile.model, topo.name, gpu, batch, precision, sharded.params,
                      len(units), root.numel, pred, results, priced_input(pred, fed, data, input_size))


__all__ = ["Input", "ShardStudy", "ShardUnit", "StrategyResult", "study"]
