"""AR-Top-K (Tyagi & Swany 2023): one leader's top-k indices are broadcast, then values are all-reduced.

STAR picks the leader round-robin (step mod P). VAR picks the worker whose *raw local gradient* has the
largest smoothed norm, found by an all-gather of P scalars, as the authors' code (sahiltyagi4/ARTopk,
var_topk.py): the norm of the gradient before error feedback, averaged over the last ``window`` steps
with weights (1 − α)^age (window 25, α = 0.001 there, so nearly a plain mean of the window). One
deliberate difference: until the window has filled, arcsim averages the norms seen so far, where the
reference reports 0 for every worker and so makes rank 0 the leader for the first 24 steps.
``scope="tensor"`` (default) makes the leader keep k = max(1, ⌊ρ·n⌋) of every layer; ``"bucket"`` one k
over the bucket (the reference compresses the whole model as one vector, i.e. bucket scope over it).
"""

from __future__ import annotations

from collections import deque

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, ScopedCompressor, SparseContribution, group_k, shared_aggregate
from arcsim.compressors.layout import Layer


class _LeaderTopK(ScopedCompressor):
    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        raise NotImplementedError

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        d = x.shape[1]
        rho = self.rho(density)
        groups = self.groups(d, layout)
        leader = self.leader(x, comm, step)
        row = comm.local_index(leader)
        if row is None:  # the broadcast's receive buffer: the same length on every rank
            k_total = sum(group_k(n, rho) for _, n in groups)
            mine = torch.zeros(1, k_total, dtype=torch.int32, device=x.device)
        else:
            mine = self.select(x, groups, rho, [row]).to(torch.int32)
        idx = comm.broadcast(mine, src=leader, tag="indices")[0].long()
        vals = x.index_select(1, idx).float()
        reduced = comm.all_reduce(vals, tag="values")
        selected = torch.full((x.shape[0],), idx.numel(), device=x.device)
        return Compressed(shared_aggregate(d, idx, reduced), SparseContribution(idx.unsqueeze(0), vals), selected,
                          index_based=True)


class Star(_LeaderTopK):
    name = "star"

    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        return step % comm.world_size


class Var(_LeaderTopK):
    name = "var"

    def __init__(self, density: float = 0.01, seed: int = 0, scope: str = "tensor", window: int = 25,
                 alpha: float = 0.001) -> None:
        super().__init__(density, seed, scope)
        self.alpha = alpha
        self.norms: deque[torch.Tensor] = deque(maxlen=window)  # [W] raw-gradient norms, oldest first
        self._raw: torch.Tensor | None = None

    def observe_gradient(self, g: torch.Tensor) -> None:
        self._raw = g.float().norm(dim=1)

    def smoothed(self) -> torch.Tensor:
        """[W]: the window's norms weighted by (1 − α)^age, newest age 1, normalised."""
        ages = torch.arange(len(self.norms), 0, -1, dtype=torch.float32)
        weights = (1 - self.alpha) ** ages
        return (torch.stack(list(self.norms)) * weights[:, None].to(self.norms[0].device)).sum(0) / weights.sum()

    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        # the raw gradient if a memory showed it this step, else the input is the gradient itself
        self.norms.append(self._raw if self._raw is not None else x.float().norm(dim=1))
        self._raw = None
        norms = comm.all_gather(self.smoothed().unsqueeze(1), tag="norms")  # [1, P, 1]
        return int(torch.argmax(norms.reshape(-1)))
