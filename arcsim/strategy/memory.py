"""Memory per GPU of one training step with Adam, by strategy (activations apart: given, or left out).

Mixed precision as FSDP2 and DDP run it: fp32 parameters, fp32 gradients and Adam's two fp32 moments —
16 bytes per parameter — held whole by DDP (``none``), 1/N of them by full sharding over N ranks, 1/G by
hybrid sharding over a node's G GPUs. A sharded step also holds unsharded working copies: the root's
parameters (never freed between forward and backward), two units' parameters at a time (the one computing
and the one prefetched) and one unit's (or the root's) unsharded gradients before its reduce-scatter, each
in the dtype it is gathered or reduced in. DDP's reducer keeps every gradient a second time, in its buckets
(:func:`replica_buffers`); Horovod one fusion buffer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from arcsim.strategy.schedule import DTYPE_BYTES
from arcsim.strategy.units import ShardUnit

STATE_BYTES = 4 + 4 + 8  # fp32 parameter, fp32 gradient, Adam's exp_avg and exp_avg_sq
# DDP's reducer allocates each bucket's flat gradients tensor in its parameters' dtype (torch/csrc/distributed/c10d/
# reducer.cpp, initialize_buckets: bucket.gradients = at::empty({offset}, options)) and, with
# gradient_as_bucket_view=False (torch's default), copies each param.grad into it: "the saved memory size will be equal
# to the total gradients size" with True (torch/nn/parallel/distributed.py's docstring). Measured with torch 2.13 on a
# gloo rank: 787,712 fp32 parameters, buckets of 3,150,848 B beside param.grad's own 3,150,848 B (none of them views).
DDP_BUCKET_BYTES = 4


@dataclass(frozen=True)
class Memory:
    strategy: str
    states_bytes: float      # parameters, gradients and optimizer states this GPU keeps
    buffers_bytes: float     # unsharded working copies while a step runs
    activations_bytes: float
    capacity_bytes: float    # the GPU's memory (datasheet)

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.buffers_bytes + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "fits": self.fits}


def memory_per_gpu(strategy: str, units: Sequence[ShardUnit], root: ShardUnit, world: int, gpus_per_node: int,
                   capacity_bytes: float, param_dtype: str = "fp32", reduce_dtype: str = "fp32",
                   activations_bytes: float = 0.0, hpz: bool = False) -> Memory:
    """``hpz``: the non-root units' parameters are kept sharded over the node between forward and backward
    (1/G of them in the gathered dtype)."""
    params = root.numel + sum(u.numel for u in units)
    if strategy == "none":
        return Memory(strategy, STATE_BYTES * params, replica_buffers("ddp", params), activations_bytes, capacity_bytes)
    shards = world if strategy == "full" else gpus_per_node
    largest = max((u.numel for u in units), default=0)
    buffers = (DTYPE_BYTES[param_dtype] * (root.numel + 2 * largest)
               + DTYPE_BYTES[reduce_dtype] * max(largest, root.numel))
    if hpz and strategy == "full":
        buffers += DTYPE_BYTES[param_dtype] * (params - root.numel) / gpus_per_node
    return Memory(strategy, STATE_BYTES * params / shards, buffers, activations_bytes, capacity_bytes)


def replica_buffers(framework: str, params: int, fusion_bytes: float = 0.0) -> float:
    """What a replicated (``none``) step holds beside the states: DDP (torch's default
    ``gradient_as_bucket_view=False``) every fp32 gradient again in its reducer's buckets; Horovod one persistent
    fusion buffer of its threshold, ``fusion_bytes`` (horovod/common/fusion_buffer_manager.cc: AllocatePersistent of
    the threshold per device); DeepSpeed the flattened copy of one buffer it all-reduces after backward
    (engine.py's allreduce_bucket: flatten), at most its cap ``fusion_bytes``, at the step's peak."""
    if framework == "ddp":
        return float(DDP_BUCKET_BYTES * params)
    if framework == "horovod":
        return float(fusion_bytes)
    return float(min(fusion_bytes, DTYPE_BYTES["fp32"] * params))  # at most every fp32 gradient
