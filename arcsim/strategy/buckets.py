"""DDP-style gradient buckets: layers in backward order packed until a bucket reaches its byte cap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arcsim.compressors.layout import Layer

GRAD_BYTES = 4  # DDP reduces fp32 gradients
# DDP's first bucket (the first gradients backward makes ready) under the default bucket_cap_mb: torch's
# _DEFAULT_FIRST_BUCKET_BYTES, the reducer's first size limit when it rebuilds its buckets in ready order after the
# first step; with bucket_cap_mb given, torch ≥ 2.2 makes the first bucket as large as the others
DDP_FIRST_BUCKET_BYTES = 2**20


@dataclass(frozen=True)
class Bucket:
    index: int
    layers: tuple[Layer, ...]   # offsets into the trace's flat vector
    lo: int
    hi: int
    ready_s: float              # when its last gradient is ready, from the start of backward

    @property
    def numel(self) -> int:
        return self.hi - self.lo

    @property
    def nbytes(self) -> int:
        return self.numel * GRAD_BYTES

    def layout(self) -> tuple[Layer, ...]:
        """The bucket's layers with offsets relative to the bucket."""
        return tuple(Layer(la.name, la.shape, la.offset - self.lo) for la in self.layers)


def make_buckets(layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float,
                 first_cap_bytes: float | None = None) -> list[Bucket]:
    """Pack layers (backward order, contiguous in the flat vector) into buckets as DDP's reducer does
    (``compute_bucket_assignment_by_size``): a layer joins the open bucket, which closes once it holds ``cap_bytes``
    or more (the first ``first_cap_bytes``, default the same) — so a bucket ends with the layer that reaches its cap.
    A bucket is ready when its latest layer is. ``cap_bytes`` infinite: one bucket."""
    buckets: list[Bucket] = []
    group: list[int] = []
    size = 0

    def close() -> None:
        chosen = tuple(layers[i] for i in group)
        lo, hi = chosen[0].offset, chosen[-1].offset + chosen[-1].numel
        buckets.append(Bucket(len(buckets), chosen, lo, hi, max(ready_s[i] for i in group)))

    for i, layer in enumerate(layers):
        group.append(i)
        size += layer.numel * GRAD_BYTES
        if size >= (cap_bytes if buckets or first_cap_bytes is None else first_cap_bytes):
            close()
            group, size = [], 0
    if group:
        close()
    return buckets
