"""What `arcsim run` decides from priced candidates: the per-bucket switching policy between all-gather and
all-reduce, the Pareto front of iteration time against error over the ratio grid (and the point chosen
on it), and where all-gather and all-reduce top-k trade places as bandwidth and ratio change."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from arcsim.catalog import AG_FAMILY, AR_TOPK_FAMILY
from arcsim.pricing import Pricer
from arcsim.run.candidates import Candidate, Context, candidates_for, evaluate
from arcsim.run.measure import Measurement
from arcsim.run.pareto import choose, pareto_front
from arcsim.run.timeline import iteration

BANDWIDTH_SCALES = tuple(float(s) for s in np.logspace(-2, 2, 25))
Measure = Callable[[str, float], Measurement]  # (compressor, density) → its measurement on the trace


def eligible(cands: Sequence[Candidate], slack: float) -> tuple[list[Candidate], float | None]:
    """Candidates about as faithful as Top-K: error ≤ Top-K's × (1 + slack); dense and fp16 always."""
    sparse = [c for c in cands if c.density is not None]
    ref = next((c.rel_error for c in sparse if c.compressor == "topk"), None)
    if ref is None and sparse:
        ref = min(c.rel_error for c in sparse)
    limit = None if ref is None else ref * (1 + slack) + 1e-12
    return [c for c in cands if c.density is None or (limit is not None and c.rel_error <= limit)], limit


def policy(cands: Sequence[Candidate], ctx: Context, slack: float, measurement: Measure) -> dict[str, Any]:
    """Per bucket, the fastest eligible (compressor, collective); the iteration it gives."""
    allowed, limit = eligible(cands, slack)
    choices, chosen = [], []
    for b in ctx.buckets:
        ranked = sorted(allowed, key=_time_in_bucket(b.index))
        best = ranked[0]
        chosen.append(best)
        choices.append({"bucket": b.index, "elements": b.numel, "layers": len(b.layers),
                        "compressor": best.compressor, "collective": best.collective,
                        "op": best.op, "time_s": best.bucket_s[b.index],
                        "runners_up": [{"compressor": c.compressor, "collective": c.collective, "op": c.op,
                                        "time_s": c.bucket_s[b.index]} for c in ranked[1:4]]})
    ready = [b.ready_s for b in ctx.buckets]
    timeline = iteration(ctx.compute.forward_s, ctx.compute.backward_s, ready,
                         [c.bucket_compress_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)],
                         [c.bucket_comm_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)])
    err = sum(measurement(c.compressor, c.density or 1.0).err2_bucket(b.index)
              for c, b in zip(chosen, ctx.buckets, strict=True))
    ref = sum(measurement(c.compressor, c.density or 1.0).ref2_bucket(b.index)
              for c, b in zip(chosen, ctx.buckets, strict=True))
    return {"rule": f"per bucket, the fastest (compression + communication) among candidates whose relative "
                    f"aggregate error is at most Top-K's × (1 + {slack:g}) (dense and fp16 always qualify)",
            "error_limit": limit, "eligible": sorted({c.compressor for c in allowed}),
            "iteration_s": timeline.iteration_s, "exposed_comm_s": timeline.exposed_comm_s,
            "rel_error": err / ref if ref > 0 else 0.0, "choices": choices}


PARETO_KEYS = ("compressor", "collective", "density", "iteration_s", "rel_error", "compression_gain",
               "speedup_vs_dense", "comm_s", "bytes_per_rank")


def pareto(grid: Sequence[Candidate], ratios: Sequence[float],
           weights: tuple[float, float] | None) -> dict[str, Any]:
    """The exact front of (iteration time, error) over the grid, and the point chosen on it."""
    objectives = np.array([[c.iteration_s, c.rel_error] for c in grid])
    front = pareto_front(objectives)
    pick, rule = choose(objectives[front], weights)

    def point(c: Candidate) -> dict[str, Any]:
        return {k: getattr(c, k) for k in PARETO_KEYS}

    return {"objectives": ["iteration_s", "rel_error"], "rule": rule, "ratios": list(ratios),
            "evaluated": [point(c) for c in grid],
            "points": [point(grid[i]) for i in front], "chosen": point(grid[front[pick]])}


