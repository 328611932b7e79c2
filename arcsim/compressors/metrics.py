"""Fidelity of one compressed step, measured against what dense training would apply."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from arcsim.comm.log import CommRecord
from arcsim.compressors.base import Compressed


@dataclass
class StepMetrics:
    step: int
    density_achieved: float  # mean over workers of elements selected / d
    density_aggregate: float  # nonzeros of the aggregate / d
    rel_error: float  # ‖agg − x̄‖² / ‖x̄‖², x̄ the mean of what was compressed (or the compressor's reference)
    energy_captured: float  # ‖agg‖² / ‖x̄‖²
    overlap_topk: float | None  # share of the global top-k of x̄ inside the aggregate's support
    bytes_per_rank: int
    update_error: float = 0.0  # ‖update − ḡ‖² / ‖ḡ‖²: the applied update against dense training's mean gradient
    collectives: list[dict] = field(default_factory=list)
    dense_step: bool = False  # EF21/EF21M's first step is sent dense

    def to_dict(self) -> dict:
        return asdict(self)


def fidelity(u: torch.Tensor, out: Compressed, k: int) -> dict[str, float | None]:
    """Metrics for the stacked input u [P, d] (all workers) and its compressed aggregate."""
    d = u.shape[1]
    mean = u.float().mean(dim=0, keepdim=True) if out.reference is None else out.reference.float()
    agg = out.aggregate.float()
    energy = float(mean.pow(2).sum())
    scale = energy if energy > 0 else 1.0
    overlap = None
    if out.index_based:
        top = mean.abs().topk(min(k, d), dim=1).indices
        overlap = float((agg[0, top[0]] != 0).float().mean())
    return {
        "density_achieved": float(out.selected.float().mean()) / d,
        "density_aggregate": float((agg != 0).sum()) / d,
        "rel_error": float((agg - mean).pow(2).sum()) / scale,
        "energy_captured": float(agg.pow(2).sum()) / scale,
        "overlap_topk": overlap,
    }


def update_error(update: torch.Tensor, g: torch.Tensor) -> float:
    """‖update − ḡ‖² / ‖ḡ‖² for the stacked raw gradients g [P, d]."""
    mean = g.float().mean(dim=0, keepdim=True)
    energy = float(mean.pow(2).sum())
    return float((update.float() - mean).pow(2).sum()) / (energy if energy > 0 else 1.0)


def records_summary(records: list[CommRecord]) -> tuple[int, list[dict]]:
    return sum(r.bytes_per_rank for r in records), [
        {"op": r.op, "tag": r.tag, "elements": r.elements, "dtype": r.dtype, "bytes_per_rank": r.bytes_per_rank}
        for r in records
    ]
