"""Rand-K: indices drawn from a seed every worker shares, so only values travel, by all-reduce."""

from __future__ import annotations

import numpy as np
import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, Layer, SparseContribution, shared_aggregate


class RandK(Compressor):
    name = "randk"
    all_reduce_compatible = True

    def indices(self, d: int, k: int, step: int, device: torch.device) -> torch.Tensor:
        """The same k distinct indices on every worker: drawn from (seed, step)."""
        chosen = np.random.default_rng([self.seed, step]).choice(d, size=k, replace=False)
        return torch.from_numpy(np.sort(chosen)).to(device)

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        d = x.shape[1]
        k = self.k_for(d, density)
        idx = self.indices(d, k, step, x.device)
        vals = x.index_select(1, idx).float()
        reduced = comm.all_reduce(vals, tag="values")
        selected = torch.full((x.shape[0],), k, device=x.device)
        return Compressed(shared_aggregate(d, idx, reduced), SparseContribution(idx.unsqueeze(0), vals), selected,
                          index_based=True)
