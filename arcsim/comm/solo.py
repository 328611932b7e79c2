"""One rank's local work without a network: what a rank computes, for timing it on this machine."""

from __future__ import annotations

import torch

from arcsim.comm.log import CommLog


class SoloComm:
    """Rank ``rank`` of ``world`` alone: reductions return its own row, gathers repeat it ``world`` times, an
    all-to-all gives it its own chunk from every peer.

    The arithmetic a compressor does is one rank's (the values are not a real aggregate). ``leader=True``
    makes this rank the root of every broadcast, so AR-Top-K's leader work is included.
    """

    def __init__(self, world: int, rank: int = 0, leader: bool = False) -> None:
        self.world_size, self.rank, self.leader = world, rank, leader
        self.log = CommLog(world)

    def all_reduce(self, t: torch.Tensor, op: str = "mean", tag: str = "") -> torch.Tensor:
        self.log.add("allreduce", tag, t, t[0].numel())
        return t[0:1].clone()

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.log.add("allgather", tag, t, t[0].numel())
        return t[0:1].expand(self.world_size, *t.shape[1:]).unsqueeze(0)

    def all_to_all(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.log.add("alltoall", tag, t, t[0].numel())
        mine = t[0:1, self.rank:self.rank + 1]  # what this rank sends itself, as if every peer sent the same
        return mine.expand(1, self.world_size, *t.shape[2:]).clone()

    def broadcast(self, t: torch.Tensor, src: int, tag: str = "") -> torch.Tensor:
        self.log.add("broadcast", tag, t, t[0].numel())
        return t[0:1].clone()

    def local_index(self, rank: int) -> int | None:
        return 0 if self.leader or rank == self.rank else None
