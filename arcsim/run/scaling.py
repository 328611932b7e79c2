"""Dense data-parallel scaling on a compute profile, with no trace: each bucket (or fused buffer) all-reduced in
fp32 on the topology, on the same timeline and effects as `arcsim run` prices (run/candidates.py), so a published
scaling series can be checked (benchmarks/published_scaling.py).

Scaling efficiency = one GPU's step (its compute alone: no collective, no slowest-of-p) / the cluster's step,
as published series define it (throughput on p GPUs / p × one GPU's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arcsim.comm.log import record
from arcsim.compressors.layout import Layer
from arcsim.devices.catalog import Device
from arcsim.pricing import Pricer
from arcsim.run.candidates import Context, compress_times, step_timeline
from arcsim.run.compute import ComputeTimes
from arcsim.strategy.buckets import GRAD_BYTES, Bucket, make_buckets
from arcsim.strategy.engine import Timeline
from arcsim.topology import Topology
from arcsim.traces.profile import ComputeProfile


@dataclass(frozen=True)
class ScalingPoint:
    topology: str
    ranks: int
    one_gpu_s: float
    iteration_s: float
    exposed_comm_s: float
    comm_s: float
    buckets: int

    @property
    def efficiency(self) -> float:
        return self.one_gpu_s / self.iteration_s


def layers_of(profile: ComputeProfile) -> tuple[list[Layer], np.ndarray]:
    """The profile's layers (backward order) as a flat vector's layout, and their ready times."""
    layers, offset = [], 0
    for la in profile.layers:
        layers.append(Layer(la.name, (la.numel,), offset))
        offset += la.numel
    return layers, np.array([la.ready_s for la in profile.layers])


def compute_times(profile: ComputeProfile, scale: float = 1.0) -> ComputeTimes:
    """The profile's times × ``scale`` (a published run's own one-GPU step over the modelled one)."""
    _, ready = layers_of(profile)
    return ComputeTimes(profile.forward_s * scale, profile.backward_s * scale, ready * scale, "cuda",
                        f"{profile.model} on {profile.device_name}", profile.after_backward_s * scale)


def dense_step(profile: ComputeProfile, topo: Topology, bucket_mb: float | None = None, scale: float = 1.0,
               framework: str = "ddp", buckets: list[Bucket] | None = None) -> ScalingPoint:
    """One dense fp32 step of ``profile``'s model on ``topo`` under ``framework`` (arcsim.strategy.frameworks), in
    buckets of ``bucket_mb`` MiB (None: the framework's default)."""
    compute = compute_times(profile, scale)
    timeline, buckets = dense_timeline(profile, topo, bucket_mb, scale, framework, buckets)
    one = compute.forward_s + compute.backward_s + compute.after_s
    return _point(topo, one, timeline, len(buckets))


def dense_timeline(profile: ComputeProfile, topo: Topology, bucket_mb: float | None = None, scale: float = 1.0,
                   framework: str = "ddp", buckets: list[Bucket] | None = None, grad_bytes: int = GRAD_BYTES,
                   engine: str = "analytic", gpu: Device | None = None) -> tuple[Timeline, list[Bucket]]:
    """The timeline of :func:`dense_step` (gradients all-reduced in ``grad_bytes`` per element, priced by ``engine``)
    and its buckets: the one DDP and Horovod step every command prices. With ``gpu``, each bucket's own work on it
    (the dense hook's, as arcsim run charges its dense baseline); without, none (the published scaling series)."""
    from arcsim.strategy.frameworks import get_framework

    layers, _ = layers_of(profile)
    compute = compute_times(profile, scale)
    fw = get_framework(framework)
    if buckets is None:
        buckets = fw.buckets(layers, compute.ready_s.tolist(), fw.cap_mb(bucket_mb) * 2**20, fw.first_cap(bucket_mb),
                             compute.backward_s)
    ctx = Context(None, topo, compute, buckets, engine, gpu=gpu, framework=framework)
    dtype = "float32" if grad_bytes == 4 else "bfloat16"
    records = [[record("allreduce", "dense", grad_bytes, dtype, b.numel, topo.ranks)] for b in buckets]
    work = compress_times("dense", [], ctx) if gpu is not None else [0.0] * len(buckets)
    timeline, _ = step_timeline(records, work, "auto", ctx, Pricer(topo, engine), "allreduce")
    return timeline, buckets


def _point(topo: Topology, one: float, t: Timeline, buckets: int) -> ScalingPoint:
    return ScalingPoint(topo.name, topo.ranks, one, t.iteration_s, t.exposed_comm_s, t.comm_s, buckets)


__all__ = ["ScalingPoint", "compute_times", "dense_step", "dense_timeline", "layers_of", "make_buckets"]
