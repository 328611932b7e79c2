"""All P workers in one process, stacked on the leading axis; collectives are arithmetic over it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from arcsim.comm.log import CommLog

Codec = Callable[[torch.Tensor], torch.Tensor]


def _reduce(got: torch.Tensor, op: str, ranks: int, dim: int) -> torch.Tensor:
    """The sum (or mean over ``ranks``) of ``got`` along ``dim`` in fp32 (fp64 stays fp64), in rank order."""
    if op not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {op!r}")
    acc = got.sum(dim=dim, dtype=torch.float64 if got.dtype == torch.float64 else torch.float32)
    if op == "mean":
        acc /= ranks
    return acc


def ring_chunks(t: torch.Tensor, encode: Codec, decode: Codec) -> tuple[torch.Tensor, torch.Tensor]:
    """A ring reduce-scatter of ``t`` [P, P, …] (worker, chunk) whose wire carries ``encode(partial sum)``: chunk j
    starts at rank j+1 and goes round to its owner j, each rank adding its own chunk in fp32 to the decoded partial
    and encoding the sum again for the next hop (the owner adds its own last, unencoded). Returns the sums [P, …]
    (row j: chunk j, held by rank j) and the first hop's payloads (their size is the wire's)."""
    p = t.shape[0]
    chunks = torch.arange(p, device=t.device)
    sent = encode(t[(chunks + 1) % p, chunks])
    first = sent
    for s in range(1, p - 1):
        sent = encode(decode(sent) + t[(chunks + 1 + s) % p, chunks])
    return decode(sent) + t[chunks, chunks], first


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

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "", decode: Codec | None = None,
                       encode: Codec | None = None) -> torch.Tensor:
        self._check(t)
        return InProcessGroup.scatter(self, t, torch.arange(self.world_size, device=t.device).unsqueeze(0), op, tag,
                                      decode, encode)

    def subgroups(self, gpus_per_node: int) -> tuple[InProcessGroup, InProcessGroup]:
        return subgroups_of(self, gpus_per_node)

    def local_index(self, rank: int) -> int | None:
        return rank


def subgroups_of(comm: InProcessComm, gpus_per_node: int) -> tuple[InProcessGroup, InProcessGroup]:
    """(node, inter): the stacked workers as nodes of ``gpus_per_node`` (worker w on node w // G) and as rails
    (the workers of one local rank w % G), logging into ``comm``'s log."""
    p, g = comm.world_size, gpus_per_node
    if g < 1 or p % g:
        raise ValueError(f"{p} workers are no whole number of {g}-GPU nodes")
    ranks = torch.arange(p).reshape(p // g, g)
    return InProcessGroup(comm, ranks, "node"), InProcessGroup(comm, ranks.T.contiguous(), "inter")


class InProcessGroup:
    """The stacked workers of an :class:`InProcessComm` split into equal groups (``members`` [groups, size]: the
    workers of each group in its rank order), each running its collectives among its own members. Results keep
    the worker axis, since they differ between groups: ``reduce_scatter`` → [W, …] as the world's, ``all_gather``
    → [W, size, k] (worker w: its group's rows)."""

    def __init__(self, parent: InProcessComm, members: torch.Tensor, group: str) -> None:
        self.members, self.world_size = members, members.shape[1]
        self.log = CommLog(self.world_size, group, parent.log.records)  # one log, each record naming its group
        self.parent = parent

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "", decode: Codec | None = None,
                       encode: Codec | None = None) -> torch.Tensor:
        self.parent._check(t)
        return self.scatter(self, t, self.members.to(t.device), op, tag, decode, encode)

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.parent._check(t)
        self.log.add("allgather", tag, t, t[0].numel())
        m = self.members.to(t.device)
        rows = t[m]  # [groups, size, …]
        out = torch.empty((t.shape[0], *rows.shape[1:]), dtype=t.dtype, device=t.device)
        out[m.reshape(-1)] = rows.unsqueeze(1).expand(-1, m.shape[1], *rows.shape[1:]).reshape(-1, *rows.shape[1:])
        return out

    @staticmethod
    def scatter(comm: InProcessComm | InProcessGroup, t: torch.Tensor, members: torch.Tensor, op: str, tag: str,
                decode: Codec | None, encode: Codec | None) -> torch.Tensor:
        """Reduce-scatter ``t`` [W, size, …] within each group of ``members``, logged in ``comm``'s log."""
        size = members.shape[1]
        if t.dim() < 2 or t.shape[1] != size:
            raise ValueError(f"expected [workers, {size} chunks, …], got shape {tuple(t.shape)}")
        got = t[members]  # [groups, sender, chunk, …]
        if encode is not None:  # a ring, re-encoding the partial sum at each hop
            if decode is None:
                raise ValueError("a re-encoding ring reduce-scatter needs decode as well as encode")
            out, first = _rings(got, encode, decode)
            comm.log.add("reducescatter", tag, first, first[0].numel() * size)
            if op == "mean":
                out = out / size
            elif op != "sum":
                raise ValueError(f"unknown reduction {op!r}")
        else:
            comm.log.add("reducescatter", tag, t, t[0].numel())
            received = got.transpose(1, 2)  # [groups, receiver, sender, …]
            if decode is not None:
                out = _reduce(decode(received), op, size, 2)
            else:
                out = _reduce(received, op, size, 2).to(t.dtype)
            out = out.reshape(-1, *out.shape[2:])
        result = torch.empty((t.shape[0], *out.shape[1:]), dtype=out.dtype, device=out.device)
        result[members.reshape(-1)] = out
        return result


def _rings(got: torch.Tensor, encode: Codec, decode: Codec) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ring_chunks` of each group (``got`` [groups, sender, chunk, …]), stacked in the groups' order."""
    outs, firsts = zip(*(ring_chunks(g, encode, decode) for g in got), strict=True)
    return torch.cat(outs), torch.cat(firsts)
