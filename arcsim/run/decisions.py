"""What `arcsim run` decides from priced candidates: ONE recommendation (the point chosen on the Pareto front
of usable candidates), the per-bucket switching policy between all-gather and all-reduce, the Pareto front of
iteration time against error over the ratio grid, and where all-gather and all-reduce top-k trade places as
bandwidth and ratio change."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from arcsim.catalog import AG_FAMILY, AR_TOPK_FAMILY, INFO, memory_for
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer
from arcsim.run.candidates import Candidate, Context, bucket_timeline, candidates_for
from arcsim.run.measurement import Measurement
from arcsim.run.pareto import choose, pareto_front
from arcsim.strategy.plan import BucketPlan, PlannedBucket

BANDWIDTH_SCALES = tuple(float(s) for s in np.logspace(-2, 2, 25))
UNUSABLE_ERROR = 0.95  # relative aggregate error from which a candidate is unusable: within 5 % of sending nothing
#                        (a zero update has error 1); Rand-K at 0.99 stayed at chance accuracy under `arcsim train`
#                        where Top-K (0.78) and STAR (0.90) trained like dense (docs/train.md)
GATE_SLACK = 0.25  # --policy gate: the error allowed above Top-K's, relative, when --slack gives none
UNUSABLE_NOTE = (f"unusable: error ≥ {UNUSABLE_ERROR:g}, within {1 - UNUSABLE_ERROR:.0%} of sending nothing "
                 "(error 1); never recommended or chosen")
Measure = Callable[..., Measurement]  # (compressor, density, hierarchy=…) → its measurement on the trace
MIX, PER_BUCKET = "mix", "per bucket"  # a per-bucket mix's compressor, and its collective and op


class Scored(Protocol):
    """What a decision reads of a setting: a candidate of `arcsim run`, or a row of a sweep's results."""

    compressor: str
    iteration_s: float
    rel_error: float


class Decision:
    """A decision's JSON form is its fields, recursively (stable keys: the report writes exactly this)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass
class BucketChoice(Decision):
    bucket: int
    elements: int
    layers: int
    compressor: str
    collective: str
    op: str
    time_s: float
    runners_up: list[dict[str, Any]]   # the next three: compressor, collective, hierarchy, op, time_s
    hierarchy: str = "flat"
    density: float | None = None       # the ratio chosen (auto and paper choose it; gate: --density's)
    pareto: list[dict[str, Any]] | None = None  # paper: the bucket's NSGA-II Pareto set (compressor, density, …)
    time_to_target_s: float | None = None       # auto, paper: this candidate's, were the whole job to use it
    time_to_target_interval_s: list[float] | None = None


@dataclass
class Policy(Decision):
    rule: str
    error_limit: float | None
    eligible: list[str]
    iteration_s: float
    exposed_comm_s: float
    rel_error: float
    choices: list[BucketChoice]
    unsettled: list[str]  # gate: candidates whose error interval spans the limit; auto: those whose time to
    #                       target the model cannot tell from the pick's (intervals overlap, within 25 %)
    name: str = "gate"    # auto (time to target), paper (Tyagi & Swany), gate (error within --slack of Top-K's)
    deploy: str = "mix"   # single: one compressor for the job; mix: a per-bucket choice (arcsim.hooks.MixedState)
    time_to_target_s: float | None = None            # auto and paper: estimated by the steps model
    time_to_target_interval_s: list[float] | None = None  # its 95 % interval
    steps_model: dict[str, Any] | None = None        # the model of steps against error, with its data
    estimates: list[dict[str, Any]] | None = None    # auto: every candidate's time to target (soonest first)
    why: list[str] | None = None                     # auto: why the faster-per-step candidates were not chosen


def usable(c: Scored) -> bool:
    """Whether ``c``'s error leaves it usable for training (below UNUSABLE_ERROR)."""
    return c.rel_error < UNUSABLE_ERROR


