"""AR-Top-K (Tyagi & Swany 2023): one leader's top-k indices are broadcast, then values are all-reduced.

STAR picks the leader round-robin (step mod P). VAR picks the worker with the largest smoothed local
gradient norm (exponential average, factor ``smoothing``), found by an all-gather of P scalars.
"""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, Layer, SparseContribution, shared_aggregate


class _LeaderTopK(Compressor):
    all_reduce_compatible = True

    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        raise NotImplementedError

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        d = x.shape[1]
        k = self.k_for(d, density)
        leader = self.leader(x, comm, step)
        row = comm.local_index(leader)
        if row is None:
            mine = torch.zeros(1, k, dtype=torch.int32, device=x.device)
        else:
            mine = x[row].abs().topk(k, sorted=False).indices.to(torch.int32).unsqueeze(0)
        idx = comm.broadcast(mine, src=leader, tag="indices")[0].long()
        vals = x.index_select(1, idx).float()
        reduced = comm.all_reduce(vals, tag="values")
        selected = torch.full((x.shape[0],), k, device=x.device)
        return Compressed(shared_aggregate(d, idx, reduced), SparseContribution(idx.unsqueeze(0), vals), selected,
                          index_based=True)


class Star(_LeaderTopK):
    name = "star"

    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        return step % comm.world_size


class Var(_LeaderTopK):
    name = "var"

    def __init__(self, density: float = 0.01, seed: int = 0, smoothing: float = 0.9) -> None:
        super().__init__(density, seed)
        self.smoothing = smoothing
        self._norm: torch.Tensor | None = None  # [W] smoothed norm of each local worker

    def leader(self, x: torch.Tensor, comm: Communicator, step: int) -> int:
        norm = x.float().norm(dim=1)
        self._norm = norm if self._norm is None else self.smoothing * self._norm + (1 - self.smoothing) * norm
        norms = comm.all_gather(self._norm.unsqueeze(1), tag="norms")  # [1, P, 1]
        return int(torch.argmax(norms.reshape(-1)))
