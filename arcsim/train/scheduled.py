"""`arcsim train --network-schedule`: static and adaptive policies trained under a changing network, every
step priced on the network in force at that step, and the bound (the best switching sequence of the static
choices over the phases, arcsim.train.bound); resumable down to the step.

The output directory holds ``config.json`` (what the runs depend on), ``history.csv`` (one row per step of
every finished run), ``by_phase.csv`` (each static run priced all on each network: its mean step time and
time to the target there), ``bound.csv`` (per seed: the bound's time, steps and sequence),
``decisions.jsonl`` (every adaptive decision with the estimates it used), and while a run is
under way ``checkpoints/<run>.pt``, saved every CHECKPOINT_EVERY steps: an interrupted run goes on from
its last checkpoint, its decisions so far included.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from arcsim.catalog import COMPRESSORS, HIERARCHIES, INFO, hierarchy_message
from arcsim.compressors.grouping import Grouping, group_workers
from arcsim.errors import ArcsimError
from arcsim.files import AppendOnlyCSV, atomic_path, write_atomic
from arcsim.network_schedule import NetworkSchedule
from arcsim.run.target import Target
from arcsim.topology import load_topology
from arcsim.train.bound import best_sequence, curve_of, segments_after
from arcsim.train.experiment import RUN_KEYS, claim_dir
from arcsim.train.loop import Setup, TrainConfig, TrainingRun, prepare
from arcsim.train.outcome import seed_outcomes
from arcsim.train.policies import (
    ASF_WEIGHTS,
    DRIFT,
    OBJECTIVES,
    PAPER_RATIOS,
    WARMUP_COMPRESSOR,
    WARMUP_FROM,
    WARMUP_SHARE,
    Choice,
    Controller,
    DecisionContext,
    Pricing,
    price_run,
    price_static,
    time_to,
)

POLICIES = ("static", "adaptive", "bound")
HISTORY_COLUMNS = ("policy", "choice", "seed", "step", "loss", "accuracy", "val_loss", "time_s", "compressor",
                   "density", "collective", "phase", "diverged", "hierarchy")
# phase: the network slot (0 the topology's own, i the schedule's phase i); final: the target's metric at the end
BY_PHASE_COLUMNS = ("choice", "seed", "phase", "collective", "step_s", "time_to_target_s", "final")
BOUND_COLUMNS = ("seed", "time_to_target_s", "steps_to_target", "sequence")
CHECKPOINT_EVERY = 25
CHECKPOINT_VERSION = 3  # bumped whenever what a checkpoint pickles changes shape: older ones are set aside


@dataclass
class ScheduledConfig:
    train: TrainConfig
    schedule: NetworkSchedule
    topology: str
    policies: tuple[str, ...] = POLICIES
    candidates: tuple[str, ...] = ("topk", "arctopk", "adaptive")
    ratios: tuple[float, ...] = PAPER_RATIOS
    target: Target | None = None
    warmup: int | None = None       # steps; None: WARMUP_SHARE of the run
    engine: str = "analytic"
    gpu: str | None = None
    library: str | None = None
    drift: float = DRIFT
    weights: tuple[float, float] = ASF_WEIGHTS
    stop_at_target: bool = False    # end each run at its first evaluation at or above the target
    objective: str = "time-to-target"  # adaptive's: time-to-target or asf (arcsim.train.policies)
    hierarchy: str = "flat"         # the candidates' hierarchy: flat, node (node-aware) or both

    @property
    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(1, round(WARMUP_SHARE * self.train.steps))

    @property
    def hierarchies(self) -> tuple[str, ...]:
        """The hierarchies the candidates are tried in (the warm-up runs the first)."""
        return ("flat", "node") if self.hierarchy == "both" else (self.hierarchy,)

    @property
    def choices(self) -> list[Choice]:
        """The static candidates: every compressor at every ratio (density-free ones once), in every hierarchy."""
        return [Choice(c, r, h) for h in self.hierarchies for c in self.candidates
                for r in (self.ratios if not INFO[c].density_free else (1.0,))]

    def grouping(self) -> Grouping | None:
        """Node-aware candidates: the workers grouped into the topology's nodes (None: flat only)."""
        if self.hierarchy == "flat":
            return None
        return group_workers(self.train.workers, load_topology(self.topology).gpus_per_node)

    def check(self) -> None:
        self.train.check()
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies:
            raise ArcsimError(f"unknown policy {unknown[0] if unknown else '(none)'!r}; choose from "
                              f"{', '.join(POLICIES)} (comma-separated)")
        bad = [c for c in self.candidates if c not in COMPRESSORS]
        if bad or not self.candidates:
            raise ArcsimError(f"unknown candidate compressor {bad[0] if bad else '(none)'!r}; choose from "
                              f"{', '.join(COMPRESSORS)}")
        if not self.ratios or not all(0 < r <= 1 for r in self.ratios):
            raise ArcsimError("--ratios must be densities in (0, 1], e.g. 0.1,0.033,0.011,0.004,0.001")
        if "bound" in self.policies and self.target is None:
            raise ArcsimError("--policy bound needs a target (--target or --target-loss): the bound is the "
                              "soonest any sequence of the static choices reaches it")
        if self.objective not in OBJECTIVES:
            raise ArcsimError(f"unknown objective {self.objective!r}; choose {' or '.join(OBJECTIVES)}")
        if not 0 <= self.warmup_steps < self.train.steps:
            raise ArcsimError(f"--warmup must lie in [0, {self.train.steps}) steps, got {self.warmup_steps}")
        if self.stop_at_target and self.target is None:
            raise ArcsimError("--stop-at-target needs a target (--target or --target-loss)")
        if not self.drift > 0:
            raise ArcsimError(f"--drift must be positive, got {self.drift}")
        if self.hierarchy not in HIERARCHIES:
            raise ArcsimError(hierarchy_message(self.hierarchy))
        if self.train.hierarchy != "flat":
            raise ArcsimError("under a network schedule the hierarchy is the policies' (ScheduledConfig.hierarchy); "
                              "leave TrainConfig.hierarchy flat")
        self.grouping()  # node-aware: the topology has nodes of two or more GPUs and the workers make two nodes
        self.schedule.check_steps(self.train.steps)

    def key(self) -> dict[str, Any]:
        raw = asdict(self.train)
        return {**{k: raw[k] for k in RUN_KEYS}, "topology": self.topology, "engine": self.engine, "gpu": self.gpu,
                "library": self.library, "schedule": [p.to_dict() for p in self.schedule.phases],
                "candidates": list(self.candidates), "ratios": list(self.ratios),
                **(self.target.key() if self.target else {"target": None}), "warmup": self.warmup_steps,
                "drift": self.drift, "weights": list(self.weights), "stop_at_target": self.stop_at_target,
                "objective": self.objective, **({"hierarchy": self.hierarchy} if self.hierarchy != "flat" else {}),
                **self.train.extra_key()}


