"""All P workers in one process, stacked on the leading axis; collectives are arithmetic over it."""

from __future__ import annotations

import torch

from arcsim.comm.log import CommLog


class InProcessComm:
    def __init__(self, world_size: int, group: str = "world") -> None:
        """``group``: what the stacked workers are in the job (arcsim.comm.log.GROUPS), named in each record."""
        if world_size < 2:
            raise ValueError("a communicator needs at least 2 workers")
        self.world_size = world_size
        self.log = CommLog(world_size, group)

    def _check(self, t: torch.Tensor) -> None:
        if t.shape[0] != self.world_size:
            raise ValueError(f"expected a leading worker axis of {self.world_size}, got shape {tuple(t.shape)}")

    def all_reduce(self, t: torch.Tensor, op: str = "mean", tag: str = "") -> torch.Tensor:
        self._check(t)
        self.log.add("allreduce", tag, t, t[0].numel())
        acc = t.sum(dim=0, keepdim=True, dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
        if op == "mean":
            acc /= self.world_size
        elif op != "sum":
            raise ValueError(f"unknown reduction {op!r}")
        return acc.to(t.dtype)

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self._check(t)
        self.log.add("allgather", tag, t, t[0].numel())
        return t.unsqueeze(0)

    def all_to_all(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self._check(t)
        if t.dim() < 2 or t.shape[1] != self.world_size:
            raise ValueError(f"expected [workers, {self.world_size} chunks, …], got shape {tuple(t.shape)}")
        self.log.add("alltoall", tag, t, t[0].numel())
        return t.transpose(0, 1).contiguous()

    def broadcast(self, t: torch.Tensor, src: int, tag: str = "") -> torch.Tensor:
        row = t[src:src + 1] if t.shape[0] == self.world_size else t
        self.log.add("broadcast", tag, row, row[0].numel())
        return row

    def local_index(self, rank: int) -> int | None:
        return rank
