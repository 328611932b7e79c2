"""Time to target for `arcsim run`'s candidates, from a trained history (`arcsim run --history DIR`).

An `arcsim train` directory with a target (plain, or under a network schedule: its static runs) holds the
steps each (compressor, ratio) took to reach the target, per seed. A candidate of this run whose
compressor and ratio were trained there gets an estimated time to target: those steps (mean over the
seeds that reached it) times its iteration time here. The Pareto front's pick weighs one step's time
against its error; the estimate weighs the whole training, and the two can disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from arcsim.errors import ArcsimError
from arcsim.files import read_json
from arcsim.run.decisions import ParetoPoint
from arcsim.train.outcome import first_reach
from arcsim.train.target import Target

Key = tuple[str, float | None]  # (compressor, ratio; None for the density-free ones)


@dataclass(frozen=True)
class TrainedSteps:
    directory: str
    model: str
    target: Target
    steps: dict[Key, tuple[float, int, int]]  # mean steps over the seeds that reached it, reached, seeds

    def lookup(self, compressor: str, density: float | None) -> tuple[float, int, int] | None:
        for (name, ratio), found in self.steps.items():
            if name == compressor and (ratio is None or density is None or math.isclose(ratio, density,
                                                                                        rel_tol=1e-6)):
                return found
        return None


def load_trained(directory: str) -> TrainedSteps:
    """Steps to target per (compressor, ratio) of an `arcsim train` directory; refused when it has none."""
    where = Path(directory)
    config_path, history_path = where / "config.json", where / "history.csv"
    if not config_path.is_file() or not history_path.is_file():
        raise ArcsimError(f"--history {directory}: not an arcsim train directory (config.json and history.csv); "
                          "give the --out of an arcsim train run with --target or --target-loss")
    config = read_json(config_path, "arcsim train record", ArcsimError)
    if (where / "target.json").is_file():  # a plain experiment's last summary; a schedule's is in its config
        config = config | read_json(where / "target.json", "arcsim train target", ArcsimError)
    if config.get("target") is not None:
        target = Target(float(config["target"]))
    elif config.get("target_loss") is not None:
        target = Target(float(config["target_loss"]), "loss")
    else:
        raise ArcsimError(f"--history {directory} was trained without a target: its runs have no time to target "
                          "(train again with --target or --target-loss, in a new --out)")
    history = pd.read_csv(history_path)
    if "policy" in history:  # under a schedule: the static runs, one per (compressor, ratio)
        runs = history[history["policy"] == "static"]
        keys = {c: _parse_choice(c) for c in runs["choice"].unique()}
        groups = runs.groupby("choice")
    else:
        density = config.get("density")
        keys = {c: (c, density) for c in history["compressor"].unique()}
        groups = history.groupby("compressor")
    steps: dict[Key, tuple[float, int, int]] = {}
    for label, rows in groups:
        reached = [first_reach(run, target).step for _, run in rows.groupby("seed")]
        hit = [s for s in reached if not math.isnan(s)]
        steps[keys[label]] = (sum(hit) / len(hit) if hit else math.nan, len(hit), len(reached))
    return TrainedSteps(directory, str(config.get("model")), target, steps)


def _parse_choice(label: str) -> Key:
    name, _, ratio = label.partition("@")
    return name, float(ratio) if ratio else None


def time_to_target(points: list[ParetoPoint], chosen: ParetoPoint, trained: TrainedSteps) -> dict[str, Any]:
    """Per front point with trained steps: its estimated time to target; the soonest, and the pick's."""
    rows: list[dict[str, Any]] = []
    for p in points:
        found = trained.lookup(p.compressor, p.density)
        if found is None or math.isnan(found[0]):
            continue
        rows.append({"compressor": p.compressor, "collective": p.collective, "density": p.density,
                     "steps": found[0], "reached": f"{found[1]}/{found[2]}", "iteration_s": p.iteration_s,
                     "time_to_target_s": found[0] * p.iteration_s, "pick": p == chosen})
    soonest = min(rows, key=lambda r: r["time_to_target_s"]) if rows else None
    return {"history": trained.directory, "model": trained.model, "target": trained.target.label,
            "points": rows, "soonest": soonest, "pick": next((r for r in rows if r["pick"]), None)}


def render_time_to_target(found: dict[str, Any], console: Any) -> None:
    """The soonest estimated candidate beside the front's pick, and which one the pick is."""
    console.print(f"Time to {found['target']} (steps from {found['history']}, {found['model']}, × iteration time "
                  "here):")
    if found["soonest"] is None:
        console.print("  no candidate of this run was trained to the target there")
        return

    def line(r: dict[str, Any]) -> str:
        ratio = "" if r["density"] is None else f"@{r['density']:g}"
        return (f"{r['compressor']}{ratio} {r['collective']}: {r['steps']:.0f} steps ({r['reached']} seeds) × "
                f"{r['iteration_s'] * 1e3:.3f} ms = {r['time_to_target_s']:.3g} s")

    console.print(f"  soonest: {line(found['soonest'])}")
    pick = found["pick"]
    console.print(f"  the pick (★): {line(pick)}" if pick is not None else
                  "  the pick (★): not trained there, no estimate")
    if pick is not None and pick is not found["soonest"]:
        later = pick["time_to_target_s"] / found["soonest"]["time_to_target_s"]
        console.print(f"  the pick reaches the target {later:.2f}× later than the soonest; the recommendation above "
                      "stays the front's pick (per-step time against error)")
