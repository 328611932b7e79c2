"""One rank's local work without a network: what a rank computes, for timing it on this machine."""

from __future__ import annotations

import torch

from arcsim.comm.inprocess import Codec
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

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "", decode: Codec | None = None,
                       encode: Codec | None = None) -> torch.Tensor:
        """Its own chunk as if every peer sent the same (a payload decoded; a ring's hops encoded and decoded)."""
        mine = t[0, self.rank]
        if encode is not None and decode is not None:
            sent = encode(mine)
            self.log.add("reducescatter", tag, sent.unsqueeze(0), sent.numel() * self.world_size)
            for _ in range(self.world_size - 2):
                sent = encode(decode(sent) + mine)
            return (decode(sent) + mine).unsqueeze(0)
        self.log.add("reducescatter", tag, t, t[0].numel())
        return (mine if decode is None else decode(mine)).unsqueeze(0).clone()

    def subgroups(self, gpus_per_node: int) -> tuple[SoloComm, SoloComm]:
        """(node, inter) as this rank sees them, logging into this log."""
        g = int(gpus_per_node)
        node, inter = SoloComm(g, self.rank % g, self.leader), SoloComm(self.world_size // g, self.rank // g,
                                                                         self.leader)
        node.log, inter.log = (CommLog(c.world_size, name, self.log.records) for c, name in ((node, "node"),
                                                                                              (inter, "inter")))
        return node, inter

    def local_index(self, rank: int) -> int | None:
        return 0 if self.leader or rank == self.rank else None
