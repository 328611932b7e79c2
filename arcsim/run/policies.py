"""`arcsim run`'s switching policies: ``auto`` (the default) decides by estimated time to accuracy, ``paper``
follows Tyagi & Swany (per bucket, the fastest collective family and a ratio found by NSGA-II over iteration
time and compression gain).

**auto.** Every usable (compressor, collective, ratio) of the grid and of --density gets a time to target:
its iteration time × the steps its error needs (arcsim.run.convergence's steps model, with a 95 % interval).
The soonest is the one deployable choice. A per-bucket mix (coordinate descent from that choice: each bucket
takes whichever candidate lowers the whole job's time to target, the mix's error being its buckets' pooled
error) is chosen only when it reaches the target at least MIX_MARGIN sooner — one hook that switches
compressors per bucket is worth it only then. Candidates the steps model has no evidence for (a selection
never trained to the target: random, low-rank; an error beyond the largest that reached it) are priced
but not chosen; UNUSABLE_ERROR stays the hard floor.

**paper.** Per bucket, over the top-k compressors of both families (all-gather: topk, gaussiank;
all-reduce: arctopk, star, var) and the ratio grid, two objectives: the bucket's compression +
communication on its fastest collective, and 1 − its measured compression gain ‖C(u)‖/‖u‖ in that bucket.
NSGA-II (arcsim.run.nsga2, seeded by --seed) finds the Pareto set; the knee (arcsim.run.pareto.choose) is
taken from it: the point where giving up more gain stops buying much time. The paper's text fixes no rule
that could be checked here; the knee is arcsim's, the one its front uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from arcsim.catalog import AG_FAMILY, AR_TOPK_FAMILY, INFO
from arcsim.run.candidates import Candidate, Context, bucket_iteration_s, bucket_timeline
from arcsim.run.convergence import COVERED_SELECTIONS, StepsModel
from arcsim.run.decisions import UNUSABLE_ERROR, BucketChoice, Policy, Scored, usable
from arcsim.run.measurement import Measurement
from arcsim.run.nsga2 import nsga2
from arcsim.run.pareto import choose
from arcsim.strategy.effects import step_effects

S = TypeVar("S", bound=Scored)
MIX_MARGIN = 0.05  # a per-bucket mix must reach the target this much sooner than the best single choice


def _key(c: Candidate) -> tuple[str, str, str, float | None]:
    return c.compressor, c.collective, c.hierarchy, c.density


def pool(grid: Sequence[Candidate], cands: Sequence[Candidate]) -> list[Candidate]:
    """The grid's points and --density's candidates, each (compressor, collective, hierarchy, ratio) once (the
    --density measurement, on every trace step, first)."""
    out: dict[tuple[str, str, str, float | None], Candidate] = {}
    for c in [*cands, *grid]:
        out.setdefault(_key(c), c)
    return list(out.values())


def setting(c: Candidate) -> str:
    where = "" if c.hierarchy == "flat" else f"/{c.hierarchy}"
    return f"{c.compressor}/{c.collective}{where}" + ("" if c.density is None else f"@{c.density:g}")


def evidence(c: Scored, model: StepsModel) -> str | None:
    """Why the steps model cannot speak for ``c`` (None: it can)."""
    if not usable(c):
        return f"unusable (error ≥ {UNUSABLE_ERROR:g})"
    if INFO[c.compressor].selection not in COVERED_SELECTIONS:
        return f"{INFO[c.compressor].selection} selection: never trained to the target here, no steps estimate"
    if not model.covers(c.rel_error):
        return (f"error {c.rel_error:.3f} beyond the largest that reached the target in training "
                f"({model.max_error:.3f}): no evidence it gets there")
    return None


def estimate(c: Candidate, model: StepsModel, error: float | None = None) -> dict[str, Any]:
    e = c.rel_error if error is None else error
    f, (lo, hi) = model.factor(e), model.factor_interval(e)
    steps = model.dense_steps
    return {"compressor": c.compressor, "collective": c.collective, "hierarchy": c.hierarchy, "op": c.op,
            "density": c.density, "iteration_s": c.iteration_s, "rel_error": e, "steps_factor": f,
            "steps": steps * f, "time_to_target_s": c.iteration_s * steps * f,
            "time_to_target_interval_s": [c.iteration_s * steps * lo, c.iteration_s * steps * hi],
            "excluded": evidence(c, model)}


def soonest_key(c: Scored, model: StepsModel) -> tuple[float, float]:
    """What auto ranks a single setting by: its time to the target (as :func:`estimate`), then its iteration."""
    return c.iteration_s * model.dense_steps * model.factor(c.rel_error), c.iteration_s


def soonest(points: Sequence[S], model: StepsModel) -> S | None:
    """Auto's single choice among ``points``: the soonest to the target of those the steps model speaks for (None:
    none; `arcsim plot`'s heatmap picks each cell's by it)."""
    return min((p for p in points if evidence(p, model) is None), key=lambda p: soonest_key(p, model), default=None)


PerBucket = dict[int, tuple[np.ndarray, np.ndarray]]  # id(measurement) → per-bucket err², ref² per step


def _per_bucket(m: Measurement, memo: PerBucket) -> tuple[np.ndarray, np.ndarray]:
    """A measurement's squared error and reference per bucket, per trace step (its mean over the steps); ``memo``
    lives as long as one decision, while its measurements do."""
    found = memo.get(id(m))
    if found is None:
        found = (np.asarray(m.err2).mean(axis=0), np.asarray(m.ref2).mean(axis=0))
        memo[id(m)] = found
    return found


def _pooled_error(chosen: Sequence[Candidate], memo: PerBucket | None = None) -> float:
    """The mix's error: its buckets' squared errors over their references, each bucket per trace step."""
    memo = {} if memo is None else memo
    err = ref = 0.0
    for b, c in enumerate(chosen):
        if c.measurement is None:
            continue
        e, r = _per_bucket(c.measurement, memo)
        err += float(e[b])
        ref += float(r[b])
    return err / ref if ref > 0 else 0.0


def _per_bucket_times(chosen: Sequence[Candidate], ctx: Context) -> tuple[list[float], list[float]]:
    """Each bucket's compression and communication seconds under its chosen candidate."""
    return ([c.bucket_compress_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)],
            [c.bucket_comm_s[b.index] for c, b in zip(chosen, ctx.buckets, strict=True)])


