"""How a data-parallel framework groups gradients into collectives and when it issues them (`--framework`).

- **ddp** (PyTorch DistributedDataParallel): layers in backward order packed into buckets of at most
  ``--bucket-mb`` (default DDP_BUCKET_MB, 25 MiB, after torch's 1 MiB first bucket) of fp32; a bucket is sent when
  its last gradient is ready (arcsim.strategy.buckets). A compressor's collectives run per bucket, as a DDP comm
  hook's do.
- **horovod**: a background thread wakes every cycle (HOROVOD_CYCLE_TIME, 1 ms; 5 ms before Horovod 0.21), takes
  the tensors that became ready since its last turn, and fuses them, in order, into fusion buffers of at most
  ``--bucket-mb`` (default HOROVOD_FUSION_THRESHOLD's, 64 MiB); each buffer is one all-reduce, issued at the end of
  the cycle in which its last tensor became ready. A tensor larger than the threshold goes alone. Compressed
  tensors that are all-gathered (the sparsifiers: Top-K, Gaussian-K, DGC) are NOT fused — Horovod's allgather
  takes one tensor (hvd.allgather / grouped by name, one collective each), so each layer's values and indices are
  gathered on their own; all-reduced compressed tensors (fp16, PowerSGD's factors, the sketches) fuse as dense
  ones do. Horovod's negotiation (the coordinator's per-cycle exchange of ready tensor names) and the copies into
  and out of the fusion buffer are not priced.
- **deepspeed** (DeepSpeed's engine without ZeRO, as v0.3.0 runs it: microsoft/DeepSpeed
  deepspeed/runtime/engine.py at 4b1df25ae96e3732213877e7729c5e15548188fd, the release of the 1-bit Adam blog):
  nothing is sent during backward. ``engine.backward`` runs the whole backward pass, then ``allreduce_gradients``
  (lines 751-765, 828-829) calls ``buffered_allreduce_fallback`` (1051-1079), which takes every gradient in
  ``module.named_parameters()`` order (the forward order), splits them by dtype, and ``allreduce_no_retain``
  (1038-1049) packs each in turn into a buffer that is flattened and all-reduced once it holds MORE than
  ``elements_per_buffer`` elements (MEMORY_OPT_ALLREDUCE_SIZE, 500,000,000, line 37; ``--bucket-mb`` as MiB of fp32
  overrides), the tensor that crossed the cap included; the rest go in a last buffer. So every group is ready when
  backward ends and the groups are issued one after another, in forward order. 1-bit Adam
  (deepspeed/runtime/fp16/onebit_adam.py, same commit) turns the engine's all-reduce off once compressing
  (``enable_backward_allreduce = False``, line 372) and compresses in the optimizer step, after backward, each
  parameter group's flattened momentum (the FP16 optimizer keeps one flat fp32 vector per group) with one
  ``Compressed_Allreduce`` (lines 104-228: packed signs gathered to each rank's chunk, then all-gathered): under 500 M
  elements that is one group, as the engine's buffer. A compressor's collectives here run per group, after backward;
  its compression on the compute stream after backward too. Not priced: the flatten and unflatten copies, and
  the dtype split (a model trained in one precision has one dtype).

ddp and horovod keep one collective stream in order, with the overlap with backward of
:mod:`arcsim.strategy.data_parallel`; deepspeed the same stream with no overlap (every group ready at backward's
end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from arcsim.catalog import DDP_BUCKET_MB, DEEPSPEED_BUFFER_MB, FRAMEWORKS, HOROVOD_FUSION_MB
from arcsim.comm.log import CommRecord, resized
from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.strategy.buckets import DDP_FIRST_BUCKET_BYTES, GRAD_BYTES, Bucket, make_buckets

HOROVOD_CYCLE_S = 1e-3        # HOROVOD_CYCLE_TIME default (1 ms from 0.21; 5 ms before)


def framework_message(name: str) -> str:
    return f"unknown framework {name!r}; choose {', '.join(FRAMEWORKS[:-1])} or {FRAMEWORKS[-1]}"


@dataclass(frozen=True)
class Framework:
    name: str
    default_bucket_mb: float
    cycle_s: float = 0.0

    def buckets(self, layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float,
                first_cap_bytes: float | None = None, backward_s: float | None = None) -> list[Bucket]:
        """The gradient groups the framework sends; ``first_cap_bytes``: DDP's first bucket's cap (the default
        cap's 1 MiB: :meth:`first_cap`); ``backward_s``: when backward ends (DeepSpeed sends after it; None: when
        the last gradient is ready)."""
        if self.name == "ddp":
            return make_buckets(layers, ready_s, cap_bytes, first_cap_bytes)
        if self.name == "deepspeed":
            return deepspeed_buffers(layers, ready_s, cap_bytes, backward_s)
        return horovod_buffers(layers, ready_s, cap_bytes, self.cycle_s)

    def records(self, bucket: Bucket, recs: list[CommRecord]) -> list[CommRecord]:
        """The collectives the framework issues for one bucket's compressed records (DDP's comm hook and DeepSpeed's
        flattened buffer: as they are; Horovod: all-gathers one tensor at a time)."""
        if self.name != "horovod":
            return recs
        return per_tensor_allgathers(bucket, recs)

    def cap_mb(self, bucket_mb: float | None) -> float:
        """The bucket cap (DDP), fusion threshold (Horovod) or buffer size (DeepSpeed) in MiB of fp32: ``bucket_mb``
        as asked, None: the framework's own default (DDP 25, Horovod 64, DeepSpeed 500 M elements)."""
        return self.default_bucket_mb if bucket_mb is None else bucket_mb

    def describe(self, groups: int, cap_mb: float) -> str:
        """How this run's gradients were grouped and sent: ``groups`` groups under a cap of ``cap_mb`` MiB of fp32
        (for a run's assumptions)."""
        if self.name == "ddp":
            return f"{groups} bucket(s) of ≤ {cap_mb:g} MiB fp32"
        if self.name == "deepspeed":
            return (f"DeepSpeed: {groups} buffer(s) in forward order, each closed once past "
                    f"{cap_mb * 2**20 / GRAD_BYTES:,.0f} elements and all-reduced after backward has ended (no "
                    "overlap); a compressor's compression and collectives after backward too")
        return (f"Horovod: {groups} fused all-reduce buffer(s) of tensors ready in the same {self.cycle_s * 1e3:g} ms "
                f"cycle, ≤ the fusion threshold ({cap_mb:g} MiB, --bucket-mb); all-gathered (sparsified) tensors "
                "gathered one tensor at a time, not fused")

    def first_cap(self, bucket_mb: float | None) -> float | None:
        """DDP's first bucket's cap in bytes where the cap is DDP's default (torch's 1 MiB), else None (the same as
        the others; Horovod has none)."""
        return DDP_FIRST_BUCKET_BYTES if self.name == "ddp" and bucket_mb is None else None