def _open(out: Path, key: dict[str, Any], steps: int, stop: Target | None) -> set[tuple[str, str, int]]:
    """Create or reopen the directory; the (policy, choice, seed) runs already finished (all steps, diverged, or
    at the target ``stop``)."""
    claim_dir(out, key)
    history = load_history(out)
    path = out / "history.csv"
    if path.exists() and path.open().readline().rstrip("\r\n").split(",") != list(HISTORY_COLUMNS):
        write_atomic(path, history.to_csv(index=False))  # written before a column was added: rows appended fit it
    history = history.assign(hit=stop.met(history[stop.column]) if stop is not None else False)
    ends = history.groupby(["policy", "choice", "seed"]).agg(last=("step", "max"), diverged=("diverged", "any"),
                                                             hit=("hit", "any"))
    return {(p, c, int(s)) for (p, c, s), r in ends.iterrows() if r["last"] == steps or r["diverged"] or r["hit"]}


def _table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A results table of the directory (empty with its columns when not written yet)."""
    if not path.exists():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    AppendOnlyCSV(path, columns).repair()  # a row cut off by a kill
    return pd.read_csv(path).reindex(columns=list(columns))  # an older table: the newer columns empty


def load_history(out: Path) -> pd.DataFrame:
    return _table(out / "history.csv", HISTORY_COLUMNS)


class ScheduledExperiment:
    """Trains the runs a ScheduledConfig asks for into ``out``, skipping finished ones."""

    def __init__(self, scfg: ScheduledConfig, out: Path, announce: Callable[[str], None] = print,
                 progress: Callable[[int, int], None] | None = None) -> None:
        scfg.check()
        self.scfg, self.out, self.announce, self.progress = scfg, out, announce, progress
        self.cfg = scfg.train
        topo = load_topology(scfg.topology).with_overrides(library=scfg.library,
                                                           gpu=scfg.gpu.lower() if scfg.gpu else None)
        self.setup: Setup = prepare(self.cfg)  # every check before the directory is touched
        self.pricing = Pricing(self.setup, topo, scfg.schedule, scfg.engine, self.cfg.scope)
        self.decide = DecisionContext(self.cfg, self.setup, self.pricing, scfg.candidates, scfg.ratios,
                                      scfg.weights, scfg.drift, scfg.objective, scfg.target, scfg.hierarchies,
                                      scfg.grouping())
        self.done = _open(out, scfg.key(), self.cfg.steps, scfg.target if scfg.stop_at_target else None)

    def runs(self) -> list[tuple[str, str, int]]:
        """Every (policy, choice, seed) trained; the bound is computed from the static runs of its seed."""
        wanted = []
        for seed in self.cfg.seeds:
            if "static" in self.scfg.policies or "bound" in self.scfg.policies:
                wanted += [("static", c.label, seed) for c in self.scfg.choices]
            if "adaptive" in self.scfg.policies:
                wanted.append(("adaptive", "adaptive", seed))
        return wanted

    def run(self) -> pd.DataFrame:
        todo = [r for r in self.runs() if r not in self.done]
        if len(todo) < len(self.runs()):
            self.announce(f"resuming: {len(self.runs()) - len(todo)} of {len(self.runs())} runs are already in "
                          f"{self.out / 'history.csv'}")
        total = len(todo) * self.cfg.steps
        for i, (policy, choice, seed) in enumerate(todo):
            self._train(policy, choice, seed, partial(self._tick, i * self.cfg.steps, total))
        if "bound" in self.scfg.policies:
            self._bounds()
        history = load_history(self.out)
        keep = [(p, c, int(s)) in set(self.runs()) for p, c, s in history[["policy", "choice", "seed"]].itertuples(
            index=False)]
        return history[keep]

    def _tick(self, before: int, total: int, step: int) -> None:
        if self.progress:
            self.progress(before + step, total)

    def _controller(self, policy: str, choice: str, seed: int) -> Controller:
        warmup = self.scfg.warmup_steps
        if policy == "static":
            picked = next(c for c in self.scfg.choices if c.label == choice)
            return Controller(policy, warmup, choice=picked)
        return Controller(policy, warmup)

    def _train(self, policy: str, choice: str, seed: int, progress: Callable[[int], Any]) -> None:
        ckpt = self.out / "checkpoints" / f"{policy}-{choice}-s{seed}.pt"
        state = self._checkpoint(ckpt)
        if state is not None:
            run, controller = state["run"], state["controller"]
            self.announce(f"{policy} {choice} seed {seed}: going on from the checkpoint at step {run.step}")
        else:
            run = TrainingRun(self.cfg, self.setup, WARMUP_COMPRESSOR, seed, density=WARMUP_FROM,
                              timed=self.pricing.timed)
            controller = self._controller(policy, choice, seed)
        before = partial(controller.before, ctx=self.decide)
        while run.step < self.cfg.steps and not self._reached(run) and run.advance(self.cfg, self.setup, before):
            progress(run.step)
            if run.step % CHECKPOINT_EVERY == 0 and run.step < self.cfg.steps:
                ckpt.parent.mkdir(exist_ok=True)
                with atomic_path(ckpt) as tmp:
                    torch.save({"version": CHECKPOINT_VERSION, "run": run, "controller": controller}, tmp)
        self._record(policy, choice, seed, run, controller)
        ckpt.unlink(missing_ok=True)

    def _checkpoint(self, path: Path) -> dict[str, Any] | None:
        """A run's checkpoint, or None (none yet; or unreadable or from another version: then the run starts
        over, said, rather than going on from a state this code may misread)."""
        if not path.exists():
            return None
        try:
            state = torch.load(path, weights_only=False)
        except Exception as exc:  # a truncated or foreign pickle: start over, and say so
            self.announce(f"{path} is unreadable ({type(exc).__name__}): that run starts over")
            return None
        if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
            self.announce(f"{path} was written by another version of arcsim: that run starts over")
            return None
        return state

    def _reached(self, run: TrainingRun) -> bool:
        target = self.scfg.target
        if not (self.scfg.stop_at_target and target is not None and run.hist.eval_steps):
            return False
        return bool(target.met(self._metric(run.hist)[-1]))

    def _record(self, policy: str, choice: str, seed: int, run: TrainingRun, controller: Controller) -> None:
        meas, hist = run.hist.measurement, run.hist
        used = list(controller.used[:len(meas.records)])
        evaluations = list(zip(hist.eval_steps, self._metric(hist), strict=True))
        if policy == "static":
            seconds, collectives, _ = price_static(used, meas.records, meas.compress_s, self.pricing,
                                                   controller.warmup)
            self._record_by_phase(choice, seed, used, meas, evaluations, hist, controller.warmup)
        else:
            seconds, collectives = price_run(used, meas.records, meas.compress_s, self.pricing)
        for step, extra in controller.overhead_s.items():  # an adaptive decision compresses every candidate
            if step < len(seconds):
                seconds[step] += extra
        acc = dict(zip(hist.eval_steps, hist.accuracy, strict=True))
        val = dict(zip(hist.eval_steps, hist.val_loss, strict=True))
        elapsed = np.cumsum(seconds)
        rows = []
        for i, loss in enumerate(hist.loss):
            phase = self.scfg.schedule.index_at(i)
            rows.append({"policy": policy, "choice": choice, "seed": seed, "step": i + 1, "loss": loss,
                         "accuracy": acc.get(i + 1, math.nan), "val_loss": val.get(i + 1, math.nan),
                         "time_s": float(elapsed[i]) if i < len(elapsed) else math.nan,
                         "compressor": used[i][0] if i < len(used) else "", "density": used[i][1] if i < len(used)
                         else math.nan, "collective": collectives[i] if i < len(collectives) else "",
                         "phase": 0 if phase is None else phase + 1, "diverged": hist.diverged_at is not None,
                         "hierarchy": used[i][3] if i < len(used) else ""})
        if controller.decisions:
            with (self.out / "decisions.jsonl").open("a") as fh:
                for d in controller.decisions:
                    fh.write(json.dumps({"policy": policy, "seed": seed, **d}) + "\n")
        AppendOnlyCSV(self.out / "history.csv", HISTORY_COLUMNS).append(rows)

    def _metric(self, hist: Any) -> list[float]:
        """The evaluations the target is judged on (accuracy without a target)."""
        target = self.scfg.target
        return target.of(hist) if target is not None else hist.accuracy

    def _record_by_phase(self, choice: str, seed: int, used: list, meas: Any, evaluations: list,
                         hist: Any, warmup: int) -> None:
        """The static run priced all on each network of the schedule: its mean step time after the warm-up and
        its time to the target there (what the bound chooses from)."""
        if self.scfg.target is None:
            return
        rows = []
        final = evaluations[-1][1] if evaluations else math.nan
        for slot in range(len(self.pricing.contexts)):
            seconds, _, best = price_static(used, meas.records, meas.compress_s, self.pricing, warmup, slot)
            rows.append({"choice": choice, "seed": seed, "phase": slot, "collective": best or "",
                         "step_s": float(np.mean(seconds[warmup:])) if len(seconds) > warmup else math.nan,
                         "time_to_target_s": time_to(evaluations, seconds, self.scfg.target), "final": final})
        AppendOnlyCSV(self.out / "by_phase.csv", BY_PHASE_COLUMNS).append(rows)

    def _bounds(self) -> None:
        """The bound of every seed whose static runs are all in, not yet in bound.csv."""
        target = self.scfg.target
        assert target is not None
        have = set(load_bounds(self.out)["seed"].astype(int))
        history, by_phase = load_history(self.out), _table(self.out / "by_phase.csv", BY_PHASE_COLUMNS)
        labels = [c.label for c in self.scfg.choices]
        rows = []
        for seed in self.cfg.seeds:
            static = history[(history["policy"] == "static") & (history["seed"] == seed)
                             & history["choice"].isin(labels)]
            if seed in have or set(static["choice"]) < set(labels):
                continue
            rows.append({"seed": seed, **seed_bound(static, by_phase[by_phase["seed"] == seed], target,
                                                    self.scfg.warmup_steps, self.cfg.steps,
                                                    [p.start for p in self.scfg.schedule.phases], self.pricing.slot)})
        if rows:
            AppendOnlyCSV(self.out / "bound.csv", BOUND_COLUMNS).append(rows)


def seed_bound(static: pd.DataFrame, by_phase: pd.DataFrame, target: Target, warmup: int, steps: int,
               starts: list[int], slot_at: Callable[[int], int]) -> dict[str, Any]:
    """One seed's bound from its static runs' history and by_phase rows: the best switching sequence, or a
    static choice's own measured time where that is sooner (each static choice is one sequence)."""
    curves = {}
    for label, run in static.groupby("choice"):
        evals = run.dropna(subset=[target.column]).sort_values("step")
        prices = by_phase[by_phase["choice"] == label]
        curves[str(label)] = curve_of(evals["step"].tolist(), evals[target.column].tolist(), target,
                                      dict(zip(prices["phase"].astype(int), prices["step_s"], strict=True)))
    start = min(c.level_at(warmup) for c in curves.values())
    warmup_s = float(static.loc[static["step"] == warmup, "time_s"].min()) if warmup else 0.0
    found = best_sequence(curves, segments_after(warmup, steps, starts, slot_at), target, start, warmup, warmup_s)
    own = summarise(static, target).dropna(subset=["time_to_target_s"])
    if not own.empty and (math.isnan(found.time_s) or own["time_to_target_s"].min() < found.time_s):
        row = own.loc[own["time_to_target_s"].idxmin()]
        return {"time_to_target_s": float(row["time_to_target_s"]), "steps_to_target": row["steps_to_target"],
                "sequence": f"static {row['choice']}"}
    return {"time_to_target_s": found.time_s, "steps_to_target": found.steps, "sequence": " → ".join(found.sequence)}


