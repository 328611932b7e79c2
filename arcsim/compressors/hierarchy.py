"""Node-aware (hierarchical) compression: dense inside a node, compressed only between nodes.

With W workers as N nodes × G GPUs (worker w on node w // G, local rank w % G), one step of a bucket x [W, n]:

1. **reduce-scatter inside each node** (dense, group ``node``): node j's mean s_j of its G workers, local rank
   g holding slice g of it (the bucket cut into G near-equal slices, as a ring reduce-scatter cuts it);
2. **between nodes, one rail per local rank**: rank g of every node compresses slice g of its node's mean with
   its own compressor and error feedback (the memory is per slice, kept by the rank that compresses it) and
   the N ranks g exchange it with the compressor's own collectives (group ``inter``; the G rails at once);
3. **all-gather inside each node** (group ``node``): every rank gets the whole aggregate.

The aggregate is the compressor's aggregate over nodes of the node means: with dense it is the flat mean.
Slice boundaries that fall inside a matrix move to its nearest row boundary, so a matrix compressor
(PowerSGD) still sees the rows of a cut layer as a matrix; a piece of a vector is a shorter vector.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.log import CommRecord, record, scaled
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.layout import Layer
from arcsim.compressors.memory import Memory
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


@dataclass
class SliceStats:
    """What the measurement needs of one step: per node, Σ over slices of ‖C(u)‖², ‖u‖² and elements selected;
    and the mean over nodes of what they compressed (u, error feedback included), slice by slice."""

    kept2: torch.Tensor
    sent2: torch.Tensor
    selected: torch.Tensor
    u_mean: list[torch.Tensor]

    def compressed_mean(self) -> torch.Tensor:
        """[1, n]: the mean over nodes of u, the reference the aggregate's error is measured against."""
        return torch.cat(self.u_mean, dim=1)

    @property
    def gain(self) -> float:
        """Mean over nodes of ‖C(u)‖ / ‖u‖ over the node's whole bucket."""
        return float((self.kept2 / self.sent2.clamp_min(1e-60)).sqrt().mean())


class NodeAware:
    """One bucket's node-aware compression: a compressor and memory per slice, over an N-rank inter-node
    communicator; each step returns the aggregate and the records priced on a node of ``priced_gpus``."""

    def __init__(self, grouping: Grouping, numel: int, layout: tuple[Layer, ...],
                 make: Callable[[int], tuple[Compressor, Memory]]) -> None:
        """``make(g)``: slice g's compressor and memory."""
        self.grouping = grouping
        self.bounds = slice_bounds(numel, grouping.gpus, layout)
        self.layouts = [slice_layout(layout, lo, hi) for lo, hi in self.bounds]
        self.parts = [make(g) for g in range(grouping.gpus)]
        self.comm = InProcessComm(grouping.nodes, group="inter")
        self.numel = numel

    def node_means(self, x: torch.Tensor) -> torch.Tensor:
        """[N, n]: each node's mean of its workers' rows (what the reduce-scatter leaves, slice by slice)."""
        g = self.grouping
        return x.reshape(g.nodes, g.gpus, -1).mean(dim=1)

    def step(self, x: torch.Tensor, step: int, final: bool = False
             ) -> tuple[torch.Tensor, list[CommRecord], SliceStats]:
        """Compress a bucket's [W, n] gradients node-aware: the [1, n] aggregate, the step's records and stats."""
        means = self.node_means(x.float())
        nodes = self.grouping.nodes
        stats = SliceStats(torch.zeros(nodes, dtype=torch.float64), torch.zeros(nodes, dtype=torch.float64),
                           torch.zeros(nodes, dtype=torch.float64), [])

        def observe(u: torch.Tensor, res: Compressed, width: int) -> None:
            stats.kept2.add_(res.contribution.norms(width).double().pow(2))
            stats.sent2.add_(u.double().pow(2).sum(dim=1))
            stats.selected.add_(res.selected.double())
            stats.u_mean.append(u.mean(dim=0, keepdim=True) if res.reference is None else res.reference.float())

        marks = []
        outs = []
        for (lo, hi), (comp, mem), layout in zip(self.bounds, self.parts, self.layouts, strict=True):
            marks.append(self.comm.log.mark())
            piece = means[:, lo:hi].contiguous()
            seen = len(stats.u_mean)
            outs.append(mem.step(piece, comp, self.comm, step, layout, functools.partial(observe, width=hi - lo),
                                 final))
            if len(stats.u_mean) == seen:  # sent dense this step (EF21's first): exact, all of it kept
                norms2 = piece.double().pow(2).sum(dim=1)
                stats.kept2.add_(norms2)
                stats.sent2.add_(norms2)
                stats.selected.add_(float(hi - lo))
                stats.u_mean.append(piece.mean(dim=0, keepdim=True))
        rail = self.comm.log.records[marks[0]:marks[1] if len(marks) > 1 else None]
        del self.comm.log.records[marks[0]:]
        return torch.cat(outs, dim=1), self.records(rail), stats

    def records(self, rail: list[CommRecord]) -> list[CommRecord]:
        """The step's collectives as one rank sees them on the priced node: the dense reduce-scatter and all-gather
        inside it, and its rail's exchange — the first slice's (the rails run at once, on the node's NICs
        shared as pricing's ``inter`` group says), measured on a slice of n / G' and scaled to one of n / G."""
        scatter, gather = in_node_records(self.numel, self.grouping.priced_gpus)
        return [scatter, *(scaled(r, self.grouping.slice_scale) for r in rail), gather]


def node_memories(mem: Memory, grouping: Grouping, bounds: list[tuple[int, int]]) -> list[Memory]:
    """A flat bucket's error feedback as node-aware's, one memory per slice of ``bounds``: each node's per-rank
    state is the mean of its workers' (state every worker holds alike is sliced). Every memory's state is linear
    in what the workers sent, so the aggregate still owes what it owed, and EF21's h̄ still is the mean of h."""
    parts = []
    for lo, hi in bounds:
        part = copy.copy(mem)
        for name in mem.per_rank + mem.shared:
            value = getattr(mem, name)
            if value is None:
                continue
            piece = value[:, lo:hi]
            if name in mem.per_rank:
                piece = piece.reshape(grouping.nodes, grouping.gpus, -1).mean(dim=1)
            setattr(part, name, piece.clone())
        parts.append(part)
    return parts


def worker_memory(parts: list[Memory], grouping: Grouping) -> Memory:
    """Node-aware error feedback (one memory per slice) as a flat bucket's: each worker takes its node's per-rank
    state, the slices joined (so the aggregate owes what it owed: the inverse of :func:`node_memories` on what
    the nodes hold)."""
    whole = copy.copy(parts[0])
    for name in whole.per_rank + whole.shared:
        if getattr(whole, name) is None:
            continue
        joined = torch.cat([getattr(p, name) for p in parts], dim=1)
        setattr(whole, name, joined.repeat_interleave(grouping.gpus, dim=0) if name in whole.per_rank else joined)
    return whole


def in_node_records(numel: int, gpus: int) -> tuple[CommRecord, CommRecord]:
    """The dense steps inside a node of ``gpus`` for a bucket of ``numel`` fp32 elements: the reduce-scatter of
    the whole bucket and the all-gather of one (the longest, padded) slice."""
    return (record("reducescatter", "node", 4, "float32", numel, gpus, "node"),
            record("allgather", "node", 4, "float32", math.ceil(numel / gpus), gpus, "node"))
