"""Pricing measured compressors: a Candidate per (compressor, collective algorithm) with its iteration
timeline, its fidelity, and its compression and communication per bucket kept apart."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arcsim.catalog import INFO
from arcsim.comm.log import CommRecord
from arcsim.devices.catalog import Device
from arcsim.devices.kernels import compress_seconds
from arcsim.errors import ArcsimError
from arcsim.pricing import PricedRecord, Pricer, algorithms_for
from arcsim.run.compute import ComputeTimes
from arcsim.run.measurement import Measurement
from arcsim.strategy import effects
from arcsim.strategy.buckets import Bucket
from arcsim.strategy.data_parallel import bucketed_iteration_s, bucketed_step
from arcsim.strategy.engine import Timeline
from arcsim.strategy.frameworks import get_framework
from arcsim.topology import Topology
from arcsim.traces.format import GradientSource

DETAIL = ("bucket_compress_s", "bucket_comm_s", "measurement")  # kept on the object, not in its rows


@dataclass
class Candidate:
    compressor: str
    collective: str
    density: float | None
    memory: str
    op: str                    # the main data collective: allreduce or allgather
    iteration_s: float
    compute_s: float           # one rank's forward + backward (+ after): what `arcsim device predict` gives
    compress_s: float
    comm_s: float
    exposed_comm_s: float
    rel_error: float
    update_error: float
    compression_gain: float
    density_achieved: float
    bytes_per_rank: float
    effects_s: float = 0.0              # what the cluster's effects add to compute: the slowest rank, interference
    hierarchy: str = "flat"             # flat, or node: dense inside nodes, compressed between (compressors.hierarchy)
    speedup_vs_dense: float = 1.0       # dense fp32 on its fastest collective ÷ this (run and sweep alike)
    speedup_vs_dense_ring: float = 1.0  # dense fp32 flat-ring all-reduce ÷ this (the textbook baseline)
    rel_error_ci: tuple[float, float] | None = None  # 95 % interval over the trace's steps (None: one step)
    speedup_low: float | None = None    # the speed-up's interval from the model's held-out errors (run/doubt.py)
    speedup_high: float | None = None
    verdict: str | None = None          # faster, slower, too close to call; baseline: dense itself
    tips: list[dict[str, Any]] = field(default_factory=list)  # too close to call: settings that make it clear
    density_by_step: list[float] = field(default_factory=list)  # achieved density at each trace step
    bucket_compress_s: list[float] = field(default_factory=list)  # mean compression per bucket (as priced)
    bucket_comm_s: list[float] = field(default_factory=list)      # mean communication per bucket
    measurement: Measurement | None = field(default=None, repr=False, compare=False)  # what was priced

    @property
    def compute_stream_s(self) -> float:
        """Compute as the step pays it: one rank's, with the cluster's effects (what the timeline overlaps)."""
        return self.compute_s + self.effects_s

    @property
    def bucket_s(self) -> list[float]:
        """Mean compression + communication per bucket."""
        return [a + b for a, b in zip(self.bucket_compress_s, self.bucket_comm_s, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """The candidate's numbers (JSON, CSV and sweep rows are written from this; per-bucket detail and
        the measurement stay out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in DETAIL}


@dataclass
class Context:
    """What every candidate is priced against."""

    trace: GradientSource | None  # a trace or live DP training (arcsim run); None: arcsim train's own
    topo: Topology
    compute: ComputeTimes
    buckets: list[Bucket]
    engine: str
    compress_scale: float | Mapping[str, float] = 1.0  # measured compression × this (or per compressor: ranks
    #                                                   sharing cores in an emulated cluster)
    gpu: Device | None = None  # compression modelled on this device (arcsim.devices.kernels); None: measured here
    scope: str = "tensor"      # the top-k family's selection scope (kernel counts differ per scope)
    numel_scale: float = 1.0   # full-model elements per bucket element (--params runs on a scaled-down sample)
    framework: str = "ddp"     # how collectives are grouped and issued (arcsim.strategy.frameworks)

    def scale_for(self, compressor: str) -> float:
        """What ``compressor``'s measured compression time is multiplied by (a --params sample's size ratio too)."""
        scale = self.compress_scale
        return (scale if isinstance(scale, float | int) else scale.get(compressor, 1.0)) * self.numel_scale

    @property
    def compress_source(self) -> str:
        return "measured" if self.gpu is None else "modelled"

    @property
    def trace_file(self) -> GradientSource:
        """The gradient source an `arcsim run` read (reports and charts describe it; arcsim train has none)."""
        if self.trace is None:
            raise ArcsimError("this result came from arcsim train, not arcsim run; it has no trace to describe")
        return self.trace


