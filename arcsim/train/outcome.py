"""From training runs to answers: each step priced on a topology, time to a target accuracy, savings, and
whether the seeds' claims reproduce."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from arcsim.devices.catalog import Device
from arcsim.pricing import Pricer
from arcsim.run.candidates import Context, candidates_for, step_timelines
from arcsim.run.compute import ComputeTimes
from arcsim.run.report import OP_SHORT
from arcsim.run.target import Reached, Target, first_reach
from arcsim.strategy.buckets import Bucket
from arcsim.topology import Topology
from arcsim.train.loop import History, Setup


def compute_times(setup: Setup) -> ComputeTimes:
    prof = setup.profile
    ready = {la.name: la.ready_s for la in prof.layers}
    return ComputeTimes(prof.forward_s, prof.backward_s,
                        np.array([ready.get(la.name, prof.backward_s) for la in setup.layers]), prof.device,
                        f"{prof.device_name}, batch {prof.batch}")


def priced_on(setup: Setup, topo: Topology) -> tuple[ComputeTimes, list[Bucket], Device | None]:
    """Compute, buckets and GPU to price steps with, from where the compute comes from (arcsim.devices.source):
    a given compute profile; the topology's catalogue GPU (compute predicted for the trained model, batch and
    precision, bucket ready times from it); else as measured here."""
    from arcsim.devices.predict import predict_compute
    from arcsim.devices.source import compute_source

    where = compute_source(topo.gpu, profile=setup.profile_path)
    if where.kind != "modelled" or where.gpu is None:
        return compute_times(setup), setup.buckets, where.gpu
    pred = predict_compute(setup.source, where.gpu.name, setup.profile.batch, setup.precision,
                           dataset=setup.data.name, input_size=setup.input_size)
    ready = {la.name: la.ready_s for la in pred.profile.layers}
    compute = ComputeTimes(pred.profile.forward_s, pred.profile.backward_s,
                           np.array([ready[la.name] for la in setup.layers]), "cuda",
                           f"{pred.source} on {pred.device.full_name}, batch {setup.profile.batch}")
    buckets = [dataclasses.replace(b, ready_s=max(ready[la.name] for la in b.layers)) for b in setup.buckets]
    return compute, buckets, pred.device


def price(hist: History, setup: Setup, topo: Topology, engine: str) -> tuple[str, np.ndarray]:
    """The fastest collective for this run's main op, and every step's predicted iteration time on ``topo``."""
    compute, buckets, gpu = priced_on(setup, topo)
    ctx = Context(None, topo, compute, buckets, engine, gpu=gpu)
    pricer = Pricer(topo, engine)
    best = min(candidates_for(hist.measurement, ctx, pricer), key=lambda c: c.iteration_s)
    timelines, _, _ = step_timelines(hist.measurement, best.collective, ctx, pricer)
    op = OP_SHORT.get(best.op, best.op)
    return f"{op} {best.collective}", np.array([t.iteration_s for t in timelines])


def history_rows(hist: History, step_s: np.ndarray | None, collective: str | None) -> list[dict[str, Any]]:
    """One row per step: loss, held-out accuracy and loss where evaluated, predicted wall-clock so far."""
    acc = dict(zip(hist.eval_steps, hist.accuracy, strict=True))
    val = dict(zip(hist.eval_steps, hist.val_loss, strict=True))
    elapsed = np.cumsum(step_s) if step_s is not None else None
    rows = []
    for i, loss in enumerate(hist.loss):
        step = i + 1
        rows.append({"compressor": hist.compressor, "seed": hist.seed, "memory": hist.memory, "step": step,
                     "loss": loss, "accuracy": acc.get(step, math.nan), "val_loss": val.get(step, math.nan),
                     "time_s": float(elapsed[i]) if elapsed is not None and i < len(elapsed) else math.nan,
                     "collective": collective or "", "diverged": hist.diverged_at is not None})
    return rows


def seed_outcomes(runs: pd.DataFrame, target: Target | None,
                  column: str = "accuracy") -> tuple[list[float], list[Reached]]:
    """Per seed of ``runs``: its last evaluated ``column``, and (with a target) when it first reached it."""
    finals, reaches = [], []
    for _, run in runs.groupby("seed"):
        evals = run.dropna(subset=[column])
        finals.append(float(evals[column].iloc[-1]) if not evals.empty else math.nan)
        if target is not None:
            reaches.append(first_reach(run, target))
    return finals, reaches


def summarise(history: pd.DataFrame, target: Target | None) -> pd.DataFrame:
    """Per compressor over seeds: final accuracy and held-out loss, and (with a target) steps and time to reach
    it."""
    out = []
    for name, runs in history.groupby("compressor", sort=False):
        finals, reaches = seed_outcomes(runs, target)
        losses, _ = seed_outcomes(runs, None, "val_loss")
        row: dict[str, Any] = {"compressor": name, "seeds": len(finals), "final_acc_mean": float(np.mean(finals)),
                               "final_acc_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
                               "final_loss_mean": float(np.mean(losses)),
                               "diverged_runs": int(runs.groupby("seed")["diverged"].any().sum()),
                               "collective": runs["collective"].iloc[0]}
        per_step = runs.groupby("seed")["time_s"].apply(lambda t: t.diff().fillna(t.iloc[0]).mean())
        row["step_s"] = float(per_step.mean())
        if target is not None:
            steps = [r.step for r in reaches if not math.isnan(r.step)]
            times = [r.time_s for r in reaches if not math.isnan(r.time_s)]
            row.update(reached=f"{len(steps)}/{len(reaches)}",
                       steps_to_target=float(np.mean(steps)) if steps else math.nan,
                       time_to_target_s=float(np.mean(times)) if len(times) == len(reaches) else math.nan)
        out.append(row)
    table = pd.DataFrame(out)
    if target is not None:
        for ref in ("topk", "dense"):
            base = table.loc[table["compressor"] == ref, "time_to_target_s"]
            t = base.iloc[0] if not base.empty else math.nan
            table[f"saving_vs_{ref}"] = 1 - table["time_to_target_s"] / t
    return table


def _accuracy_claim(claim: str, a: pd.Series, b: pd.Series, holds: Callable[[float, float], bool]) -> str:
    """``claim`` judged on a's and b's final accuracies: ``holds(gap, noise)`` with gap = a − b and noise two
    standard errors of that difference; not judged below 3 seeds. Ends open, for the caller's remarks."""
    gap = a["final_acc_mean"] - b["final_acc_mean"]
    noise = 2 * math.sqrt(a["final_acc_std"] ** 2 / a["seeds"] + b["final_acc_std"] ** 2 / b["seeds"])
    if min(a["seeds"], b["seeds"]) < 3:
        verdict = "not judged (needs ≥ 3 seeds)"
    else:
        verdict = "reproduced" if holds(gap, noise) else "NOT reproduced"
    return (f"{claim}: {verdict} — final accuracy {a['final_acc_mean']:.4f} vs {b['final_acc_mean']:.4f} "
            f"(difference {gap:+.4f}, noise ±{noise:.4f}")


