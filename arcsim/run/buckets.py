"""DDP-style gradient buckets: layers in backward order packed until a bucket reaches its byte cap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arcsim.compressors.base import Layer

GRAD_BYTES = 4  # DDP reduces fp32 gradients


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


def make_buckets(layers: Sequence[Layer], ready_s: Sequence[float], cap_bytes: float) -> list[Bucket]:
    """Pack layers (backward order, contiguous in the flat vector) into buckets of at most ``cap_bytes``.

    As in DDP, a bucket closes once adding the next layer would pass the cap; a layer larger than the
    cap gets a bucket of its own. A bucket is ready when its latest layer is.
    """
    buckets: list[Bucket] = []
    group: list[int] = []
    size = 0

    def close() -> None:
        chosen = tuple(layers[i] for i in group)
        lo, hi = chosen[0].offset, chosen[-1].offset + chosen[-1].numel
        buckets.append(Bucket(len(buckets), chosen, lo, hi, max(ready_s[i] for i in group)))

    for i, layer in enumerate(layers):
        nbytes = layer.numel * GRAD_BYTES
        if group and size + nbytes > cap_bytes:
            close()
            group, size = [], 0
        group.append(i)
        size += nbytes
    if group:
        close()
    return buckets
