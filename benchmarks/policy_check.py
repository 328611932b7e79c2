"""Does `arcsim run`'s default policy pick what `arcsim train` measures as the fastest to the target? (issue 41)

For each setting: an `arcsim train` directory (several seeds, a --target) and the JSON of an `arcsim run` of the
same model, compressors, density and topology. Prints, per setting, each compressor's measured time to
target per seed, the measured fastest, auto's pick and its predicted time, and whether the pick is the
fastest or within the seeds' noise of it (paired over seeds: the 95 % interval of the pick's time minus the
fastest's includes zero).

    python benchmarks/policy_check.py TRAIN_DIR RUN_JSON [TRAIN_DIR RUN_JSON ...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from arcsim.run.convergence import fit_steps_model
from arcsim.run.target import Target, first_reach


def measured(train_dir: Path) -> tuple[dict[str, list[float]], float, dict[str, float]]:
    """Per compressor: its time to target per seed (NaN where a seed did not reach it); the target; its priced
    seconds per step in training."""
    config = json.loads((train_dir / "config.json").read_text())
    if (train_dir / "target.json").is_file():
        config |= json.loads((train_dir / "target.json").read_text())
    target = Target(float(config["target"]))
    history = pd.read_csv(train_dir / "history.csv")
    out, step_s = {}, {}
    for name, rows in history.groupby("compressor"):
        out[str(name)] = [first_reach(run, target).time_s for _, run in rows.groupby("seed")]
        last = rows.sort_values("step").iloc[-1]
        step_s[str(name)] = float(last["time_s"]) / float(last["step"])
    return out, target.value, step_s


def check(train_dir: Path, run_json: Path) -> None:
    times, target, step_s = measured(train_dir)
    model = fit_steps_model()
    res = json.loads(run_json.read_text())
    pick = res["recommendation"]["compressor"]
    means = {n: (np.mean(t) if not any(math.isnan(x) for x in t) else math.inf) for n, t in times.items()}
    fastest = min(means, key=means.__getitem__)
    print(f"{train_dir.name} vs {run_json.name}: target {target:g}, {res['topology']['name']}")
    errors = {c["compressor"]: c["rel_error"] for c in res["candidates"]}
    dense_steps = res["policy"]["steps_model"]["dense_steps"]
    on_train = {n: step_s[n] * model.factor(errors.get(n, 0.0)) for n in means}
    for n in sorted(means, key=means.__getitem__):
        est = min((e["time_to_target_s"] for e in res["policy"]["estimates"]
                   if e["compressor"] == n and e["excluded"] is None), default=math.nan)
        print(f"  {n:8s} measured {means[n]:.3f} s (seeds {', '.join(f'{x:.3f}' for x in times[n])}), "
              f"{step_s[n] * 1e3:.2f} ms/step; error {errors.get(n, 0):.3f}, "
              f"steps × {model.factor(errors.get(n, 0)):.2f}; "
              f"auto's estimate {est / dense_steps * 1e3:.2f} ms × dense steps; on training's step time "
              f"{on_train[n] * 1e3:.2f} ms × dense steps"
              + ("  ← auto's pick" if n == pick else "") + ("  ← measured fastest" if n == fastest else ""))
    print(f"  order measured: {' < '.join(sorted(means, key=means.__getitem__))}")
    by_model = sorted(on_train, key=on_train.__getitem__)
    print(f"  order by the steps model on training's step times: {' < '.join(by_model)}")
    if pick == fastest:
        print("  verdict: auto picks the measured fastest")
        return
    diff = np.array(times[pick]) - np.array(times[fastest])
    if np.isnan(diff).any():
        print("  verdict: auto's pick did not reach the target in every seed")
        return
    half = student_t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
    lo, hi = diff.mean() - half, diff.mean() + half
    noise = lo <= 0 <= hi
    print(f"  verdict: pick − fastest = {diff.mean():+.3f} s, 95 % interval [{lo:+.3f}, {hi:+.3f}] over "
          f"{len(diff)} paired seeds: {'within the seeds noise' if noise else 'a real miss'}")


def main(args: list[str]) -> None:
    if len(args) < 2 or len(args) % 2:
        raise SystemExit(__doc__)
    for i in range(0, len(args), 2):
        check(Path(args[i]), Path(args[i + 1]))


if __name__ == "__main__":
    main(sys.argv[1:])
