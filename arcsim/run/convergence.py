"""Time to target for `arcsim run`'s candidates: a model of the steps a compressor's error costs (the default
policy decides by it), and estimates from a trained history (`arcsim run --history DIR`).

**The steps model.** Error feedback makes a compressor a contraction: it keeps 1 − e of the gradient's energy
(e: `arcsim run`'s relative aggregate error), and EF-SGD's analyses slow convergence by a power of 1/(1 − e).
``steps(e) = steps(0) · (1 − e)^(−β)``, fitted by least squares through the origin of
ln(steps / dense steps) against −ln(1 − e) on arcsim's own `arcsim train` results (CALIBRATION: the digits
CNN's steps to 95 % in docs/train.md, errors measured by `arcsim run` on the shipped cnn-digits trace). The
interval is a 95 % prediction interval (Student's t: β's uncertainty and the points' own scatter, seed noise
included, whose variance grows in proportion to −ln(1 − e): none at error 0, where the model is dense). The
model holds for the selections it was trained on (top-k, leader, sketch, the casts) and for errors up to the
largest that reached the target (CALIBRATION's ``max_error``); beyond that there is no evidence.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.errors import ArcsimError
from arcsim.files import read_json
from arcsim.run.target import Target, first_reach

if TYPE_CHECKING:
    from arcsim.run.decisions import ParetoPoint

Key = tuple[str, float | None]  # (compressor, ratio; None for the density-free ones)

# (compressor, density, relative error on traces/cnn-digits-small.npz by `arcsim run` (16 steps, EF14, 8
# workers), mean steps to 95 % of the runs that reached it, runs reached / seeds) — docs/train.md, "The seeds'
# claims at small scale": cnn on digits, 8 workers × batch 16, EF14, seeds 0,1,2, 300 steps; dense took 97.
# arctopk@0.01 reached in 1 of 3 seeds: its 250 is a lower bound on the mean, kept (it pulls β up, not down).
# randk (0.899 at 0.1, 0.989 at 0.01) reached in no seed: a random selection is outside the model.
CALIBRATION_DENSE_STEPS = 97.0
CALIBRATION: tuple[tuple[str, float, float, float, str], ...] = (
    ("topk", 0.1, 0.2064, 100.0, "3/3"),
    ("star", 0.1, 0.5681, 123.0, "3/3"),
    ("arctopk", 0.1, 0.6615, 163.0, "3/3"),
    ("topk", 0.01, 0.7840, 157.0, "3/3"),
    ("arctopk", 0.01, 0.8760, 250.0, "1/3"),
    ("star", 0.01, 0.9034, 207.0, "3/3"),
)
COVERED_SELECTIONS = ("none", "top-k", "leader", "sketch", "adaptive")  # catalog selection kinds trained here
DEFAULT_DENSE_STEPS = 1000.0  # steps dense takes to the target: scales every time to target, never the ranking


@dataclass(frozen=True)
class StepsModel:
    """steps(e) = dense_steps · (1 − e)^(−β), β with its 95 % prediction interval."""

    beta: float
    beta_se: float
    scatter: float             # residual variance of ln(steps ratio) per unit of x = −ln(1 − e)
    t: float                   # Student's t quantile (97.5 %) at the fit's degrees of freedom
    sxx: float                 # Σ x² of the fit
    max_error: float           # the largest error that reached the target in the data
    dense_steps: float = DEFAULT_DENSE_STEPS

    def factor(self, error: float) -> float:
        """Steps relative to dense at relative error ``error``."""
        return math.exp(self.beta * self._x(error))

    def factor_interval(self, error: float) -> tuple[float, float]:
        """The 95 % prediction interval of the factor (the fit's and the points' own uncertainty)."""
        x = self._x(error)
        half = self.t * math.sqrt(x * x * self.beta_se ** 2 + x * self.scatter)
        return math.exp(self.beta * x - half), math.exp(self.beta * x + half)

    def covers(self, error: float) -> bool:
        return error <= self.max_error + 1e-3  # the data's errors are given to 3-4 places

    @staticmethod
    def _x(error: float) -> float:
        return -math.log(max(1e-12, 1.0 - min(error, 1.0 - 1e-12)))

    def describe(self) -> str:
        return (f"steps = dense steps × (1 − error)^−β, β = {self.beta:.3f} (± {self.t * self.beta_se:.3f}, 95 %), "
                f"fitted on {len(CALIBRATION)} arcsim train results (digits CNN to 95 %, docs/train.md); "
                f"holds up to error {self.max_error:.3f}")

    def to_dict(self) -> dict[str, Any]:
        return {"form": "steps = dense_steps * (1 - rel_error) ** -beta", "beta": self.beta,
                "beta_interval": [self.beta - self.t * self.beta_se, self.beta + self.t * self.beta_se],
                "log_variance_per_x": self.scatter, "max_error": self.max_error, "dense_steps": self.dense_steps,
                "interval": "95 % prediction interval of ln(steps ratio) (Student's t)",
                "data": [{"compressor": c, "density": d, "rel_error": e, "steps": s, "reached": r}
                         for c, d, e, s, r in CALIBRATION], "data_dense_steps": CALIBRATION_DENSE_STEPS}


def fit_steps_model(dense_steps: float = DEFAULT_DENSE_STEPS) -> StepsModel:
    """The steps model fitted on CALIBRATION."""
    from scipy.special import stdtrit  # Student's t quantile, stdtrit(dof, q)

    x = np.array([-math.log(1 - e) for _, _, e, _, _ in CALIBRATION])
    y = np.array([math.log(s / CALIBRATION_DENSE_STEPS) for _, _, _, s, _ in CALIBRATION])
    sxx = float(x @ x)
    beta = float(x @ y) / sxx
    dof = len(x) - 1
    resid2 = (y - beta * x) ** 2
    # the scatter grows with compression (none at error 0, where the model is dense itself): variance ∝ x
    per_x = float(np.sum(resid2) / np.sum(x)) * len(x) / dof
    beta_se = math.sqrt(float(np.sum(resid2)) / dof / sxx)
    return StepsModel(beta, beta_se, per_x, float(stdtrit(dof, 0.975)), sxx,
                      max(e for _, _, e, _, r in CALIBRATION if not r.startswith("0/")), dense_steps)


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
    import pandas as pd  # only for --history: pandas costs 0.3 s to import

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


def time_to_target(points: list[ParetoPoint], chosen: ParetoPoint | None, trained: TrainedSteps,
                   chosen_by: str = "the front's pick (per-step time against error)") -> dict[str, Any]:
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
            "points": rows, "soonest": soonest, "pick": next((r for r in rows if r["pick"]), None),
            "chosen_by": chosen_by}


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
        console.print(f"  the pick reaches the target {later:.2f}× later than the soonest there; the recommendation "
                      f"above stays {found.get('chosen_by', 'the front' + chr(39) + 's pick')}")