def get_framework(name: str, cycle_s: float | None = None) -> Framework:
    if name == "ddp":
        return Framework("ddp", DDP_BUCKET_MB)
    if name == "horovod":
        return Framework("horovod", HOROVOD_FUSION_MB, HOROVOD_CYCLE_S if cycle_s is None else cycle_s)
    if name == "deepspeed":
        return Framework("deepspeed", DEEPSPEED_BUFFER_MB)
    raise ArcsimError(framework_message(name))


def deepspeed_buffers(layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float,
                      backward_s: float | None = None) -> list[Bucket]:
    """DeepSpeed's engine's all-reduce buffers (``allreduce_no_retain``): the layers in forward order (the trace keeps
    backward order: reversed), each joining the open buffer, which is sent once it holds more than ``cap_bytes`` /
    GRAD_BYTES elements; every buffer ready when backward ends (``backward_s``, else the last gradient's ready
    time). The buffers come in the order they are sent; each one's layers in the trace's (flat-vector) order."""
    if not layers:
        return []
    cap = cap_bytes / GRAD_BYTES
    end = max(float(max(ready_s)), backward_s if backward_s is not None else 0.0)
    out: list[Bucket] = []
    group: list[int] = []
    numel = 0

    def close() -> None:
        chosen = tuple(layers[i] for i in sorted(group))
        lo, hi = chosen[0].offset, chosen[-1].offset + chosen[-1].numel
        out.append(Bucket(len(out), chosen, lo, hi, end))

    for i in reversed(range(len(layers))):
        group.append(i)
        numel += layers[i].numel
        if numel > cap:
            close()
            group, numel = [], 0
    if group:
        close()
    return out


def horovod_buffers(layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float,
                    cycle_s: float) -> list[Bucket]:
    """Horovod's fused all-reduces: tensors (backward order) grouped by the cycle at whose end the background thread
    sees them ready (⌈ready / cycle⌉), each cycle's tensors fused in order into buffers of ≤ ``cap_bytes``; a
    buffer is ready at its cycle's end. ``cycle_s`` 0: every distinct ready time is its own cycle."""
    out: list[Bucket] = []
    group: list[int] = []
    size, tick = 0, -1.0

    def cycle_end(t: float) -> float:
        if cycle_s <= 0:
            return t
        return math.ceil(t / cycle_s - 1e-9) * cycle_s

    def close() -> None:
        chosen = tuple(layers[i] for i in group)
        lo, hi = chosen[0].offset, chosen[-1].offset + chosen[-1].numel
        out.append(Bucket(len(out), chosen, lo, hi, tick))

    for i, layer in enumerate(layers):
        t = cycle_end(float(ready_s[i]))
        nbytes = layer.numel * GRAD_BYTES
        if group and (t != tick or size + nbytes > cap_bytes):
            close()
            group, size = [], 0
        group.append(i)
        tick = max(tick, t)
        size += nbytes
    if group:
        close()
    return out


def per_tensor_allgathers(bucket: Bucket, recs: list[CommRecord]) -> list[CommRecord]:
    """A bucket's all-gathers split into one per tensor (layer), each carrying its layer's share of the elements
    (at least one); other collectives as they are (fused)."""
    if len(bucket.layers) < 2:
        return recs
    out: list[CommRecord] = []
    for r in recs:
        if r.op != "allgather" or r.group == "node":
            out.append(r)
            continue
        shares = [la.numel / bucket.numel for la in bucket.layers]
        counts = [max(1, round(r.elements * s)) for s in shares]
        out.extend(resized(r, c) for c in counts)
    return out