def main_op(meas: Measurement) -> str:
    """The collective that carries the data: the all-reduce or all-gather with the most bytes."""
    return main_op_of(meas.records[0])


def main_op_of(step_records: list[list[CommRecord]]) -> str:
    """The main op of one step's records (per bucket): node-aware, the one between nodes."""
    sizes = {"allreduce": 0, "allgather": 0}
    for recs in step_records:
        for r in recs:
            if r.op in sizes and r.group != "node":
                sizes[r.op] += r.bytes_per_rank
    return max(sizes, key=sizes.__getitem__)


def compress_times(compressor: str, measured: list[float], ctx: Context, hierarchy: str = "flat",
                   density: float | None = None) -> list[float]:
    """Each bucket's compression on the critical path: modelled on the context's GPU (at ``density``, with the
    values of every peer it exchanges with scattered back), else as measured × scale. Node-aware, a rank
    compresses its 1/G slice of each bucket (measured on that slice) and exchanges with one rank a node."""
    if ctx.gpu is not None:
        flat = hierarchy == "flat"
        share = 1.0 if flat else 1.0 / ctx.topo.gpus_per_node
        peers = ctx.topo.ranks if flat else ctx.topo.nodes
        return [compress_seconds(compressor, ctx.scope, max(1, round(b.numel * ctx.numel_scale * share)),
                                 len(b.layers), ctx.gpu, density, peers) for b in ctx.buckets]
    return [c * ctx.scale_for(compressor) for c in measured]


def priced_buckets(step_records: list[list[CommRecord]], collective: str, ctx: Context, pricer: Pricer,
                   op: str | None = None) -> list[tuple[list[PricedRecord], float]]:
    """Each bucket's collectives of one step as the framework issues them, priced with ``collective`` for ``op``
    (default: the step's main op), and the bucket's jitter (the topology's effects)."""
    algos = {op or main_op_of(step_records): collective}
    if ctx.framework != "ddp":  # e.g. Horovod all-gathers each tensor on its own
        fw = get_framework(ctx.framework)
        step_records = [fw.records(b, recs) for b, recs in zip(ctx.buckets, step_records, strict=True)]
    # the DES draws the jitter on every crossing itself; the closed form adds its expectation
    jitter = effects.records_jitter_s if ctx.engine == "analytic" else (lambda recs, topo: 0.0)
    return [(pricer.records(recs, algos), jitter(recs, ctx.topo)) for recs in step_records]


def step_timeline(step_records: list[list[CommRecord]], compress: list[float], collective: str, ctx: Context,
                  pricer: Pricer, op: str | None = None) -> tuple[Timeline, list[float]]:
    """One step's iteration with ``collective`` for ``op`` (default: the step's main op), and each bucket's
    communication."""
    comm = [sum(p.time_s for p in priced) + jitter
            for priced, jitter in priced_buckets(step_records, collective, ctx, pricer, op)]
    return bucket_timeline(compress, comm, ctx), comm


def bucket_timeline(compress: Sequence[float], comm: Sequence[float], ctx: Context) -> Timeline:
    """The iteration of each bucket's compression and communication over ``ctx``'s backward, with the topology's
    effects, on the strategy layer's timeline engine: one home for every policy's and candidate's iteration."""
    c = ctx.compute
    return bucketed_step(c.forward_s, c.backward_s, [b.ready_s for b in ctx.buckets], compress, comm, c.after_s,
                         effects.step_effects(ctx.topo))