def _iteration(chosen: Sequence[Candidate], ctx: Context) -> Any:
    return bucket_timeline(*_per_bucket_times(chosen, ctx), ctx)


def _choices(chosen: Sequence[Candidate], ctx: Context, ranked: Sequence[Candidate],
             model: StepsModel) -> list[BucketChoice]:
    out = []
    for c, b in zip(chosen, ctx.buckets, strict=True):
        others = [r for r in ranked if r is not c][:3]
        est = estimate(c, model)
        out.append(BucketChoice(b.index, b.numel, len(b.layers), c.compressor, c.collective, c.op,
                                c.bucket_s[b.index],
                                [{"compressor": r.compressor, "collective": r.collective, "hierarchy": r.hierarchy,
                                  "op": r.op, "density": r.density, "time_s": r.bucket_s[b.index]} for r in others],
                                c.hierarchy, c.density, time_to_target_s=est["time_to_target_s"],
                                time_to_target_interval_s=est["time_to_target_interval_s"]))
    return out


def _undominated(fit: Sequence[Candidate], ctx: Context, b: int, memo: PerBucket) -> list[Candidate]:
    """``fit`` less each candidate that an earlier one dominates at bucket ``b``: no more compression or communication
    there, no more squared error, no less reference. Without interference the step is max-plus in its items'
    times and the mix's error Σ err² / Σ ref² falls with err² and rises with ref², so a dominated candidate, coming
    later, is never strictly sooner than what the descent holds by then: the descent's result is unchanged, in a
    fraction of its timelines (LLaMA-1B: 214 buckets × 45 candidates a pass)."""
    index, rows = ctx.buckets[b].index, []
    for c in fit:
        assert c.measurement is not None  # (fit: measured candidates)
        err2, ref2 = _per_bucket(c.measurement, memo)
        rows.append((c.bucket_compress_s[index], c.bucket_comm_s[index], err2[b], -ref2[b]))
    at = np.array(rows)
    covers = np.all(at[:, None, :] <= at[None, :, :], axis=2)  # covers[j, i]: j is nowhere worse than i
    beaten = np.asarray(np.triu(covers, k=1).any(axis=0))  # … with j before i
    return [c for i, c in enumerate(fit) if not beaten[i]]