def unsettled(cands: Sequence[Candidate], limit: float | None) -> list[str]:
    """The sparsifiers whose eligibility the trace's steps cannot settle: the limit lies inside their error's
    95 % interval, so more steps could move them to the other side."""
    return sorted({c.compressor for c in cands if limit is not None and c.density is not None
                   and c.rel_error_ci is not None and c.rel_error_ci[0] <= limit <= c.rel_error_ci[1]})


@dataclass
class ParetoPoint(Decision):
    compressor: str
    collective: str
    density: float | None
    iteration_s: float
    rel_error: float
    compression_gain: float
    speedup_vs_dense: float
    comm_s: float
    bytes_per_rank: float
    hierarchy: str = "flat"

    @classmethod
    def of(cls, c: Candidate) -> ParetoPoint:
        return cls(**{f.name: getattr(c, f.name) for f in dataclasses.fields(cls)})


@dataclass
class ParetoFront(Decision):
    objectives: list[str]
    rule: str
    ratios: list[float]
    evaluated: list[ParetoPoint]
    points: list[ParetoPoint]
    chosen: ParetoPoint


@dataclass
class Crossover(Decision):
    note: str
    bandwidth: list[dict[str, Any]] | None = None     # per scaled NIC bandwidth: best AG, best AR, dense
    bandwidth_flips_gbps: list[dict[str, Any]] | None = None
    ratio: list[dict[str, Any]] | None = None         # per ratio of the grid: best AG, best AR
    ratio_flips: list[dict[str, Any]] | None = None
    density: float | None = None
    nic_gbps: float | None = None
    hierarchy: list[dict[str, Any]] | None = None     # per scaled NIC bandwidth: best flat, best node-aware
    hierarchy_flips_gbps: list[dict[str, Any]] | None = None
    hierarchy_by_gpus: list[dict[str, Any]] | None = None  # per GPUs per node (same ranks): best flat, best node
    hierarchy_flips_gpus: list[dict[str, Any]] | None = None

    @property
    def applies(self) -> bool:
        return self.bandwidth is not None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict().items() if v is not None}  # not applicable: the note alone


def eligible(cands: Sequence[Candidate], slack: float) -> tuple[list[Candidate], float | None]:
    """Candidates about as faithful as Top-K (its most faithful way, flat or node-aware): error ≤ Top-K's ×
    (1 + slack) and usable; dense and fp16 always."""
    sparse = [c for c in cands if c.density is not None]
    ref = min((c.rel_error for c in sparse if c.compressor == "topk"), default=None)  # flat or node: the closer
    if ref is None and sparse:
        ref = min(c.rel_error for c in sparse)
    limit = None if ref is None else ref * (1 + slack) + 1e-12
    return [c for c in cands if c.density is None or (limit is not None and c.rel_error <= limit and usable(c))], limit


def policy(cands: Sequence[Candidate], ctx: Context, slack: float) -> Policy:
    """Per bucket, the fastest eligible (compressor, collective); the iteration it gives."""
    allowed, limit = eligible(cands, slack)
    choices, chosen = [], []
    for b in ctx.buckets:
        ranked = sorted(allowed, key=_time_in_bucket(b.index))
        best = ranked[0]
        chosen.append(best)
        choices.append(BucketChoice(b.index, b.numel, len(b.layers), best.compressor, best.collective, best.op,
                                    best.bucket_s[b.index],
                                    [{"compressor": c.compressor, "collective": c.collective,
                                      "hierarchy": c.hierarchy, "op": c.op, "time_s": c.bucket_s[b.index]}
                                     for c in ranked[1:4]], best.hierarchy, best.density))
    timeline = bucket_timeline([c.bucket_compress_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)],
                               [c.bucket_comm_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)], ctx)
    measured = [(c.measurement, b.index) for c, b in zip(chosen, ctx.buckets, strict=True)
                if c.measurement is not None]
    err = sum(m.err2_bucket(i) for m, i in measured)
    ref = sum(m.ref2_bucket(i) for m, i in measured)
    rule = (f"gate (before issue 41): per bucket, the fastest (compression + communication) among candidates whose "
            f"relative aggregate error is at most Top-K's × (1 + {slack:g}) and below {UNUSABLE_ERROR:g} (dense and "
            "fp16 always qualify); a per-bucket mix needs a hook that switches per bucket")
    return Policy(rule, limit, sorted({c.compressor for c in allowed}), timeline.iteration_s,
                  timeline.exposed_comm_s, err / ref if ref > 0 else 0.0, choices, unsettled(cands, limit),
                  deploy="mix" if len({(c.compressor, c.collective, c.hierarchy) for c in chosen}) > 1 else "single")


