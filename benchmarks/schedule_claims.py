"""The policy claims of issue 28: time to target of the best static choice, adaptive (time-to-target objective)
and the switching bound, per (schedule, model), written to reports/schedule/claims.csv.

Each (schedule, model) is one `arcsim train --network-schedule` experiment in reports/schedule/<schedule>
(resumable: run again and finished runs are kept). Prints each experiment's headline as it lands.

    python benchmarks/schedule_claims.py                       # C1, C2, C3 on mlp_wide/digits, 3 seeds
    python benchmarks/schedule_claims.py --schedules c3 --seeds 0

The candidates are topk and arctopk at ratios 0.1 and 0.033 (4 static choices): on 2 cores one run of
mlp_wide costs 1–4 minutes, and the lower ratios (which never or rarely reached 98 % in the earlier runs)
cost a full 300 steps each; three schedules × 3 seeds × the paper's 15 choices did not fit a session.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {  # model → the train options that define it (target included)
    "mlp_wide": ["--model", "mlp_wide", "--dataset", "digits", "--target", "0.98", "--eval-every", "5",
                 "--steps", "300", "--candidates", "topk,arctopk", "--ratios", "0.1,0.033"],
}
COLUMNS = ("schedule", "model", "policy", "best_static", "seeds", "seeds_reached", "time_to_target_mean_s",
           "time_to_target_sd_s", "steps_to_target_mean", "vs_best_static")


def experiment(schedule: str, model: str, seeds: str, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "arcsim", "train", *WORKLOADS[model], "--network-schedule",
           str(ROOT / "examples" / f"schedule-{schedule}.yaml"), "--seeds", seeds, "--stop-at-target",
           "--out", str(out), "--json", str(out / "result.json")]
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    headline = json.loads((out / "result.json").read_text())["headline"]
    print(f"{schedule} / {model}: {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for h in headline:
        rows.append({"schedule": schedule, "model": model, "policy": h["policy"],
                     "best_static": h["choice"] if h["policy"] == "static" else "",
                     "seeds": int(h["seeds"]), "seeds_reached": int(h["reached"]),
                     "time_to_target_mean_s": h["time_to_target_s"], "time_to_target_sd_s": h["time_to_target_std"],
                     "steps_to_target_mean": h["steps_to_target"], "vs_best_static": h.get("vs_best_static")})
        print(f"  {h['policy']:9s} {rows[-1]['best_static']:16s} reached {h['reached']}/{h['seeds']}  "
              f"{h['time_to_target_s']:.3f} ± {h['time_to_target_std']:.3f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="c1,c2,c3")
    parser.add_argument("--models", default=",".join(WORKLOADS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=str(ROOT / "reports" / "schedule"))
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for schedule in args.schedules.split(","):
            suffix = "" if model == "mlp_wide" else f"-{model}"
            rows += experiment(schedule, model, args.seeds, Path(args.out) / f"{schedule}{suffix}")
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.to_csv(Path(args.out) / "claims.csv", index=False)
    print(f"wrote {Path(args.out) / 'claims.csv'}")


if __name__ == "__main__":
    main()
