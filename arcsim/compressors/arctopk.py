"""ARC-Top-K (Chen et al. 2025): agree on one set of rows from an all-reduced random sketch.

The vector is viewed as rows: the rows of each ≥2-D layer (flattened past its first axis), and blocks
of ``block`` elements for 1-D layers and flat buckets (the last block may be shorter). With a Gaussian
matrix V (L × r, from a seed all workers share, fresh each step, one per row length L), every worker
sketches its rows, x_i V; the sketch is all-reduced (mean: by linearity x̄ V), each row is scored by
‖S_j‖²/r, an unbiased estimate of ‖x̄_j‖², and the best rows are kept. ``scope="tensor"`` (the
default, as the authors' code) keeps K = max(1, ⌊ρ m⌋) rows of every layer, so every layer moves every
step; ``scope="bucket"`` ranks all rows of the bucket together and keeps the best until ρ·d elements are
used (at least one row) — at low density on a small model that can leave layers (the output layer
among them) without any update for many steps. Then only the kept rows' values are all-reduced.
No index list travels. ``selector="oracle"`` scores rows by the exact ‖x̄_j‖² instead (it needs a dense
all-reduce, logged with the tag "oracle"): an analysis baseline with ‖x̄ − C(x̄)‖² ≤ (1 − K/m)‖x̄‖².
"""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, SparseContribution, shared_aggregate
from arcsim.compressors.layout import Layer, flat_layout
from arcsim.errors import CompressionError

SELECTORS = ("sketch", "oracle")
SCOPES = ("tensor", "bucket")


class Rows:
    """The row structure of a flat vector as contiguous segments of equal-length rows.

    Each segment (offset, rows, length) is a zero-copy [W, rows, length] view of the vector; rows are
    numbered in segment order, which is also their order in memory.
    """

    def __init__(self, layout: tuple[Layer, ...], block: int, device: torch.device) -> None:
        self.segments: list[tuple[int, int, int]] = []
        for layer in layout:
            if len(layer.shape) >= 2 and layer.shape[0] > 0:
                self.segments.append((layer.offset, layer.shape[0], layer.numel // layer.shape[0]))
            else:
                full, tail = divmod(layer.numel, block)
                if full:
                    self.segments.append((layer.offset, full, block))
                if tail:
                    self.segments.append((layer.offset + full * block, 1, tail))
        self.layer_rows: list[tuple[int, int]] = []  # (first row, rows) of each layer
        first = 0
        for layer in layout:
            n = layer.shape[0] if len(layer.shape) >= 2 and layer.shape[0] > 0 else -(-layer.numel // block)
            self.layer_rows.append((first, n))
            first += n
        self.start = torch.cat([off + torch.arange(n, dtype=torch.int64) * L for off, n, L in self.segments]).to(device)
        self.length = torch.cat([torch.full((n,), L, dtype=torch.int64) for _, n, L in self.segments]).to(device)

    @property
    def count(self) -> int:
        return int(self.start.numel())

    def views(self, x: torch.Tensor):
        """(segment view [W, rows, length], length) for each segment."""
        for off, n, L in self.segments:
            yield x[:, off:off + n * L].view(x.shape[0], n, L), L

    def elements(self, rows: torch.Tensor) -> torch.Tensor:
        """Flat element indices of the given rows, in row order."""
        lengths = self.length[rows]
        offsets = torch.repeat_interleave(self.start[rows] - torch.cumsum(lengths, 0) + lengths, lengths)
        return offsets + torch.arange(int(lengths.sum()), device=rows.device)


class ArcTopK(Compressor):
    name = "arctopk"

    def __init__(self, density: float = 0.01, seed: int = 0, rank: int = 4, block: int = 64,
                 selector: str = "sketch", scope: str = "tensor") -> None:
        super().__init__(density, seed)
        if rank < 1:
            raise CompressionError(f"sketch rank r must be ≥ 1 (got {rank})")
        if block < 1:
            raise CompressionError(f"block length must be ≥ 1 (got {block})")
        if selector not in SELECTORS:
            raise CompressionError(f"unknown selector {selector!r}; choose one of {', '.join(SELECTORS)}")
        if scope not in SCOPES:
            raise CompressionError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
        self.rank, self.block, self.selector, self.scope = rank, block, selector, scope
        self._rows: dict[tuple, Rows] = {}

    def rows_for(self, layout: tuple[Layer, ...], device: torch.device) -> Rows:
        key = (layout, device)
        if key not in self._rows:
            self._rows[key] = Rows(layout, self.block, device)
        return self._rows[key]

    def projection(self, length: int, step: int, device: torch.device) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((self.seed, step, length)) & 0x7FFF_FFFF_FFFF_FFFF)
        return torch.randn(length, self.rank, generator=gen).to(device)

    def scores(self, x: torch.Tensor, rows: Rows, comm: Communicator, step: int) -> torch.Tensor:
        """Score [m] of every row: ‖S_j‖²/r from the all-reduced sketch, or the exact ‖x̄_j‖² (oracle)."""
        if self.selector == "oracle":
            mean = comm.all_reduce(x.float(), tag="oracle")
            return torch.cat([view.pow(2).sum(-1)[0] for view, _ in rows.views(mean)])
        projections: dict[int, torch.Tensor] = {}
        sketches = []
        for view, length in rows.views(x):
            if length not in projections:
                projections[length] = self.projection(length, step, x.device)
            sketches.append(torch.matmul(view.float(), projections[length]))
        sketch = comm.all_reduce(torch.cat(sketches, dim=1), tag="sketch")  # [1, m, r]
        return sketch[0].pow(2).sum(-1) / self.rank

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        d = x.shape[1]
        rows = self.rows_for(layout or flat_layout(d), x.device)
        scores = self.scores(x, rows, comm, step)
        rho = self.rho(density)
        if self.scope == "tensor":
            keep = torch.cat([first + torch.topk(scores[first:first + n], max(1, int(rho * n))).indices
                              for first, n in rows.layer_rows])
        else:
            ranked = torch.argsort(scores, descending=True)
            within = torch.cumsum(rows.length[ranked], 0) <= rho * d
            keep = ranked[: max(1, int(within.sum()))]
        idx = rows.elements(torch.sort(keep).values)
        vals = x.index_select(1, idx).float()
        reduced = comm.all_reduce(vals, tag="values")
        selected = torch.full((x.shape[0],), idx.numel(), device=x.device)
        return Compressed(shared_aggregate(d, idx, reduced), SparseContribution(idx.unsqueeze(0), vals), selected,
                          index_based=True)
