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
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.log import CommRecord, record, scaled
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.grouping import Grouping, slice_bounds, slice_layout
from arcsim.compressors.layout import Layer
from arcsim.compressors.memory import Memory


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
