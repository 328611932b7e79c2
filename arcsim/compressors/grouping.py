"""How node-aware compression (arcsim.compressors.hierarchy) cuts the work: the captured workers as nodes, and each
bucket as one slice per local rank, cut at row boundaries. Plain arithmetic on layouts, no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError


@dataclass(frozen=True)
class Grouping:
    """How the W workers compressed here stand for a topology's nodes: ``nodes`` × ``gpus`` of them, priced as
    slices of a node of ``priced_gpus`` GPUs."""

    nodes: int
    gpus: int
    priced_gpus: int

    @property
    def slice_scale(self) -> float:
        """Elements of a priced slice per element of a measured one (n / priced_gpus over n / gpus)."""
        return self.gpus / self.priced_gpus

    def label(self) -> str:
        return f"{self.nodes} nodes × {self.gpus}"


def group_workers(workers: int, gpus_per_node: int) -> Grouping:
    """The captured workers as nodes: G' the largest divisor of W that is at most the topology's GPUs per node
    and leaves at least two nodes. Both levels need two or more ranks (else there is nothing to do inside a
    node, or between nodes)."""
    if gpus_per_node < 2:
        raise ArcsimError("node-aware compression needs several GPUs per node; on a topology with one GPU per "
                          "node it is flat compression: use --hierarchy flat or a multi-GPU topology (e.g. 8x8-ib100)")
    fits = [g for g in range(2, min(gpus_per_node, workers // 2) + 1) if workers % g == 0]
    if not fits:
        raise ArcsimError(f"the gradients come from {workers} workers, which cannot be grouped into two or more "
                          "nodes of two or more GPUs; capture with 4 or more workers (an even count), e.g. -w 8")
    return Grouping(workers // fits[-1], fits[-1], gpus_per_node)


def slice_seed(seed: int, bucket: int, part: int) -> int:
    """The seed of slice ``part`` of bucket ``bucket``'s compressor (flat compressors use seed + bucket)."""
    return seed + bucket + 7919 * part


def slice_bounds(n: int, parts: int, layout: tuple[Layer, ...] = ()) -> list[tuple[int, int]]:
    """``n`` elements cut into ``parts`` contiguous slices, the first n mod parts one element longer; with a
    ``layout``, a cut inside a layer of two or more dimensions moves to its nearest row boundary (so the
    pieces stay matrices, see :func:`slice_layout`) where that leaves no slice empty."""
    base, extra = divmod(n, parts)
    cuts = [0] + [i * base + min(i, extra) for i in range(1, parts)] + [n]
    for i in range(1, parts):
        layer = next((x for x in layout if x.offset < cuts[i] < x.offset + x.numel and len(x.shape) >= 2), None)
        if layer is None:
            continue
        row = layer.numel // layer.shape[0]
        aligned = layer.offset + round((cuts[i] - layer.offset) / row) * row
        if cuts[i - 1] < aligned < cuts[i + 1]:
            cuts[i] = aligned
    return list(itertools.pairwise(cuts))


def slice_layout(layout: tuple[Layer, ...], lo: int, hi: int) -> tuple[Layer, ...]:
    """The layers of [lo, hi), offsets from lo: a layer wholly inside keeps its shape, a piece of whole rows of
    a layer of two or more dimensions is those rows (a matrix still), any other cut piece is flat."""
    out = []
    for layer in layout:
        start, end = max(layer.offset, lo), min(layer.offset + layer.numel, hi)
        if start >= end:
            continue
        shape: tuple[int, ...] = (end - start,)
        row = layer.numel // layer.shape[0] if len(layer.shape) >= 2 else 0
        if row and (start - layer.offset) % row == 0 and (end - layer.offset) % row == 0:
            shape = ((end - start) // row, *layer.shape[1:])
        out.append(Layer(layer.name, shape, start - lo))
    return tuple(out)