def bucket_iteration_s(compress: Sequence[float], comm: Sequence[float], ctx: Context) -> float:
    """``bucket_timeline(compress, comm, ctx).iteration_s`` without a timeline built (bucketed_iteration_s: the same
    number)."""
    c = ctx.compute
    return bucketed_iteration_s(c.forward_s, c.backward_s, [b.ready_s for b in ctx.buckets], compress, comm,
                                c.after_s, effects.step_effects(ctx.topo))


def step_timelines(meas: Measurement, collective: str, ctx: Context,
                   pricer: Pricer) -> tuple[list[Timeline], np.ndarray, np.ndarray]:
    """Each step's iteration timeline with ``collective`` for the main op, and the per-bucket sums over
    the steps of compression and of communication, kept apart."""
    timelines, comp_sum, comm_sum = [], np.zeros(len(ctx.buckets)), np.zeros(len(ctx.buckets))
    modelled = (compress_times(meas.compressor, [], ctx, meas.hierarchy, meas.density) if ctx.gpu is not None
                else None)  # the same each step
    op = main_op(meas)  # the op the collective was chosen for, on every step (a step may weigh its ops otherwise)
    alike: dict[tuple, tuple[Timeline, list[float]]] = {}  # steps that send and compress the same: one timeline
    for s, step_records in enumerate(meas.records):
        comp = modelled if modelled is not None else compress_times(meas.compressor, meas.compress_s[s], ctx,
                                                                    meas.hierarchy)
        key = (tuple(comp), tuple(tuple(recs) for recs in step_records))
        if key not in alike:
            alike[key] = step_timeline(step_records, comp, collective, ctx, pricer, op)
        timeline, comm = alike[key]
        timelines.append(timeline)
        comp_sum += np.asarray(comp)
        comm_sum += np.asarray(comm)
    return timelines, comp_sum, comm_sum


def evaluate(meas: Measurement, collective: str, ctx: Context, pricer: Pricer) -> Candidate:
    """Price one measured compressor with one collective algorithm for its main op, step by step."""
    op = main_op(meas)
    timelines, comp_sum, comm_sum = step_timelines(meas, collective, ctx, pricer)
    mean: dict[str, Any] = {f: float(np.mean([getattr(t, f) for t in timelines]))
            for f in ("iteration_s", "compute_s", "compress_s", "comm_s", "exposed_comm_s")}
    # compute is one rank's, as every command gives it; what the timeline's compute stream adds is shown apart
    device = ctx.compute.forward_s + ctx.compute.backward_s + ctx.compute.after_s
    mean["effects_s"] = max(0.0, round(mean["compute_s"] - device, 12))  # to the ps: no rounding noise without any
    mean["compute_s"] = device
    uses_density = not INFO[meas.compressor].density_free
    return Candidate(meas.compressor, collective, meas.density if uses_density else None, meas.memory, op, **mean,
                     rel_error=meas.rel_error(), rel_error_ci=meas.rel_error_interval(),
                     update_error=meas.update_error(),
                     compression_gain=meas.compression_gain(),
                     density_achieved=meas.density_achieved(),
                     bytes_per_rank=meas.bytes_per_rank(), hierarchy=meas.hierarchy,
                     density_by_step=meas.density_by_step(),
                     bucket_compress_s=list(comp_sum / len(meas.records)),
                     bucket_comm_s=list(comm_sum / len(meas.records)), measurement=meas)


def candidates_for(meas: Measurement, ctx: Context, pricer: Pricer) -> list[Candidate]:
    """One candidate per algorithm the library offers for the main collective — one only ("measured") when it was
    calibrated."""
    op = main_op(meas)
    algos = ("measured",) if op in ctx.topo.calibration else algorithms_for(ctx.topo, op)
    return [evaluate(meas, algo, ctx, pricer) for algo in algos]