def crossover(compressors: Sequence[str], density: float, ratios: Sequence[float], grid: Sequence[Candidate],
              ctx: Context, measurement: Measure, dense_algo: str) -> dict[str, Any]:
    """Best all-gather top-k against best all-reduce top-k over scaled bandwidth and over the ratio grid."""
    ag = [n for n in compressors if n in AG_FAMILY]
    ar = [n for n in compressors if n in AR_TOPK_FAMILY]
    if not ag or not ar:
        return {"note": "needs an all-gather compressor (topk, gaussiank) and an all-reduce top-k variant "
                        "(arctopk, star, var) among --compressors"}
    base_topo = ctx.topo
    base = base_topo.network.bandwidth_per_nic
    rows = []
    for s in BANDWIDTH_SCALES:
        topo = dataclasses.replace(
            base_topo, network=dataclasses.replace(base_topo.network, bandwidth_per_nic=base * s),
            calibration={op: dataclasses.replace(c, bandwidth=c.bandwidth * s)
                         for op, c in base_topo.calibration.items()})
        scaled = dataclasses.replace(ctx, topo=topo, engine="analytic")
        pricer = Pricer(topo, "analytic")
        best = {}
        for family, names in (("allgather", ag), ("allreduce", ar)):
            options = [c for n in names for c in candidates_for(measurement(n, density), scaled, pricer)]
            fastest = min(options, key=lambda c: c.iteration_s)
            best[family] = (fastest.iteration_s, f"{fastest.compressor}/{fastest.collective}")
        dense = evaluate(measurement("dense", 1.0), dense_algo, scaled, pricer)
        rows.append({"nic_gbps": base * s * 8 / 1e9, "allgather_s": best["allgather"][0],
                     "allgather_best": best["allgather"][1], "allreduce_s": best["allreduce"][0],
                     "allreduce_best": best["allreduce"][1], "dense_s": dense.iteration_s})
    by_ratio = []
    for r in ratios:
        at = [c for c in grid if c.density == r]
        g = [c for c in at if c.compressor in ag]
        a = [c for c in at if c.compressor in ar]
        if g and a:
            fg, fa = min(g, key=lambda c: c.iteration_s), min(a, key=lambda c: c.iteration_s)
            by_ratio.append({"density": r, "allgather_s": fg.iteration_s,
                             "allgather_best": f"{fg.compressor}/{fg.collective}", "allreduce_s": fa.iteration_s,
                             "allreduce_best": f"{fa.compressor}/{fa.collective}"})
    return {"bandwidth": rows, "bandwidth_flips_gbps": _flips(rows, "nic_gbps"),
            "ratio": by_ratio, "ratio_flips": _flips(by_ratio, "density"),
            "density": density, "nic_gbps": base * 8 / 1e9,
            "note": "best all-gather top-k (topk, gaussiank) vs best all-reduce top-k (arctopk, star, var), "
                    "any collective; bandwidth curve by the closed form, inter-node NIC bandwidth scaled"}


def _time_in_bucket(index: int) -> Callable[[Candidate], float]:
    return lambda c: c.bucket_s[index]


def _flips(rows: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Where the faster of all-gather and all-reduce changes along ``axis`` (geometric interpolation)."""
    flips = []
    for a, b in itertools.pairwise(rows):
        da, db = a["allgather_s"] - a["allreduce_s"], b["allgather_s"] - b["allreduce_s"]
        if da == 0 or db == 0 or (da > 0) == (db > 0):
            continue
        f = da / (da - db)
        at = math.exp(math.log(a[axis]) + f * (math.log(b[axis]) - math.log(a[axis])))
        flips.append({axis: at, "below": "allgather" if da < 0 else "allreduce",
                      "above": "allreduce" if da < 0 else "allgather"})
    return flips