def by_time_to_target(grid: Sequence[Candidate], cands: Sequence[Candidate], ctx: Context,
                      model: StepsModel) -> tuple[Policy, Candidate]:
    """The auto policy, and its single deployable choice."""
    every = pool(grid, cands)
    rows = {id(c): estimate(c, model) for c in every}
    fit = [c for c in every if rows[id(c)]["excluded"] is None and c.measurement is not None
           and len(c.bucket_s) == len(ctx.buckets)]
    ranked = sorted(fit, key=lambda c: soonest_key(c, model))
    best = ranked[0]  # dense (error 0) is always there
    best_t = rows[id(best)]["time_to_target_s"]

    memo: PerBucket = {}

    def tta(chosen: list[Candidate]) -> float:
        return bucket_iteration_s(*_per_bucket_times(chosen, ctx), ctx) * model.dense_steps \
            * model.factor(_pooled_error(chosen, memo))

    mix = [best] * len(ctx.buckets)
    mix_t = best_t
    scans = [_undominated(fit, ctx, b, memo) for b in range(len(ctx.buckets))] \
        if not step_effects(ctx.topo).interference else [fit] * len(ctx.buckets)
    for _ in range(2):  # coordinate descent over the buckets, twice
        for b in range(len(ctx.buckets)):
            for c in scans[b]:
                trial = [*mix[:b], c, *mix[b + 1:]]
                t = tta(trial)
                if t < mix_t - 1e-15:
                    mix, mix_t = trial, t
    is_mix = len({_key(c) for c in mix}) > 1 and mix_t <= (1 - MIX_MARGIN) * best_t
    chosen = mix if is_mix else [best] * len(ctx.buckets)
    timeline = _iteration(chosen, ctx)
    error = _pooled_error(chosen) if is_mix else best.rel_error
    f, (lo, hi) = model.factor(error), model.factor_interval(error)
    steps = model.dense_steps
    t_pick = timeline.iteration_s * steps * f
    interval = [timeline.iteration_s * steps * lo, timeline.iteration_s * steps * hi]
    why = _why_not(best, every, rows, model)
    if is_mix:
        why.insert(0, f"a per-bucket mix ({', '.join(sorted({setting(c) for c in mix}))}) reaches the target "
                      f"{1 - mix_t / best_t:.1%} sooner than the best single choice {setting(best)} "
                      f"(≥ {MIX_MARGIN:.0%}): deploy it with arcsim.hooks.MixedState (--write-plan)")
    elif len({_key(c) for c in mix}) > 1:
        why.append(f"a per-bucket mix would reach the target only {1 - mix_t / best_t:.1%} sooner (< "
                   f"{MIX_MARGIN:.0%}): one compressor for the whole job")
    overlap = sorted({setting(c) for c in fit if c is not best
                      and rows[id(c)]["time_to_target_interval_s"][0] <= rows[id(best)]["time_to_target_interval_s"][1]
                      and rows[id(c)]["time_to_target_s"] <= 1.25 * best_t})
    rule = (f"the soonest to the target: iteration time × steps its error needs ({model.describe()}); "
            f"a per-bucket mix only when ≥ {MIX_MARGIN:.0%} sooner; never an error ≥ {UNUSABLE_ERROR:g}")
    ordered = sorted(rows.values(), key=lambda r: (r["excluded"] is not None, r["time_to_target_s"]))
    pol = Policy(rule, model.max_error, sorted({c.compressor for c in fit}), timeline.iteration_s,
                 timeline.exposed_comm_s, error, _choices(chosen, ctx, ranked, model), overlap[:8], name="auto",
                 deploy="mix" if is_mix else "single", time_to_target_s=t_pick, time_to_target_interval_s=interval,
                 steps_model=model.to_dict(), estimates=ordered, why=why)
    return pol, best