def pareto(grid: Sequence[Candidate], ratios: Sequence[float],
           weights: tuple[float, float] | None) -> ParetoFront:
    """The exact front of (iteration time, error) over the grid, and the point chosen on the front of its usable
    points (no unusable point can dominate a usable one, so that front is part of the whole one)."""
    front = pareto_front(np.array([[c.iteration_s, c.rel_error] for c in grid]))
    pick, rule = front_pick(grid, weights)
    return ParetoFront(["iteration_s", "rel_error"], rule, list(ratios), [ParetoPoint.of(c) for c in grid],
                       [ParetoPoint.of(grid[i]) for i in front], ParetoPoint.of(grid[pick]))


def front_pick(points: Sequence[Scored], weights: tuple[float, float] | None = None) -> tuple[int, str]:
    """The index of the point chosen on the front (iteration time against error) of the usable ``points`` (dense,
    error 0, among them), and the rule: what `arcsim run` recommends without a time-to-target policy."""
    objectives = np.array([[c.iteration_s, c.rel_error] for c in points])
    fit = [i for i, c in enumerate(points) if usable(c)]
    fit_front = [fit[i] for i in pareto_front(objectives[fit])]
    pick, rule = choose(objectives[fit_front], weights)
    return fit_front[pick], f"{rule}, among the usable points (error < {UNUSABLE_ERROR:g})"


@dataclass
class Recommendation(Decision):
    """The one setting to deploy: a compressor, its collective and ratio for the whole job, and why."""

    compressor: str
    collective: str
    op: str
    hierarchy: str
    density: float | None       # None: the compressor takes no ratio (dense, fp16, bf16)
    iteration_s: float
    speedup_vs_dense: float
    rel_error: float
    error_limit: float          # UNUSABLE_ERROR: candidates at or above it are never recommended
    why: list[str]
    time_to_target_s: float | None = None         # auto: the estimate it was chosen by
    time_to_target_interval_s: list[float] | None = None
    speedup_low: float | None = None              # the speed-up's interval and verdict (run/doubt.py)
    speedup_high: float | None = None
    verdict: str | None = None
    tips: list[dict[str, Any]] | None = None      # too close to call: settings that make it clear
    plan: dict[str, Any] | None = None            # per DDP bucket, what to run (arcsim.strategy.plan; None: not DDP)

    @property
    def is_mix(self) -> bool:
        return self.compressor == MIX

    def judged(self, c: Candidate) -> Recommendation:
        """This recommendation with the interval, verdict and tips of ``c``, its candidate."""
        return dataclasses.replace(self, speedup_low=c.speedup_low, speedup_high=c.speedup_high, verdict=c.verdict,
                                   tips=c.tips)