def claims(summary: pd.DataFrame, target: Target | None) -> list[str]:
    """The seeds' qualitative claims, judged on this run's numbers (one line each)."""
    rows = {r["compressor"]: r for _, r in summary.iterrows()}
    lines = []
    if "arctopk" in rows and "topk" in rows:
        a, t = rows["arctopk"], rows["topk"]
        lines.append(_accuracy_claim("ARC-Top-K matches Top-K accuracy", a, t,
                                     lambda gap, noise: abs(gap) <= max(noise, 1e-9)) + ")")
        if target is not None and "time_to_target_s" in a and not math.isnan(t["step_s"]):
            ta, tt = a["time_to_target_s"], t["time_to_target_s"]
            if math.isnan(ta) or math.isnan(tt):
                lines.append(f"ARC-Top-K reaches {target.short} sooner than Top-K in predicted wall-clock: not judged "
                             f"(reached by ARC-Top-K in {a['reached']} runs, by Top-K in {t['reached']})")
            else:
                verdict = "reproduced" if ta < tt else "NOT reproduced"
                lines.append(f"ARC-Top-K reaches {target.short} sooner than Top-K in predicted wall-clock: {verdict} — "
                             f"{ta:.3g} s vs {tt:.3g} s ({1 - ta / tt:+.1%} saving)")
    if "randk" in rows and "topk" in rows:
        r, t = rows["randk"], rows["topk"]
        lines.append(_accuracy_claim("Rand-K at the same density converges worse than Top-K", r, t,
                                     lambda gap, noise: gap < -noise)
                     + f"; {r['diverged_runs']} of {r['seeds']} Rand-K runs diverged)")
    return lines
