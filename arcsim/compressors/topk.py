"""Top-K: each worker keeps its own k largest |x|; values and indices travel by all-gather (packed into one by
default, see :class:`~arcsim.compressors.base.GatheringCompressor`).

``scope="tensor"`` (default, as GRACE and the ARC-Top-K authors' Top-K baseline) keeps k = max(1, ⌊ρ·n⌋)
of every layer of n elements; ``scope="bucket"`` keeps one k over the whole bucket.
"""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, GatheringCompressor, SparseContribution, sparse_aggregate
from arcsim.compressors.layout import Layer


class TopK(GatheringCompressor):
    name = "topk"

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        rho = self.rho(density)
        idx = self.select(x, self.groups(x.shape[1], layout), rho)
        vals = x.gather(1, idx).float()
        gathered_vals, gathered_idx = self.gather(comm, vals, idx)
        agg = sparse_aggregate(x.shape[1], gathered_idx, gathered_vals, comm.world_size)
        selected = torch.full((x.shape[0],), idx.shape[1], device=x.device)
        return Compressed(agg, SparseContribution(idx, vals), selected, index_based=True)
