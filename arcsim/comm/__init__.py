"""The Communicator seam: compressors call collectives here and never know where they run.

Shape convention, shared by both implementations: a tensor handed to a collective has a leading
axis of *local workers* — all P simulated workers in-process, 1 under torch.distributed. What comes
back is replicated, so it has a leading axis of 1:
- ``all_reduce(t[W, …])`` → ``[1, …]``, the mean (or sum) over all P workers;
- ``all_gather(t[W, k])`` → ``[1, P, k]``, every worker's ``t`` in rank order;
- ``all_to_all(t[W, P, …])`` → ``[W, P, …]``: local worker w receives chunk w of every worker's ``t``, in rank
  order (out[w, j] = t[j, w] in-process); each rank sends all of its ``t`` (its chunk to itself stays home);
- ``broadcast(t, src)`` → ``[1, …]``, worker ``src``'s value; ``t`` may be ``[W, …]`` or just ``[1, …]``
  holding src's row where this process holds it (see :meth:`Communicator.local_index`).
- ``reduce_scatter(t[W, P, …])`` → ``[W, …]``: local worker w receives the sum (or mean) over all P workers of their
  chunk w; ``decode`` makes ``t`` a payload (any dtype, e.g. packed int8 and its scales) that travels as it is and
  is decoded and reduced in fp32 by the receiver, in rank order (ZeRO++'s all-to-all reduce-scatter); ``encode`` as
  well makes it a ring whose hops carry ``encode`` of the running sum (:func:`arcsim.comm.inprocess.ring_chunks`).
  Recorded as ``reducescatter`` of the whole input (payload) per rank, the size arcsim.pricing prices;
- ``subgroups(G)`` → (node, inter): the same workers as nodes of G and as rails (one local rank of every node),
  whose collectives run within each group and log into the same log, each record naming its group; their
  results keep the worker axis (they differ between groups): ``all_gather(t[W, k])`` → ``[W, size, k]``.
Every call is appended to ``comm.log`` with the caller's ``tag``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

from arcsim.comm.log import CommLog, CommRecord


class GroupComm(Protocol):
    """One level of a communicator's :meth:`Communicator.subgroups`: a node or a rail."""

    world_size: int
    log: CommLog

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor: ...

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "",
                       decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       encode: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor: ...


class Communicator(Protocol):
    world_size: int
    log: CommLog

    def all_reduce(self, t: torch.Tensor, op: str = "mean", tag: str = "") -> torch.Tensor: ...

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor: ...

    def all_to_all(self, t: torch.Tensor, tag: str = "") -> torch.Tensor: ...

    def broadcast(self, t: torch.Tensor, src: int, tag: str = "") -> torch.Tensor: ...

    def reduce_scatter(self, t: torch.Tensor, op: str = "mean", tag: str = "",
                       decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       encode: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor: ...

    def subgroups(self, gpus_per_node: int) -> tuple[GroupComm, GroupComm]: ...

    def local_index(self, rank: int) -> int | None:
        """Row of the local-worker axis that holds global ``rank``, or None if another process does."""
        ...


__all__ = ["CommLog", "CommRecord", "Communicator", "GroupComm"]