def recommend(front: ParetoFront, grid: Sequence[Candidate], pol: Policy | None) -> Recommendation:
    """The front's chosen point as one deployable setting, with the reasons the other "winners" lost."""
    c = front.chosen
    op = next(g.op for g in grid if ParetoPoint.of(g) == c)
    why = [f"chosen on the Pareto front of iteration time against error by {front.rule}"]
    if c.compressor == "dense":
        why.append("no usable compressor is faster than dense fp32 on this cluster")
    fastest = min((g for g in grid if usable(g)), key=lambda g: g.iteration_s)
    if ParetoPoint.of(fastest) != c:
        why.append(f"the fastest usable point, {_setting(fastest)}, is {fastest.speedup_vs_dense:.2f}× dense but "
                   f"its error is {fastest.rel_error:.3f}")
    faster = sorted({g.compressor for g in grid if not usable(g) and g.iteration_s < c.iteration_s})
    if faster:
        why.append(f"faster but unusable (error ≥ {UNUSABLE_ERROR:g}): {', '.join(faster)}")
    if pol is not None and pol.iteration_s < c.iteration_s and len({(b.compressor, b.collective, b.hierarchy)
                                                                       for b in pol.choices}) > 1:
        mix = sorted({b.compressor for b in pol.choices})
        why.append(f"the per-bucket policy's mix ({', '.join(mix)}) would take {pol.iteration_s * 1e3:.3g} ms, but "
                   f"--policy {pol.name} only gates by error; --policy auto recommends a mix when it reaches the "
                   "target sooner")
    return Recommendation(c.compressor, c.collective, op, c.hierarchy, c.density, c.iteration_s,
                          c.speedup_vs_dense, c.rel_error, UNUSABLE_ERROR, why)


def recommend_soonest(best: Candidate, pol: Policy) -> Recommendation:
    """The auto policy's single choice as the deployable setting, with why the faster ones lost."""
    est = next(e for e in pol.estimates or [] if (e["compressor"], e["collective"], e["hierarchy"], e["density"])
               == (best.compressor, best.collective, best.hierarchy, best.density))
    lo, hi = est["time_to_target_interval_s"]
    why = [f"the soonest to the target: {est['time_to_target_s']:.3g} s [{lo:.3g}, {hi:.3g}] = "
           f"{best.iteration_s * 1e3:.3g} ms per step × {est['steps']:.0f} steps (error {best.rel_error:.3f} needs "
           f"{est['steps_factor']:.2f}× dense's {pol.steps_model['dense_steps'] if pol.steps_model else 0:.0f})"]
    if best.compressor == "dense":
        why.append("no usable compressor reaches the target sooner than dense fp32 on this cluster")
    why += pol.why or []
    return Recommendation(best.compressor, best.collective, best.op, best.hierarchy, best.density, best.iteration_s,
                          best.speedup_vs_dense, best.rel_error, UNUSABLE_ERROR, why,
                          est["time_to_target_s"], [lo, hi])


def recommend_policy(pol: Policy, grid: Sequence[Candidate], dense: Candidate) -> Recommendation:
    """A per-bucket policy's choice (auto's mix, paper's) as the setting to deploy: its one setting when every
    bucket shares it, else the mix, which arcsim.hooks.MixedState runs."""
    why = pol.why or [f"the {pol.name} policy's choice: {pol.rule}"]
    ttt = pol.time_to_target_s, pol.time_to_target_interval_s
    keys = {(ch.compressor, ch.collective, ch.hierarchy, ch.density) for ch in pol.choices}
    if len(keys) == 1:
        c = next(g for g in grid if (g.compressor, g.collective, g.hierarchy, g.density) in keys)
        return Recommendation(c.compressor, c.collective, c.op, c.hierarchy, c.density, pol.iteration_s,
                              dense.iteration_s / pol.iteration_s, pol.rel_error, UNUSABLE_ERROR, why, *ttt)
    ways = {ch.hierarchy for ch in pol.choices}
    return Recommendation(MIX, PER_BUCKET, PER_BUCKET, ways.pop() if len(ways) == 1 else PER_BUCKET, None,
                          pol.iteration_s, dense.iteration_s / pol.iteration_s, pol.rel_error, UNUSABLE_ERROR, why,
                          *ttt)


