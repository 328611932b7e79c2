"""CommLog: what a compressor asked the network to do, in a form the network backends can price."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

OPS = ("allreduce", "allgather", "broadcast")


@dataclass(frozen=True)
class CommRecord:
    op: str  # allreduce | allgather | broadcast
    tag: str  # the compressor phase: "values", "indices", "sketch", "P", "Q", …
    elements: int  # elements each rank contributes
    dtype: str  # torch dtype name, e.g. "float32"
    bytes_per_rank: int  # elements × item size
    total_bytes: int  # all-gather: the gathered output (bytes_per_rank × ranks); otherwise bytes_per_rank

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CommLog:
    world_size: int
    records: list[CommRecord] = field(default_factory=list)

    def add(self, op: str, tag: str, t: torch.Tensor, elements: int) -> None:
        item = t.element_size()
        per_rank = int(elements) * item
        total = per_rank * self.world_size if op == "allgather" else per_rank
        self.records.append(CommRecord(op, tag, int(elements), str(t.dtype).removeprefix("torch."), per_rank, total))

    def mark(self) -> int:
        return len(self.records)

    def since(self, mark: int) -> list[CommRecord]:
        return self.records[mark:]
