"""How well the time-to-target estimator predicts the steps a run still needs, on runs whose answer is known.

Every static run in the given history files that reached its target is replayed evaluation by evaluation after
its warm-up: at each evaluation before the target was met, the estimator (arcsim.train.estimate) predicts the
steps left from the evaluations so far, and the prediction is compared with the steps the run really took. A
static run keeps one compressor, so its descent ratio is about constant and effective steps are taken as steps.
A power law in steps over the second half of the run so far (log b = c − α log t) is replayed beside it.

    python benchmarks/estimator_backtest.py reports/schedule/c*/history.csv

Prints, per estimator, the median |log(predicted / actual)|, the share of predictions within 2× of the truth,
and the share of truths inside the estimator's ±1σ band (68 % if its spread is calibrated).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from arcsim.run.target import Target
from arcsim.train.estimate import badness, fit_progress


def power_law_steps(steps: list[int], bad: list[float], b_target: float) -> float:
    """log b = c − α log t over the second half of the run so far, extrapolated to b*."""
    window = [(s, b) for s, b in zip(steps, bad, strict=True) if s >= steps[-1] / 2]
    if len(window) < 2:
        return math.nan
    slope = np.polyfit(np.log([s for s, _ in window]), np.log([b for _, b in window]), 1)[0]
    return steps[-1] * (bad[-1] / b_target) ** (1 / -slope) - steps[-1] if slope < 0 else math.nan


def replay(history: pd.DataFrame, target: Target, warmup: int) -> pd.DataFrame:
    rows = []
    static = history[history.policy == "static"]
    for (choice, seed), run in static.groupby(["choice", "seed"]):
        evals = run.dropna(subset=[target.column])
        steps, values = evals.step.tolist(), evals[target.column].tolist()
        reached = [s for s, v in zip(steps, values, strict=True) if target.met(v)]
        if not reached:
            continue
        for i, now in enumerate(steps):
            if now <= warmup or now >= reached[0]:
                continue
            progress = fit_progress(steps[:i + 1], values[:i + 1], [1.0] * now, target)
            bad = [badness(target, v) for v in values[:i + 1]]
            row = {"choice": choice, "seed": seed, "step": now, "actual": reached[0] - now,
                   "power_law": power_law_steps(steps[:i + 1], bad, badness(target, target.value))}
            if progress is not None:
                row["estimator"] = progress.steps_needed(1.0)
                row["low"], row["high"] = (row["estimator"] * math.exp(-progress.spread),
                                           row["estimator"] * math.exp(progress.spread))
            rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("histories", nargs="+", help="history.csv files of arcsim train experiments")
    parser.add_argument("--target", type=float, default=0.98, help="accuracy target (default 0.98)")
    parser.add_argument("--warmup", type=int, default=30, help="steps before the first prediction (default 30)")
    args = parser.parse_args()
    target = Target(args.target, "accuracy")
    table = pd.concat([replay(pd.read_csv(p), target, args.warmup) for p in args.histories], ignore_index=True)
    print(f"{len(table)} predictions from {table.groupby(['choice', 'seed']).ngroups} static runs "
          f"that reached {target.label}")
    for name in ("estimator", "power_law"):
        ok = table.dropna(subset=[name])
        ok = ok[ok[name] > 0]
        error = np.abs(np.log(ok[name] / ok.actual))
        print(f"{name:12s} n={len(ok):4d}  median |log(pred/actual)| {error.median():.2f}  "
              f"within 2x {np.mean(error < math.log(2)):.0%}  median pred/actual {np.median(ok[name] / ok.actual):.2f}")
    band = table.dropna(subset=["low"])
    inside = (band.actual >= band.low) & (band.actual <= band.high)
    print(f"the estimator's ±1σ band holds the truth in {inside.mean():.0%} of {len(band)} predictions")


if __name__ == "__main__":
    main()