def plan_for(rec: Recommendation, pol: Policy | None, ctx: Context, memory: str | None, seed: int,
             scope: str) -> BucketPlan:
    """What each DDP bucket runs to deploy ``rec``: the policy's choice per bucket for a mix, else ``rec``'s one
    setting in every bucket (``memory``: --memory, None for each compressor's default)."""
    def planned(index: int, name: str, density: float | None, op: str, collective: str, way: str) -> PlannedBucket:
        mem = memory_for(name, None if INFO[name].density_free else memory)
        return PlannedBucket(index, ctx.buckets[index].numel, name, density, mem, op, collective, way)

    if rec.is_mix:
        assert pol is not None
        rows = [planned(ch.bucket, ch.compressor, ch.density, ch.op, ch.collective, ch.hierarchy)
                for ch in pol.choices]
    else:
        rows = [planned(b.index, rec.compressor, rec.density, rec.op, rec.collective, rec.hierarchy)
                for b in ctx.buckets]
    return BucketPlan(tuple(rows), seed, scope)


def _setting(c: Candidate | ParetoPoint) -> str:
    """``topk/ring at density 0.01``, ``fp16/tree``: a setting in a sentence."""
    where = "" if c.hierarchy == "flat" else f", {c.hierarchy}-aware"
    return f"{c.compressor}/{c.collective}{where}" + ("" if c.density is None else f" at density {c.density:g}")


def crossover(compressors: Sequence[str], density: float, ratios: Sequence[float], grid: Sequence[Candidate],
              ctx: Context, measurement: Measure) -> Crossover:
    """Best all-gather top-k against best all-reduce top-k over scaled bandwidth and over the ratio grid."""
    ag = [n for n in compressors if n in AG_FAMILY]
    ar = [n for n in compressors if n in AR_TOPK_FAMILY]
    if not ag or not ar:
        return Crossover("needs an all-gather compressor (topk, gaussiank) and an all-reduce top-k variant "
                         "(arctopk, star, var) among --compressors")
    base = ctx.topo.network.bandwidth_per_nic
    rows = []
    for s, scaled, pricer in _scaled_networks(ctx) if ctx.topo.nodes > 1 else []:
        best = {}
        for family, names in (("allgather", ag), ("allreduce", ar)):
            options = [c for n in names for c in candidates_for(measurement(n, density), scaled, pricer)]
            fastest = min(options, key=lambda c: c.iteration_s)
            best[family] = (fastest.iteration_s, f"{fastest.compressor}/{fastest.collective}")
        dense = min(candidates_for(measurement("dense", 1.0), scaled, pricer), key=lambda c: c.iteration_s)
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
    what = "best all-gather top-k (topk, gaussiank) vs best all-reduce top-k (arctopk, star, var), any collective"
    if ctx.topo.nodes < 2:  # no network between nodes: nothing to scale
        return Crossover(f"{what}; over the ratio only: {ctx.topo.name} is one node, with no inter-node bandwidth "
                         "to vary", ratio=by_ratio, ratio_flips=_flips(by_ratio, "density"), density=density)
    return Crossover(f"{what}; bandwidth curve by the closed form, inter-node NIC bandwidth scaled",
                     rows, _flips(rows, "nic_gbps"), by_ratio, _flips(by_ratio, "density"), density, base * 8 / 1e9)


def with_hierarchy(cx: Crossover, compressors: Sequence[str], density: float, ctx: Context,
                   measurement: Measure) -> Crossover:
    """``cx`` with the flat / node-aware crossover: the fastest flat and the fastest node-aware candidate (any
    compressor at ``density``, any collective) as the inter-node bandwidth per NIC varies."""
    rows = [{"nic_gbps": ctx.topo.network.bandwidth_per_nic * s * 8 / 1e9,
             **_fastest_each_way(compressors, density, scaled, pricer, measurement)}
            for s, scaled, pricer in _scaled_networks(ctx)]
    by_gpus = _by_gpus_per_node(compressors, density, ctx, measurement)
    return dataclasses.replace(cx, hierarchy=rows, hierarchy_flips_gbps=_flips(rows, "nic_gbps", ("flat", "node")),
                               hierarchy_by_gpus=by_gpus,
                               hierarchy_flips_gpus=_flips(by_gpus, "gpus_per_node", ("flat", "node")),
                               density=density, nic_gbps=ctx.topo.network.bandwidth_per_nic * 8 / 1e9)