def load_bounds(out: Path) -> pd.DataFrame:
    return _table(out / "bound.csv", BOUND_COLUMNS)


def decisions(out: Path) -> list[dict[str, Any]]:
    path = out / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def summarise(history: pd.DataFrame, target: Target | None, bounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (policy, choice) over seeds: final accuracy, and time and steps to the target (mean and sd over the
    seeds that reached it)."""
    out = []
    for (policy, choice), runs in history.groupby(["policy", "choice"], sort=False):
        finals, reaches = seed_outcomes(runs, target)
        reached = [r for r in reaches if not math.isnan(r.step)]
        times, steps = [r.time_s for r in reached], [r.step for r in reached]
        row: dict[str, Any] = {"policy": policy, "choice": choice, "seeds": len(finals),
                               "final_acc_mean": float(np.mean(finals)),
                               "final_acc_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0,
                               "final_loss_mean": float(np.mean(seed_outcomes(runs, None, "val_loss")[0])),
                               "total_time_s": float(runs.groupby("seed")["time_s"].max().mean())}
        if target is not None:
            row.update(reached=len(times), time_to_target_s=float(np.mean(times)) if times else math.nan,
                       time_to_target_std=float(np.std(times, ddof=1)) if len(times) > 1 else 0.0,
                       steps_to_target=float(np.mean(steps)) if steps else math.nan)
        out.append(row)
    if bounds is not None and not bounds.empty and target is not None:
        times = bounds["time_to_target_s"].dropna()
        out.append({"policy": "bound", "choice": "per seed (bound.csv)", "seeds": len(bounds),
                    "final_acc_mean": math.nan, "final_acc_std": math.nan, "final_loss_mean": math.nan,
                    "total_time_s": math.nan, "reached": len(times),
                    "time_to_target_s": float(times.mean()) if len(times) else math.nan,
                    "time_to_target_std": float(times.std(ddof=1)) if len(times) > 1 else 0.0,
                    "steps_to_target": float(bounds["steps_to_target"].dropna().mean()) if len(times) else math.nan})
    return pd.DataFrame(out)


def headline(summary: pd.DataFrame, target: Target | None) -> pd.DataFrame:
    """Best static (most seeds reaching the target, then the soonest), adaptive and the bound: one row each."""
    static = summary[summary["policy"] == "static"]
    rows = []
    if not static.empty:
        if target is not None:
            ranked = static.assign(miss=-static["reached"]).sort_values(["miss", "time_to_target_s"])
        else:
            ranked = static.sort_values("final_acc_mean", ascending=False)
        rows.append(ranked.iloc[0].drop(labels=["miss"], errors="ignore"))
    rows += [r for _, r in summary[summary["policy"].isin(["adaptive", "bound"])].iterrows()]
    table = pd.DataFrame(rows).reset_index(drop=True)
    if target is not None and not table.empty and "static" in set(table["policy"]):
        base = float(table.loc[table["policy"] == "static", "time_to_target_s"].iloc[0])
        table["vs_best_static"] = 1 - table["time_to_target_s"] / base
    return table
