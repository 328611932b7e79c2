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

Both keep one collective stream in order, with the overlap with backward of :mod:`arcsim.strategy.data_parallel`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from arcsim.catalog import DDP_BUCKET_MB, HOROVOD_FUSION_MB
from arcsim.comm.log import CommRecord, resized
from arcsim.compressors.base import Layer
from arcsim.errors import ArcsimError
from arcsim.strategy.buckets import DDP_FIRST_BUCKET_BYTES, GRAD_BYTES, Bucket, make_buckets

FRAMEWORKS = ("ddp", "horovod")
HOROVOD_CYCLE_S = 1e-3        # HOROVOD_CYCLE_TIME default (1 ms from 0.21; 5 ms before)


def framework_message(name: str) -> str:
    return f"unknown framework {name!r}; choose {' or '.join(FRAMEWORKS)}"


@dataclass(frozen=True)
class Framework:
    name: str
    default_bucket_mb: float
    cycle_s: float = 0.0

    def buckets(self, layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float,
                first_cap_bytes: float | None = None) -> list[Bucket]:
        """The gradient groups the framework sends; ``first_cap_bytes``: DDP's first bucket's cap (the default
        cap's 1 MiB: :meth:`first_cap`)."""
        if self.name == "ddp":
            return make_buckets(layers, ready_s, cap_bytes, first_cap_bytes)
        return horovod_buffers(layers, ready_s, cap_bytes, self.cycle_s)

    def records(self, bucket: Bucket, recs: list[CommRecord]) -> list[CommRecord]:
        """The collectives the framework issues for one bucket's compressed records."""
        if self.name == "ddp":
            return recs
        return per_tensor_allgathers(bucket, recs)

    def cap_mb(self, bucket_mb: float | None) -> float:
        """The bucket cap (DDP) or fusion threshold (Horovod) in MiB: ``bucket_mb`` as asked, None: the framework's own
        default (DDP 25, Horovod 64)."""
        return self.default_bucket_mb if bucket_mb is None else bucket_mb

    def first_cap(self, bucket_mb: float | None) -> float | None:
        """DDP's first bucket's cap in bytes where the cap is DDP's default (torch's 1 MiB), else None (the same as
        the others; Horovod has none)."""
        return DDP_FIRST_BUCKET_BYTES if self.name == "ddp" and bucket_mb is None else None


def get_framework(name: str, cycle_s: float | None = None) -> Framework:
    if name == "ddp":
        return Framework("ddp", DDP_BUCKET_MB)
    if name == "horovod":
        return Framework("horovod", HOROVOD_FUSION_MB, HOROVOD_CYCLE_S if cycle_s is None else cycle_s)
    raise ArcsimError(framework_message(name))


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
