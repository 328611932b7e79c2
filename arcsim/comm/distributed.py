"""One worker per process: collectives call torch.distributed on the current process group."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from arcsim.comm.inprocess import Codec, _reduce
from arcsim.comm.log import CommLog


def run_gloo_job(work: Callable[[], None]) -> None:
    """One rank of a gloo job (env: RANK, WORLD_SIZE, MASTER_*): ``work()``, then a barrier and an exit
    without C++ tear-down; on an exception, the usual tear-down and the exception.

    gloo can abort a rank at shutdown ("terminate called without an active exception") when a peer closes
    its sockets while this rank's threads are being destroyed. Seen about once in 18 validation runs over
    the emulated cluster's delayed links; once every rank has passed the barrier there is nothing left to
    tear down that the kernel does not clean up on exit.
    """
    dist.init_process_group("gloo")
    try:
        work()
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# torch 2.13 renamed all_gather_into_tensor (the old name warns); older releases have only the old name
gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# likewise reduce_scatter_tensor → reduce_scatter_single
scatter_from = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class InNodeComm:
    """The dense steps of node-aware compression inside a node (``group``): a reduce-scatter and an all-gather
    into the caller's tensors. The caller logs them (as the priced node's, ``hierarchy.in_node_records``)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        scatter_from(out, t, group=self.group)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        gather_into(out, t, group=self.group)


class DistributedComm:
    def __init__(self, group: dist.ProcessGroup | None = None, name: str = "world") -> None:
        """``group``: the process group its collectives run on; ``name``: what that group is in the job
        (arcsim.comm.log.GROUPS), named in each record."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_process_group first")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.log = CommLog(self.world_size, name)
        self._subgroups: dict[int, tuple[DistributedComm, DistributedComm]] = {}

    def all_reduce(self, t: torch.Tensor, op: str = "mean", tag: str = "") -> torch.Tensor:
        self.log.add("allreduce", tag, t, t[0].numel())
        if op not in ("mean", "sum"):
            raise ValueError(f"unknown reduction {op!r}")
        out = t[0:1].clone()
        low_precision = out.dtype in (torch.float16, torch.bfloat16)
        if op == "mean" and low_precision:  # divide first, as PyTorch's fp16 hook: a sum of P halves overflows
            out /= self.world_size
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        if op == "mean" and not low_precision:
            out /= self.world_size
        return out

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.log.add("allgather", tag, t, t[0].numel())
        out = torch.empty((self.world_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        gather_into(out, t[0:1].contiguous(), group=self.group)
        return out.unsqueeze(0)

    def all_to_all(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.log.add("alltoall", tag, t, t[0].numel())
        if t.shape[1] != self.world_size:
            raise ValueError(f"expected [1, {self.world_size} chunks, …], got shape {tuple(t.shape)}")
        out = torch.empty_like(t[0])
        dist.all_to_all_single(out, t[0].contiguous(), group=self.group)
        return out.unsqueeze(0)

    def broadcast(self, t: torch.Tensor, src: int, tag: str = "") -> torch.Tensor:
        self.log.add("broadcast", tag, t, t[0].numel())
        out = t[0:1].clone()
        root = src if self.group is None else dist.get_global_rank(self.group, src)  # src is the group's rank
        dist.broadcast(out, src=root, group=self.group)
        return out

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "", decode: Codec | None = None,
                       encode: Codec | None = None) -> torch.Tensor:
        """This rank's chunk of the reduction (``t`` [1, P, …], chunk j for rank j) as [1, …]: a reduce-scatter
        (no codec), an all-to-all of the payloads decoded and reduced here in rank order (``decode``), or a ring
        whose hops carry ``encode`` of the partial sum (both)."""
        if t.shape[1] != self.world_size:
            raise ValueError(f"expected [1, {self.world_size} chunks, …], got shape {tuple(t.shape)}")
        if op not in ("mean", "sum"):
            raise ValueError(f"unknown reduction {op!r}")
        if encode is not None:
            if decode is None:
                raise ValueError("a re-encoding ring reduce-scatter needs decode as well as encode")
            return self._ring(t[0], op, tag, encode, decode)
        self.log.add("reducescatter", tag, t, t[0].numel())
        if decode is not None:
            got = torch.empty_like(t[0])
            dist.all_to_all_single(got, t[0].contiguous(), group=self.group)
            return _reduce(decode(got), op, self.world_size, 0).unsqueeze(0)
        chunks = t[0].contiguous()
        low_precision = chunks.dtype in (torch.float16, torch.bfloat16)
        if op == "mean" and low_precision:  # divide first, as all_reduce: a sum of P halves overflows
            chunks = chunks / self.world_size
        out = torch.empty(chunks[0].numel(), dtype=chunks.dtype, device=chunks.device)
        scatter_from(out, chunks.reshape(-1), group=self.group)
        if op == "mean" and not low_precision:
            out /= self.world_size
        return out.view(1, *chunks.shape[1:])

    def _ring(self, chunks: torch.Tensor, op: str, tag: str, encode: Codec, decode: Codec) -> torch.Tensor:
        """Rank r sends chunk r−s−1's partial at hop s to rank r+1: chunk j starts at rank j+1 and ends at j
        (arcsim.comm.inprocess.ring_chunks, the same arithmetic)."""
        p, r = self.world_size, self.rank
        sent = encode(chunks[(r - 1) % p])
        self.log.add("reducescatter", tag, sent.unsqueeze(0), sent.numel() * p)
        peer = (lambda q: q) if self.group is None else (lambda q: dist.get_global_rank(self.group, q))
        got = torch.empty_like(sent)
        for s in range(p - 1):
            req = dist.isend(sent.contiguous(), dst=peer((r + 1) % p), group=self.group)
            dist.recv(got, src=peer((r - 1) % p), group=self.group)
            if req is not None:
                req.wait()
            mine = chunks[(r - s - 2) % p]
            if s < p - 2:
                sent = encode(decode(got) + mine)
        out = decode(got) + mine
        return (out / p if op == "mean" else out).unsqueeze(0)

    def subgroups(self, gpus_per_node: int) -> tuple[DistributedComm, DistributedComm]:
        """(node, inter) of this job's ranks as nodes of ``gpus_per_node`` (rank r on node r // G), logging into
        this log; made once (every rank makes every group, in the same order, as new_group requires)."""
        key = int(gpus_per_node)
        cached = self._subgroups
        if key not in cached:
            p, g = self.world_size, key
            if self.group is not None:
                raise ValueError("nodes and rails are groups of the world's ranks; split the world's communicator")
            if g < 1 or p % g:
                raise ValueError(f"{p} ranks are no whole number of {g}-GPU nodes")
            node = inter = None
            for n in range(p // g):
                grp = dist.new_group(list(range(n * g, (n + 1) * g)))
                node = grp if self.rank // g == n else node
            for lr in range(g):
                grp = dist.new_group(list(range(lr, p, g)))
                inter = grp if self.rank % g == lr else inter
            made = (DistributedComm(node, "node"), DistributedComm(inter, "inter"))
            for c in made:
                c.log.records = self.log.records
            cached[key] = made
        return cached[key]

    def local_index(self, rank: int) -> int | None:
        return 0 if rank == self.rank else None
