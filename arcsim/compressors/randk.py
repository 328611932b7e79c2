"""Rand-K: indices drawn from a seed every worker shares, so only values travel, by all-reduce.

``scope="tensor"`` (default) draws k = max(1, ⌊ρ·n⌋) of every layer, ``"bucket"`` one k over the bucket.
Plain Rand-K sends the chosen values as they are: its update is E[C(x)] = ρ·x, biased by the density
(error feedback corrects this over steps; with ``--memory none`` it is simply ρ times too small).
``unbiased=True`` scales each kept value by n/k (the inverse of its chance of being drawn), so that
E[C(x)] = x, at the price of a variance (n/k − 1)·‖x‖².
"""

from __future__ import annotations

import numpy as np
import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, ScopedCompressor, SparseContribution, group_k, shared_aggregate
from arcsim.compressors.layout import Layer


class RandK(ScopedCompressor):
    name = "randk"

    def __init__(self, density: float = 0.01, seed: int = 0, scope: str = "tensor", unbiased: bool = False) -> None:
        super().__init__(density, seed, scope)
        self.unbiased = bool(unbiased)

    def indices(self, groups: list[tuple[int, int]], density: float, step: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The same distinct indices on every worker, drawn from (seed, step) group by group, and the
        scale of each (n/k of its group when unbiased, else 1)."""
        rng = np.random.default_rng([self.seed, step])
        picks, scales = [], []
        for off, n in groups:
            k = group_k(n, density)
            picks.append(off + np.sort(rng.choice(n, size=k, replace=False)))
            scales.append(np.full(k, n / k if self.unbiased else 1.0, dtype=np.float32))
        return (torch.from_numpy(np.concatenate(picks)).to(device),
                torch.from_numpy(np.concatenate(scales)).to(device))

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        d = x.shape[1]
        rho = self.rho(density)
        idx, scale = self.indices(self.groups(d, layout), rho, step, x.device)
        vals = x.index_select(1, idx).float()
        if self.unbiased:
            vals = vals * scale
        reduced = comm.all_reduce(vals, tag="values")
        selected = torch.full((x.shape[0],), idx.numel(), device=x.device)
        return Compressed(shared_aggregate(d, idx, reduced), SparseContribution(idx.unsqueeze(0), vals), selected,
                          index_based=True)