def _by_gpus_per_node(compressors: Sequence[str], density: float, ctx: Context,
                      measurement: Measure) -> list[dict[str, Any]]:
    """Fastest flat and node-aware candidate with the same ranks packed G to a node (G = 2, 4, 8, … leaving two
    nodes; each node keeps the topology's NICs, at most G), node-aware measured on workers grouped for each G.
    Fits measured in a node's or a rail's group were for the topology's own G: other packings go without."""
    base, rows = ctx.topo, []
    g = 2
    while base.ranks % g == 0 and base.ranks // g >= 2:
        topo = dataclasses.replace(base, name=f"{base.name}, {g} GPUs per node", nodes=base.ranks // g,
                                   gpus_per_node=g, group_calibration={}, network=dataclasses.replace(
                                       base.network, nics_per_node=min(base.network.nics_per_node, g)))
        at, pricer = dataclasses.replace(ctx, topo=topo, engine="analytic"), Pricer(topo, "analytic")
        try:
            rows.append({"gpus_per_node": g, "nodes": topo.nodes,
                         **_fastest_each_way(compressors, density, at, pricer, measurement)})
        except ArcsimError:  # the captured workers cannot stand for nodes of g
            break
        g *= 2
    return rows


def _fastest_each_way(compressors: Sequence[str], density: float, ctx: Context, pricer: Pricer,
                      measurement: Measure) -> dict[str, Any]:
    """``flat_s``, ``flat_best``, ``node_s``, ``node_best``: the fastest candidate flat and node-aware (any of
    ``compressors`` at ``density``, any collective) on ``ctx``'s topology (node-aware grouped for its nodes)."""
    row: dict[str, Any] = {}
    for way in ("flat", "node"):
        options = [c for n in compressors
                   for c in candidates_for(measurement(n, density, hierarchy=way, topo=ctx.topo), ctx, pricer)]
        fastest = min(options, key=lambda c: c.iteration_s)
        row[f"{way}_s"], row[f"{way}_best"] = fastest.iteration_s, f"{fastest.compressor}/{fastest.collective}"
    return row


def _scaled_networks(ctx: Context) -> list[tuple[float, Context, Pricer]]:
    """(scale, context, pricer) with the NIC bandwidth (and measured fits) × each of BANDWIDTH_SCALES, analytic."""
    base_topo, out = ctx.topo, []
    base = base_topo.network.bandwidth_per_nic
    for s in BANDWIDTH_SCALES:
        topo = base_topo.with_overrides(bandwidth=base * s)
        out.append((s, dataclasses.replace(ctx, topo=topo, engine="analytic"), Pricer(topo, "analytic")))
    return out


def _time_in_bucket(index: int) -> Callable[[Candidate], float]:
    return lambda c: c.bucket_s[index]


def _flips(rows: list[dict[str, Any]], axis: str, sides: tuple[str, str] = ("allgather", "allreduce")
           ) -> list[dict[str, Any]]:
    """Where the faster of the two ``sides`` (rows hold ``<side>_s``) changes along ``axis`` (geometric
    interpolation)."""
    one, other = sides
    flips = []
    for a, b in itertools.pairwise(rows):
        da, db = a[f"{one}_s"] - a[f"{other}_s"], b[f"{one}_s"] - b[f"{other}_s"]
        if da == 0 or db == 0 or (da > 0) == (db > 0):
            continue
        f = da / (da - db)
        at = math.exp(math.log(a[axis]) + f * (math.log(b[axis]) - math.log(a[axis])))
        flips.append({axis: at, "below": one if da < 0 else other, "above": other if da < 0 else one})
    return flips
