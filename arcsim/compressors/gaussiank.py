"""Gaussian-k (Shi et al. 2019): approximate top-k by a threshold from the mean and standard deviation.

t = |μ| + |Φ⁻¹(ρ/2)|·σ; select |x| > t; up to 3 refinements (fewer than 2k/3 selected: halve t; more
than 4k/3: t × 1.5). Counts differ per worker, so they are all-gathered first and values and indices
are all-gathered padded to the largest count (what an all-gather of equal-sized buffers must send).
Achieved density is reported next to the requested one: on heavy tails it can miss k by a lot.
"""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, Layer, SparseContribution, sparse_aggregate

REFINEMENTS = 3


class GaussianK(Compressor):
    name = "gaussiank"
    all_reduce_compatible = False

    def thresholds(self, x: torch.Tensor, k: int, density: float) -> torch.Tensor:
        """Per-worker threshold [W, 1] after the refinement loop (one worker at a time: O(d) scratch)."""
        z = float(torch.special.ndtri(torch.tensor(density / 2, dtype=torch.float64)).abs())
        return torch.stack([self._row_threshold(row, k, z) for row in x]).unsqueeze(1)

    @staticmethod
    def _row_threshold(row: torch.Tensor, k: int, z: float) -> torch.Tensor:
        t = row.mean().abs() + z * row.std()
        mag = row.abs()
        for _ in range(REFINEMENTS):
            count = int((mag > t).sum())
            if count < 2 * k / 3:
                t = t / 2
            elif count > 4 * k / 3:
                t = t * 1.5
            else:
                break
        return t

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        rho = self.density if density is None else density
        k = self.k_for(x.shape[1], rho)
        t = self.thresholds(x, k, rho)
        picks = [torch.nonzero(x[w].abs() > t[w], as_tuple=True)[0] for w in range(x.shape[0])]
        counts = torch.tensor([[p.numel()] for p in picks], dtype=torch.int32, device=x.device)
        width = max(1, int(comm.all_gather(counts, tag="counts").max()))
        idx = torch.zeros(x.shape[0], width, dtype=torch.int64, device=x.device)
        vals = torch.zeros(x.shape[0], width, dtype=torch.float32, device=x.device)
        for w, p in enumerate(picks):  # ragged rows; padding carries value 0 at index 0
            idx[w, :p.numel()] = p
            vals[w, :p.numel()] = x[w, p]
        gathered_vals = comm.all_gather(vals, tag="values")
        gathered_idx = comm.all_gather(idx.to(torch.int32), tag="indices")
        agg = sparse_aggregate(x.shape[1], gathered_idx, gathered_vals, comm.world_size)
        return Compressed(agg, SparseContribution(idx, vals), counts[:, 0].to(torch.int64), index_based=True)
