"""Statistics of a trace, a column chunk of one step in memory at a time: norms, tails, worker agreement."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from arcsim.traces.format import Trace


@dataclass
class StepStats:
    step: int                    # training step
    loss: float
    worker_norm: float           # mean over workers of ||g_w||
    mean_norm: float             # ||mean_w g_w||
    kurtosis: float              # excess kurtosis of the entries, mean over workers (0 for a Gaussian)
    cosine_mean: float           # mean pairwise cosine similarity between workers
    cosine_min: float
    cosine_max: float
    agreement: float             # ||mean||² / mean_w ||g_w||²: 1 = identical workers, 1/W = orthogonal


class StepAccumulator:
    """Power sums and the worker Gram matrix over column chunks [W, c] of one step, in float64."""

    def __init__(self, workers: int) -> None:
        self.gram = torch.zeros(workers, workers, dtype=torch.float64)
        self.power = torch.zeros(4, workers, dtype=torch.float64)  # Σx, Σx², Σx³, Σx⁴ per worker
        self.n = 0

    def add(self, chunk: torch.Tensor) -> None:
        self.gram += (chunk @ chunk.T).double()
        x = chunk.double()
        x2 = x * x
        self.power += torch.stack([x.sum(1), x2.sum(1), (x2 * x).sum(1), (x2 * x2).sum(1)])
        self.n += chunk.shape[1]

    def result(self, step: int, loss: float) -> StepStats:
        w = self.gram.shape[0]
        sq = self.gram.diagonal().clamp_min(1e-300)
        norms = sq.sqrt()
        mean_sq = float(self.gram.sum()) / w**2
        if w > 1:
            cos = self.gram / torch.outer(norms, norms)
            off = cos[~torch.eye(w, dtype=torch.bool)]
            c_mean, c_min, c_max = float(off.mean()), float(off.min()), float(off.max())
        else:
            c_mean = c_min = c_max = 1.0
        m1, m2, m3, m4 = self.power / self.n
        var = m2 - m1**2
        central4 = m4 - 4 * m1 * m3 + 6 * m1**2 * m2 - 3 * m1**4
        kurt = torch.where(var > 0, central4 / var.clamp_min(1e-300) ** 2 - 3.0, torch.zeros_like(var))
        return StepStats(step, loss, float(norms.mean()), mean_sq**0.5, float(kurt.mean()), c_mean, c_min, c_max,
                         mean_sq / float(sq.mean()))


def step_stats(step: int, loss: float, g: torch.Tensor, chunk: int = 1 << 20) -> StepStats:
    """Statistics of one step's gradients [W, d] held in memory."""
    acc = StepAccumulator(g.shape[0])
    for part in g.split(chunk, dim=1):
        acc.add(part)
    return acc.result(step, loss)


def layer_summary(trace: Trace, top: int = 8) -> dict[str, Any]:
    """Layer counts and the largest layers, with their share of the parameters."""
    total = trace.elements
    largest = sorted(trace.layers, key=lambda la: la.numel, reverse=True)[:top]
    return {"count": len(trace.layers), "elements": total,
            "first_ready": trace.layers[0].name, "last_ready": trace.layers[-1].name,
            "largest": [{"name": la.name, "shape": list(la.shape), "numel": la.numel,
                         "share": la.numel / total} for la in largest]}


def trace_info(trace: Trace, with_stats: bool = True) -> dict[str, Any]:
    """Everything ``arcsim trace info`` shows, as plain data."""
    info: dict[str, Any] = {
        "path": str(trace.path), "size_bytes": trace.path.stat().st_size, "metadata": trace.meta,
        "gradient_dtype": str(trace.dtype), "layers": layer_summary(trace),
        "compute": {"device": trace.meta["device"], "forward_s": float(trace.forward_s.mean()),
                    "backward_s": float(trace.backward_s.mean())},
    }
    if with_stats:
        info["steps"] = []
        for i, step in enumerate(trace.recorded_steps):
            acc = StepAccumulator(trace.workers)
            for chunk in trace.step_chunks(i):
                acc.add(chunk)
            info["steps"].append(asdict(acc.result(step, float(trace.loss[i]))))
    return info
