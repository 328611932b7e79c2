"""Top-K: each worker keeps its own k largest |x|; values and indices travel by all-gather."""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, Layer, SparseContribution, sparse_aggregate


class TopK(Compressor):
    name = "topk"
    all_reduce_compatible = False

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        k = self.k_for(x.shape[1], density)
        # one worker at a time: |x| and topk's own scratch stay O(d), not O(P·d)
        idx = torch.stack([row.abs().topk(k, sorted=False).indices for row in x])
        vals = x.gather(1, idx).float()
        gathered_vals = comm.all_gather(vals, tag="values")
        gathered_idx = comm.all_gather(idx.to(torch.int32), tag="indices")
        agg = sparse_aggregate(x.shape[1], gathered_idx, gathered_vals, comm.world_size)
        selected = torch.full((x.shape[0],), k, device=x.device)
        return Compressed(agg, SparseContribution(idx, vals), selected, index_based=True)
