"""One training iteration per strategy on a topology: DDP (``none``: bucketed all-reduces overlapping
backward, as arcsim run prices it), full sharding and hybrid sharding (the FSDP2 schedule on a two-stream
timeline), each collective priced by arcsim.pricing.Pricer on its group's links.

Compute comes from arcsim's device model (arcsim.devices.predict): forward and backward of one step and the
time each parameter's gradient is ready. A unit's backward is the stretch of backward in which its
gradients become ready; its forward the same share of forward."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from arcsim.catalog import DDP_BUCKET_MB
from arcsim.devices.predict import ComputePrediction, predict_compute
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer
from arcsim.run.timeline import iteration
from arcsim.sharding.memory import Memory, memory_per_gpu
from arcsim.sharding.schedule import (
    DTYPE_BYTES,
    STRATEGIES,
    Quantize,
    ShardCollective,
    check_fits,
    cross_node_bytes,
    fsdp_schedule,
)
from arcsim.sharding.timeline import two_stream
from arcsim.sharding.units import ROOT, ShardUnit, assign, group_units, zoo_shapes
from arcsim.topology import Topology

if TYPE_CHECKING:
    from arcsim.models.source import ModelSource

DDP_BUCKET_BYTES = int(DDP_BUCKET_MB * 2**20)  # DDP's bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 2**20     # DDP's first bucket (the last gradients of backward)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    quantize: str
    iteration_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    cross_node_bytes_per_gpu: float
    collectives: int
    memory: Memory
    detail: list[dict] = field(default_factory=list)

    def to_dict(self, detail: bool = False) -> dict:
        out = {"strategy": self.strategy, "quantize": self.quantize, "iteration_s": self.iteration_s,
               "compute_s": self.compute_s, "comm_s": self.comm_s, "exposed_comm_s": self.exposed_comm_s,
               "cross_node_bytes_per_gpu": self.cross_node_bytes_per_gpu, "collectives": self.collectives,
               "memory": self.memory.to_dict()}
        if detail:
            out["schedule"] = self.detail
        return out


def unit_compute(pred: ComputePrediction, units: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each unit's forward and backward seconds: the backward stretch up to each gradient's ready time is
    the unit's of that gradient (what follows the last one, the last one's); forward in the same shares."""
    p = pred.profile
    layers = sorted(p.layers, key=lambda la: la.ready_s)
    bwd: dict[str, float] = {}
    last, unit = 0.0, ROOT
    for la in layers:
        unit = units.get(la.name, ROOT)
        bwd[unit] = bwd.get(unit, 0.0) + max(la.ready_s - last, 0.0)
        last = max(last, la.ready_s)
    bwd[unit] = bwd.get(unit, 0.0) + max(p.backward_s - last, 0.0)
    total = sum(bwd.values()) or 1.0
    fwd = {u: p.forward_s * s / total for u, s in bwd.items()}
    return fwd, bwd


def ddp_result(pred: ComputePrediction, pricer: Pricer, memory: Memory, grad_dtype: str = "fp32") -> StrategyResult:
    """DDP: gradients in buckets (1 MiB first, 25 MiB after) in ready order, each all-reduced over every rank
    once ready, one at a time."""
    topo = pricer.topo
    p = pred.profile
    buckets: list[tuple[float, float]] = []  # (bytes, ready_s)
    size, ready, cap = 0.0, 0.0, DDP_FIRST_BUCKET_BYTES
    for la in sorted(p.layers, key=lambda la: la.ready_s):
        nbytes = la.numel * DTYPE_BYTES[grad_dtype]
        if size and size + nbytes > cap:
            buckets.append((size, ready))
            size, cap = 0.0, DDP_BUCKET_BYTES
        size, ready = size + nbytes, la.ready_s
    if size:
        buckets.append((size, ready))
    priced = [pricer.price("allreduce", b, tag=f"bucket {i}") for i, (b, _) in enumerate(buckets)]
    tl = iteration(p.forward_s, p.backward_s, [r for _, r in buckets], [0.0] * len(buckets),
                   [x.time_s for x in priced])
    cross = sum(2.0 * b / topo.gpus_per_node * (topo.nodes - 1) / topo.nodes for b, _ in buckets)
    detail = [{"op": "allreduce", "group": "world", "bytes": b, "ready_s": r, "algo": x.algo, "time_s": x.time_s}
              for (b, r), x in zip(buckets, priced, strict=True)]
    return StrategyResult("none", "none", tl.iteration_s, tl.compute_s, tl.comm_s, tl.exposed_comm_s, cross,
                          len(buckets), memory, detail)


def sharded_result(strategy: str, quantize: Quantize, order: Sequence[str], fwd: dict[str, float],
                   bwd: dict[str, float], schedule: list[ShardCollective], pricer: Pricer,
                   memory: Memory) -> StrategyResult:
    topo = pricer.topo
    priced = [pricer.group(c.group).price(c.op, c.bytes_per_rank, tag=f"{c.unit} {c.phase}") for c in schedule]
    tl = two_stream(order, fwd, bwd, [(c.op, c.unit, c.phase) for c in schedule], [x.time_s for x in priced],
                    [c.group for c in schedule])
    cross = sum(cross_node_bytes(c, topo.gpus_per_node, topo.nodes) for c in schedule)
    detail = [{**c.to_dict(), "algo": x.algo, "time_s": x.time_s, "start_s": s, "end_s": e}
              for c, x, s, e in zip(schedule, priced, tl.comm_start, tl.comm_end, strict=True)]
    return StrategyResult(strategy, quantize.label, tl.iteration_s, tl.compute_s, tl.comm_s, tl.exposed_comm_s,
                          cross, len(schedule), memory, detail)


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
    Mixed precision as torchtitan runs it: parameters gathered in bf16 under ``precision`` bf16 (else fp32),
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
    shapes = zoo_shapes(source, fed, input_size)
    units, root = group_units(shapes, wrap)
    owner = assign(shapes, wrap)
    fwd, bwd = unit_compute(pred, owner)
    param_dtype = "bf16" if precision == "bf16" else "fp32"
    capacity = device(gpu).memory_GB * 1e9
    pricer = Pricer(topo, engine)
    results = []
    for s in strategies:
        if s == "none":
            mem = memory_per_gpu(s, units, root, topo.ranks, topo.gpus_per_node, capacity, param_dtype, reduce_dtype,
                                 activations_bytes)
            results.append(ddp_result(pred, pricer, mem, reduce_dtype))
            continue
        for q in variants:
            mem = memory_per_gpu(s, units, root, topo.ranks, topo.gpus_per_node, capacity, param_dtype, reduce_dtype,
                                 activations_bytes, q.hpz and topo.nodes > 1)
            sched = fsdp_schedule(units, root, s, topo.ranks, topo.gpus_per_node, param_dtype, reduce_dtype,
                                  reshard_after_forward, q)
            results.append(sharded_result(s, q, [u.name for u in units], fwd, bwd, sched, pricer, mem))
    return ShardStudy(pred.profile.model, topo.name, gpu, batch, precision, root.numel + sum(u.numel for u in units),
                      len(units), root.numel, pred, results, priced_input(pred, fed, data, input_size))


__all__ = ["Input", "ShardStudy", "ShardUnit", "StrategyResult", "study"]
