"""`arcsim compress --trace`: a compressor with its memory over a trace a group of layers at a time, never
holding a whole step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.memory import Memory
from arcsim.compressors.metrics import StepMetrics, records_summary
from arcsim.strategy.buckets import make_buckets
from arcsim.traces.format import Trace

STREAM_GROUP_BYTES = 4 * 2**20  # compress_streamed: layers per group, fp32 bytes per worker


def compress_streamed(trace: Trace, make: Callable[[int], tuple[Compressor, Memory]],
                      group_bytes: float = STREAM_GROUP_BYTES) -> Iterator[StepMetrics]:
    """:func:`~arcsim.compressors.session.compress_steps` over a trace without ever holding a whole step: its layers in
    groups of at most ``group_bytes`` of fp32 per worker (a larger layer alone), each group with its own compressor and
    memory from ``make(group index)``, read from the file a group at a time. What it measures is the whole vector's:
    sums over the groups, and the overlap with the global top-k of the mean, kept as a running top-k (k candidates, each
    with whether the aggregate holds it). For compressors that select per layer (scope tensor) without random draws it
    equals ``compress_steps`` on the whole vector (tested); Rand-K and PowerSGD draw per group, and var and adaptive
    decide per group, as they would per DDP bucket."""
    groups = make_buckets(trace.layers, [0.0] * len(trace.layers), group_bytes)
    parts = [make(g.index) for g in groups]
    layouts = [g.layout() for g in groups]
    d = trace.elements
    k = min(parts[0][0].k_for(d), d)
    comm = InProcessComm(trace.workers)
    for index, step in enumerate(trace.recorded_steps):
        top, held = torch.empty(0), torch.empty(0, dtype=torch.bool)  # the running top-k of |mean|, and hits
        mark = comm.log.mark()
        sums = dict.fromkeys(("selected", "nonzero", "err", "energy", "agg", "drift", "raw"), 0.0)
        index_based = dense = False
        columns = trace.step_columns(index, [(g.lo, g.hi) for g in groups])
        for group, (comp, mem), layout, g in zip(groups, parts, layouts, columns, strict=True):
            seen: dict[str, Any] = {}

            def observe(u: torch.Tensor, out: Compressed, seen: dict = seen) -> None:
                seen["mean"] = u.float().mean(dim=0, keepdim=True) if out.reference is None else out.reference.float()
                seen["out"] = out

            update = mem.step(g, comp, comm, step, layout, observe)
            raw_mean = g.mean(dim=0, keepdim=True)
            sums["drift"] += float((update.float() - raw_mean).pow(2).sum())
            sums["raw"] += float(raw_mean.pow(2).sum())
            del g, update
            if not seen:  # sent dense (EF21's first step)
                dense = True
                continue
            mean, out = seen["mean"], seen["out"]
            agg = out.aggregate.float()
            sums["selected"] += float(out.selected.float().mean())
            sums["nonzero"] += float((agg != 0).sum())
            sums["err"] += float((agg - mean).pow(2).sum())
            sums["energy"] += float(mean.pow(2).sum())
            sums["agg"] += float(agg.pow(2).sum())
            index_based = index_based or out.index_based
            values, where = mean[0].abs().topk(min(k, group.numel))
            top, held = torch.cat([top, values]), torch.cat([held, agg[0, where] != 0])
            keep = top.topk(min(k, top.numel())).indices
            top, held = top[keep], held[keep]
        nbytes, collectives = records_summary(comm.log.since(mark))
        drift = sums["drift"] / (sums["raw"] or 1.0)
        if dense:
            yield StepMetrics(step, 1.0, 1.0, 0.0, 1.0, None, nbytes, drift, collectives, dense_step=True)
            continue
        overlap = float(held.float().mean()) if index_based else None
        scale = sums["energy"] or 1.0
        yield StepMetrics(step=step, density_achieved=sums["selected"] / d, density_aggregate=sums["nonzero"] / d,
                          rel_error=sums["err"] / scale, energy_captured=sums["agg"] / scale, overlap_topk=overlap,
                          bytes_per_rank=nbytes, update_error=drift, collectives=collectives)
