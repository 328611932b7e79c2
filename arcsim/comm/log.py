"""CommLog: what a compressor asked the network to do, in a form the network backends can price."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

OPS = ("allreduce", "allgather", "broadcast", "reducescatter")
GROUPS = ("world", "node", "inter")  # every rank; the ranks of one node; one rank per node (a rail)
FIXED_TAGS = frozenset({"counts", "norms", "k", "lambda"})  # one scalar (or a few) per worker, whatever the size
ROOT_TAGS = frozenset({"sketch"})  # ARC-Top-K's sketch: a few numbers per ROW, and a square layer has √n rows


@dataclass(frozen=True)
class CommRecord:
    op: str  # allreduce | allgather | broadcast | reducescatter
    tag: str  # the compressor phase: "values", "indices", "sketch", "P", "Q", …
    elements: int  # elements each rank contributes (reduce-scatter: its whole input)
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


def scaled(r: CommRecord, factor: float) -> CommRecord:
    """What ``r`` is when the compressor runs on a tensor ``factor`` times as large: most tags grow with it,
    a sketch with its square root (rows), per-worker scalars not at all."""
    grow = 1.0 if r.tag in FIXED_TAGS else math.sqrt(factor) if r.tag in ROOT_TAGS else factor
    return resized(r, max(1, round(r.elements * grow)))
