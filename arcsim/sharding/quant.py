"""Quantised reduce-scatter of gradients, measured on real gradients with real torch math.

The error is arcsim's aggregate error, as for DDP's compressors: ‖agg − x̄‖² / ‖x̄‖² with x̄ the exact mean
of the workers' gradients and agg what every rank ends up with. Ways of reducing:

- ``bf16``: each rank's gradient cast to bf16, summed in fp32 (a bf16 reduce-scatter's wire format);
- ``int8``: blockwise int8 (one fp32 scale per block of 256), quantised once at the sender and reduced in fp32
  at the receiver — ZeRO++'s one-hop all-to-all reduce-scatter;
- ``int8-hier``: qgZ: quantised, reduced inside each node, the node's partial sum quantised again and
  reduced across nodes (two quantisations);
- ``int8-ring``: what an int8 *ring* reduce-scatter would do: the running sum re-quantised at each of the
  P−1 hops (why ZeRO++ replaces the ring with all-to-all);
- ``int4-hier``: qgZ as published, with int4 (±7 per block).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from arcsim.errors import ArcsimError
from arcsim.sharding.schedule import QUANT_BLOCK

REDUCTIONS = ("bf16", "int8", "int8-hier", "int8-ring", "int4-hier")


def int8_blockwise(x: torch.Tensor, block: int = QUANT_BLOCK, bits: int = 8) -> torch.Tensor:
    """``x`` (…, n) quantised to ``bits``-bit signed integers (symmetric, ±(2^(bits−1)−1)) per block of
    ``block`` elements with a fp32 absmax scale, and back."""
    top = 2 ** (bits - 1) - 1
    n = x.shape[-1]
    pad = (-n) % block
    flat = torch.nn.functional.pad(x.float(), (0, pad)).reshape(*x.shape[:-1], -1, block)
    scale = flat.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / top
    q = torch.round(flat / scale).clamp(-top, top).to(torch.int8)
    return (q.float() * scale).reshape(*x.shape[:-1], -1)[..., :n]


def reduce_mean(grads: torch.Tensor, how: str, gpus_per_node: int) -> torch.Tensor:
    """The mean of ``grads`` (workers × elements) as ``how`` computes it."""
    p = grads.shape[0]
    if how == "bf16":
        return grads.to(torch.bfloat16).float().mean(0)
    if how == "int8":
        return int8_blockwise(grads).mean(0)
    if how in ("int8-hier", "int4-hier"):
        if p % gpus_per_node:
            raise ArcsimError(f"{p} workers are no whole number of {gpus_per_node}-GPU nodes")
        bits = 8 if how == "int8-hier" else 4
        nodes = int8_blockwise(grads, bits=bits).reshape(p // gpus_per_node, gpus_per_node, -1).sum(1)
        return int8_blockwise(nodes, bits=bits).sum(0) / p
    if how == "int8-ring":
        acc = int8_blockwise(grads[0])
        for w in range(1, p):
            acc = int8_blockwise(acc + grads[w]) if w < p - 1 else acc + int8_blockwise(grads[w])
        return acc / p
    raise ArcsimError(f"unknown reduction {how!r}; choose among {', '.join(REDUCTIONS)}")


@dataclass(frozen=True)
class ReductionError:
    how: str
    steps: int
    workers: int
    gpus_per_node: int
    rel_error_mean: float
    rel_error_max: float

    def to_dict(self) -> dict:
        return asdict(self)


def reduction_errors(steps: Iterable[torch.Tensor], gpus_per_node: int,
                     ways: tuple[str, ...] = REDUCTIONS) -> list[ReductionError]:
    """The aggregate error of each way of reducing, over the steps (each workers × elements)."""
    errors: dict[str, list[float]] = {w: [] for w in ways}
    workers = 0
    for grads in steps:
        grads = grads.float()
        workers = grads.shape[0]
        exact = grads.mean(0)
        scale = float(exact.pow(2).sum())
        if scale == 0:
            continue
        for w in ways:
            errors[w].append(float((reduce_mean(grads, w, gpus_per_node) - exact).pow(2).sum()) / scale)
    if not any(errors.values()):
        raise ArcsimError("the trace has no step with a non-zero mean gradient to measure an error against")
    return [ReductionError(w, len(e), workers, gpus_per_node, sum(e) / len(e), max(e)) for w, e in errors.items()]


def trace_errors(trace: str | None, gpus_per_node: int | None = None) -> tuple[str, list[ReductionError]]:
    """The errors on a gradient trace (None: the shipped default); ``gpus_per_node`` defaults to half its
    workers (two nodes)."""
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    path = resolve_trace(trace, allow_capture=False)
    tr = open_trace(path)
    g = gpus_per_node or max(tr.workers // 2, 1)
    return str(path), reduction_errors((g_ for _, g_ in tr.steps_iter()), g)
