"""Gaussian-k (Shi et al. 2019): approximate top-k by a threshold from the mean and standard deviation.

As the authors' code (hclhkbu/GaussianK-SGD, GaussianCompressor): t = μ + |Φ⁻¹(ρ/2)|·σ with the signed
mean μ and the unbiased σ of the vector; select |x| > t; evaluate at most 3 thresholds: after each
count, fewer than 2k/3 selected halves t, more than 4k/3 multiplies it by 1.5, else stop. The
selection is the last *evaluated* threshold's (the reference adjusts t a third time without using it).
``scope="tensor"`` (default, as the reference, which compresses tensor by tensor) thresholds every layer
on its own statistics with its own k; ``"bucket"`` thresholds the whole bucket at once.
Counts differ per worker, so they are all-gathered first and values and indices are all-gathered
(packed into one, as Top-K) padded to the largest count (what an all-gather of equal-sized buffers must
send). Achieved density is reported next to the requested one: on heavy tails it can miss k by a lot.
"""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, GatheringCompressor, SparseContribution, group_k, sparse_aggregate
from arcsim.compressors.layout import Layer

EVALUATIONS = 3


def gaussian_selection(row: torch.Tensor, mag: torch.Tensor, k: int, z: float) -> torch.Tensor:
    """What the reference selects from one worker's 1-D ``row`` (``mag`` = |row|) for target ``k``: the mask
    of |x| above the last threshold it evaluated (kept from that count, not compared again).

    A part with k ≥ n keeps everything (the reference's σ of one element is NaN and selects nothing).
    """
    if k >= row.numel():
        return torch.ones_like(mag, dtype=torch.bool)
    t = row.mean() + z * row.std()
    for _ in range(EVALUATIONS):
        above = mag > t
        count = int(torch.count_nonzero(above))  # not above.sum(): that copies the bools into int64 first
        if count < 2 * k / 3:
            t = t * 0.5
        elif count > 4 * k / 3:
            t = t * 1.5
        else:
            break
    return above


class GaussianK(GatheringCompressor):
    name = "gaussiank"

    def picks(self, row: torch.Tensor, groups: list[tuple[int, int]], density: float) -> torch.Tensor:
        """Indices one worker selects (ascending within each group)."""
        z = float(torch.special.ndtri(torch.tensor(density / 2, dtype=torch.float64)).abs())
        parts = []
        for off, n in groups:
            part = row[off:off + n]
            selected = gaussian_selection(part, part.abs(), group_k(n, density), z)
            parts.append(off + torch.nonzero(selected, as_tuple=True)[0])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        rho = self.rho(density)
        groups = self.groups(x.shape[1], layout)
        picks = [self.picks(x[w], groups, rho) for w in range(x.shape[0])]
        counts = torch.tensor([[p.numel()] for p in picks], dtype=torch.int32, device=x.device)
        width = max(1, int(comm.all_gather(counts, tag="counts").max()))
        idx = torch.zeros(x.shape[0], width, dtype=torch.int64, device=x.device)
        vals = torch.zeros(x.shape[0], width, dtype=torch.float32, device=x.device)
        for w, p in enumerate(picks):  # ragged rows; padding carries value 0 at index 0
            idx[w, :p.numel()] = p
            vals[w, :p.numel()] = x[w, p]
        gathered_vals, gathered_idx = self.gather(comm, vals, idx)
        agg = sparse_aggregate(x.shape[1], gathered_idx, gathered_vals, comm.world_size)
        return Compressed(agg, SparseContribution(idx, vals), counts[:, 0].to(torch.int64), index_based=True)