def _why_not(best: Candidate, every: Sequence[Candidate], rows: dict[int, dict[str, Any]],
             model: StepsModel) -> list[str]:
    """Why the faster-per-step candidates were not chosen: the fastest overall, and the fastest of each top-k
    family and of each compressor, when faster per step than the pick."""
    lines, said = [], set()
    b = rows[id(best)]
    faster = sorted((c for c in every if usable(c) and c.iteration_s < best.iteration_s), key=lambda c: c.iteration_s)
    picks: list[Candidate] = faster[:1]
    for family in (AR_TOPK_FAMILY, AG_FAMILY):
        picks += [c for c in faster if c.compressor in family][:1]
    for name in dict.fromkeys(c.compressor for c in faster):
        picks += [c for c in faster if c.compressor == name][:1]
    for c in picks:
        if id(c) in said:
            continue
        said.add(id(c))
        r = rows[id(c)]
        speed = best.iteration_s / c.iteration_s
        if r["excluded"] is not None:
            lines.append(f"{setting(c)} is {speed:.2f}× faster per step, but {r['excluded']}")
            continue
        need = r["steps_factor"] / b["steps_factor"]
        lines.append(f"{setting(c)} is {speed:.2f}× faster per step but needs ~{need:.2f}× the steps (error "
                     f"{c.rel_error:.3f} against {best.rel_error:.3f}): {r['time_to_target_s']:.3g} s to the target "
                     f"[{r['time_to_target_interval_s'][0]:.3g}, {r['time_to_target_interval_s'][1]:.3g}] against "
                     f"{b['time_to_target_s']:.3g} s")
        if len(lines) >= 6:
            break
    return lines


def paper(grid: Sequence[Candidate], ctx: Context, seed: int, model: StepsModel) -> Policy:
    """Tyagi & Swany's policy: per bucket, NSGA-II over (compressor of both top-k families, ratio) with
    objectives the bucket's time on its fastest collective and 1 − its compression gain; the knee of the set."""
    topk = [c for c in grid if c.compressor in AG_FAMILY + AR_TOPK_FAMILY and c.density is not None and usable(c)
            and c.measurement is not None]
    names = sorted({c.compressor for c in topk})
    ratios = sorted({c.density for c in topk if c.density is not None})
    chosen, choices = [], []
    for b in ctx.buckets:
        def best_of(x: tuple[int, ...], i: int = b.index) -> Candidate | None:
            at = [c for c in topk if c.compressor == names[x[0]] and c.density == ratios[x[1]]]
            return min(at, key=lambda c: c.bucket_s[i]) if at else None

        def objectives(x: tuple[int, ...], i: int = b.index) -> tuple[float, float] | None:
            c = best_of(x, i)
            if c is None:
                return None
            assert c.measurement is not None
            return c.bucket_s[i], 1.0 - float(np.mean(np.asarray(c.measurement.gain)[:, i]))

        found = nsga2(objectives, (len(names) - 1, len(ratios) - 1), seed)
        pick, _ = choose(np.array([f for _, f in found]))
        x, (t, _) = found[pick]
        c = best_of(x, b.index)
        assert c is not None
        chosen.append(c)
        est = estimate(c, model)
        choices.append(BucketChoice(b.index, b.numel, len(b.layers), c.compressor, c.collective, c.op, t,
                                    [], c.hierarchy, c.density, time_to_target_s=est["time_to_target_s"],
                                    time_to_target_interval_s=est["time_to_target_interval_s"],
                                    pareto=[{"compressor": names[k[0]], "density": ratios[k[1]], "time_s": f[0],
                                             "gain": 1.0 - f[1]} for k, f in found]))
    timeline = _iteration(chosen, ctx)
    error = _pooled_error(chosen)
    f, (lo, hi) = model.factor(error), model.factor_interval(error)
    rule = ("Tyagi & Swany: per bucket, NSGA-II (seed {seed}) over the top-k compressors of both families "
            "(all-gather {ag}; all-reduce {ar}) and the ratio grid, minimising the bucket's time on its fastest "
            "collective and maximising its compression gain ‖C(u)‖/‖u‖; the knee of the Pareto set").format(
        seed=seed, ag=", ".join(n for n in names if n in AG_FAMILY) or "none",
        ar=", ".join(n for n in names if n in AR_TOPK_FAMILY) or "none")
    steps = model.dense_steps
    return Policy(rule, None, names, timeline.iteration_s, timeline.exposed_comm_s, error, choices, [],
                  name="paper", deploy="mix" if len({_key(c) for c in chosen}) > 1 else "single",
                  time_to_target_s=timeline.iteration_s * steps * f,
                  time_to_target_interval_s=[timeline.iteration_s * steps * lo, timeline.iteration_s * steps * hi],
                  steps_model=model.to_dict())
