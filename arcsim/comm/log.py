"""CommLog: what a compressor asked the network to do, in a form the network backends can price."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

OPS = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall")
GROUPS = ("world", "node", "inter")  # every rank; the ranks of one node; one rank per node (a rail)
FIXED_TAGS = frozenset({"counts", "norms", "k", "lambda", "scales", "server-scales"})  # one scalar (or a few) per
#                                                                        worker (or per layer), whatever the size
ROOT_TAGS = frozenset({"sketch"})  # ARC-Top-K's sketch: a few numbers per ROW, and a square layer has √n rows
# a 1/ranks share of the tensor per rank (1-bit Adam's server chunks, all-gathered): on R ranks each sends R'/R of
# what each of the R' recorded ranks sent (:func:`on_ranks`), where other per-rank sizes do not depend on the ranks
SHARE_TAGS = frozenset({"server-signs"})


@dataclass(frozen=True)
class CommRecord:
    op: str  # allreduce | allgather | broadcast | reducescatter | alltoall
    tag: str  # the compressor phase: "values", "indices", "sketch", "P", "Q", …
    elements: int  # elements each rank contributes (reduce-scatter, all-to-all: its whole input)
    dtype: str  # torch dtype name, e.g. "float32"
    bytes_per_rank: int  # elements × item size
    total_bytes: int  # all-gather: the gathered output (bytes_per_rank × ranks); otherwise bytes_per_rank
    group: str = "world"  # the ranks it runs among (GROUPS); pricing maps a group to the links it uses

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CommLog:
    world_size: int
    group: str = "world"  # the group every collective of this log runs among
    records: list[CommRecord] = field(default_factory=list)

    def add(self, op: str, tag: str, t: torch.Tensor, elements: int) -> None:
        self.records.append(record(op, tag, t.element_size(), str(t.dtype).removeprefix("torch."), elements,
                                   self.world_size, self.group))

    def mark(self) -> int:
        return len(self.records)

    def since(self, mark: int) -> list[CommRecord]:
        return self.records[mark:]


def record(op: str, tag: str, item_size: int, dtype: str, elements: int, ranks: int, group: str = "world"
           ) -> CommRecord:
    """One collective of ``elements`` per rank among ``ranks`` ranks of ``group``."""
    per_rank = int(elements) * item_size
    total = per_rank * ranks if op == "allgather" else per_rank
    return CommRecord(op, tag, int(elements), dtype, per_rank, total, group)


def resized(r: CommRecord, elements: int) -> CommRecord:
    """``r`` carrying ``elements`` per rank instead (the same op, group, dtype and rank count)."""
    item = r.bytes_per_rank // max(1, r.elements)
    ranks = r.total_bytes // max(1, r.bytes_per_rank)
    per_rank = int(elements) * item
    return replace(r, elements=int(elements), bytes_per_rank=per_rank, total_bytes=per_rank * ranks)


def on_ranks(r: CommRecord, ranks: int) -> CommRecord:
    """``r`` as it is on ``ranks`` ranks: the same, except a share of the tensor per rank (SHARE_TAGS, all-gathered),
    which becomes (recorded ranks / ``ranks``) of what it was (at least one element)."""
    recorded = r.total_bytes // max(1, r.bytes_per_rank)
    if r.tag not in SHARE_TAGS or r.op != "allgather" or ranks == recorded or ranks < 1:
        return r
    item = r.bytes_per_rank // max(1, r.elements)
    per_rank = max(1, round(r.elements * recorded / ranks)) * item
    return replace(r, elements=per_rank // max(1, item), bytes_per_rank=per_rank, total_bytes=per_rank * ranks)


def scaled(r: CommRecord, factor: float) -> CommRecord:
    """What ``r`` is when the compressor runs on a tensor ``factor`` times as large: most tags grow with it,
    a sketch with its square root (rows), per-worker scalars not at all."""
    grow = 1.0 if r.tag in FIXED_TAGS else math.sqrt(factor) if r.tag in ROOT_TAGS else factor
    return resized(r, max(1, round(r.elements * grow)))
