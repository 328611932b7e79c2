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
    # a 4.3 M-parameter decoder-only transformer (examples/my_model.py, width 64) on real text with AdamW:
    # bandwidth-bound on the slow phase (about 400 ms a step at 500 Mbit/s against 25 ms at 25 Gbit/s)
    "tiny_decoder": ["--model", "examples/my_model.py:build", "--model-arg", "width=64", "--dataset", "python-text",
                     "-w", "8", "-b", "2", "--optimizer", "adamw", "--lr", "0.003", "--target-loss", "6.5",
                     "--eval-every", "5", "--steps", "80", "--candidates", "topk,arctopk", "--ratios", "0.1,0.033"],
}
SCHEDULES = {"tiny_decoder": {"c3": "c3-early"}}  # where a workload's runs are too short for a schedule's steps
COLUMNS = ("schedule", "model", "policy", "best_static", "seeds", "seeds_reached", "time_to_target_mean_s",
           "time_to_target_sd_s", "steps_to_target_mean", "vs_best_static")


def experiment(schedule: str, model: str, seeds: str, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "arcsim", "train", *WORKLOADS[model], "--network-schedule",
           str(ROOT / "examples" / f"schedule-{SCHEDULES.get(model, {}).get(schedule, schedule)}.yaml"),
           "--seeds", seeds, "--stop-at-target",
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


def collect(schedule: str, model: str, out: Path) -> list[dict]:
    """The claims rows of an experiment directory as it stands, without training: the seeds whose static runs
    and adaptive run are all in (for a run cut short, say how many)."""
    from arcsim.run.target import Target
    from arcsim.train.scheduled import headline, load_bounds, load_history, seed_bound, summarise

    config = json.loads((out / "config.json").read_text())
    target = Target(config["target"]) if config.get("target") is not None else Target(config["target_loss"], "loss")
    labels = {f"{c}@{r:g}" for c in config["candidates"] for r in config["ratios"]} | {"adaptive"}
    history = load_history(out)
    history = history[history["choice"].isin(labels)]
    ends = history.groupby(["choice", "seed"])["step"].max().reset_index()
    complete = [s for s, runs in ends.groupby("seed") if set(runs["choice"]) == labels]
    history = history[history["seed"].isin(complete)]
    bounds = load_bounds(out)
    by_phase = pd.read_csv(out / "by_phase.csv")
    starts = [p["start_step"] for p in config["schedule"]]

    def slot_at(step: int) -> int:
        return sum(step >= start for start in starts)

    missing = [s for s in complete if s not in set(bounds["seed"])]
    static = history[history["policy"] == "static"]
    bounds = pd.concat([bounds[bounds["seed"].isin(complete)], pd.DataFrame([
        {"seed": s, **seed_bound(static[static["seed"] == s], by_phase[by_phase["seed"] == s], target,
                                 config["warmup"], config["steps"], starts, slot_at)} for s in missing])])
    top = headline(summarise(history, target, bounds), target)
    return [{"schedule": schedule, "model": model, "policy": h["policy"],
             "best_static": h["choice"] if h["policy"] == "static" else "", "seeds": int(h["seeds"]),
             "seeds_reached": int(h["reached"]), "time_to_target_mean_s": h["time_to_target_s"],
             "time_to_target_sd_s": h["time_to_target_std"], "steps_to_target_mean": h["steps_to_target"],
             "vs_best_static": h.get("vs_best_static")} for _, h in top.iterrows()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", default="c1,c2,c3")
    parser.add_argument("--models", default=",".join(WORKLOADS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default=str(ROOT / "reports" / "schedule"))
    parser.add_argument("--collect", action="store_true",
                        help="Only gather the directories' finished seeds into claims.csv (no training).")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        for schedule in args.schedules.split(","):
            suffix = "" if model == "mlp_wide" else f"-{model}"
            where = Path(args.out) / f"{schedule}{suffix}"
            if args.collect and not (where / "config.json").exists():
                continue  # not run (yet)
            rows += (collect(schedule, model, where) if args.collect else
                     experiment(schedule, model, args.seeds, where))
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.to_csv(Path(args.out) / "claims.csv", index=False)
    print(f"wrote {Path(args.out) / 'claims.csv'}")


if __name__ == "__main__":
    main()
