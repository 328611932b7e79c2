"""Who picks the (compressor, collective, ratio, hierarchy) of each training step when the network changes.

Every policy starts with the same warm-up (Tyagi & Swany): Top-K with its ratio falling geometrically
from 1.0 to 0.1 over the first ``warmup`` steps. Then:

- ``static`` keeps one (compressor, ratio, hierarchy) for the rest of the run; its collective is the one that
  makes the whole run fastest (chosen after it, in hindsight).
- ``adaptive`` re-decides when the warm-up ends, when the network changes and when the running
  compressor's measured gain ‖C(u)‖/‖u‖ drifts from the value it was chosen at by more than ``drift``
  (relative). A decision runs every candidate (compressor, ratio, and flat or node-aware where both are
  asked for) once on this step's gradients, each with a copy of the run's error-feedback memory (regrouped
  to the candidate's hierarchy), and prices what each sends with every collective its library offers on
  every network of the schedule. The objective ``time-to-target`` (default) picks the candidate
  with the shortest estimated time to the target (arcsim.train.estimate: the run's own progress, the
  candidate's descent ratio, its step time on the networks to come), keeping the running one unless
  another is estimated ``KEEP_MARGIN`` sooner; ``asf`` minimises the achievement scalarising function
  max(w_t · t̂, w_g · ĝ) of this step's time and gain shortfall, both scaled to [0, 1] over the
  candidates (weights 0.6 / 0.4).
- ``bound`` is not trained: arcsim.train.bound finds the best switching sequence of the static choices over
  the phases from their runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from arcsim.catalog import INFO
from arcsim.compressors.grouping import Grouping
from arcsim.network_schedule import NetworkSchedule
from arcsim.pricing import Pricer, algorithms_for
from arcsim.run.candidates import Context, compress_times, main_op_of, step_timeline
from arcsim.run.measure import BucketedCompression
from arcsim.run.target import Target
from arcsim.topology import Topology
from arcsim.train.estimate import descent_ratio, expected_time, fit_progress
from arcsim.train.loop import Setup, TrainConfig, TrainingRun
from arcsim.train.outcome import priced_on

PAPER_RATIOS = (0.1, 0.033, 0.011, 0.004, 0.001)
ASF_WEIGHTS = (0.6, 0.4)  # step time, compression gain
DRIFT = 0.25               # relative change of the running gain that triggers a new decision
KEEP_MARGIN = 0.05         # time-to-target: another candidate must be estimated this much sooner to switch
OBJECTIVES = ("time-to-target", "asf")
WARMUP_COMPRESSOR, WARMUP_FROM, WARMUP_TO = "topk", 1.0, 0.1
WARMUP_SHARE = 0.1         # of the run's steps, by default
Used = tuple[str, float, str | None, str]  # one step's compressor, ratio, collective (None: its fastest), hierarchy


@dataclass(frozen=True)
class Choice:
    compressor: str
    density: float
    hierarchy: str = "flat"  # or node: dense inside each node, compressed between nodes

    @property
    def label(self) -> str:
        return f"{self.compressor}@{self.density:g}" + ("" if self.hierarchy == "flat" else f"/{self.hierarchy}")


def warmup_density(step: int, warmup: int) -> float:
    """The warm-up ratio at ``step``: geometric from WARMUP_FROM at step 0 to WARMUP_TO at the last warm-up step."""
    if warmup <= 1:
        return WARMUP_TO
    return WARMUP_FROM * (WARMUP_TO / WARMUP_FROM) ** (min(step, warmup - 1) / (warmup - 1))


class Pricing:
    """Each step priced on the network in force at that step: a context and a pricer per phase."""

    def __init__(self, setup: Setup, topo: Topology, schedule: NetworkSchedule, engine: str, scope: str) -> None:
        compute, buckets, gpu = priced_on(setup, topo)
        base = Context(None, topo, compute, buckets, engine, gpu=gpu, scope=scope)
        self.schedule = schedule
        self.contexts = [base] + [dataclasses.replace(base, topo=t) for t in schedule.topologies(topo)]
        self.pricers = [Pricer(c.topo, engine) for c in self.contexts]
        self.timed = gpu is None  # compression measured here, not modelled on the topology's GPU

    def slot(self, step: int) -> int:
        """0: the topology's own network (before the first phase); i + 1: phase i."""
        index = self.schedule.index_at(step)
        return 0 if index is None else index + 1

    def step_seconds(self, step: int, records: list, compressor: str, measured: list[float],
                     collective: str, slot: int | None = None, hierarchy: str = "flat",
                     density: float | None = None) -> float:
        """One step's predicted iteration on the network in force at ``step`` (or on network ``slot``)."""
        where = self.slot(step) if slot is None else slot
        ctx, pricer = self.contexts[where], self.pricers[where]
        timeline, _ = step_timeline(records, compress_times(compressor, measured, ctx, hierarchy, density),
                                    collective, ctx, pricer)
        return timeline.iteration_s

    def collectives(self, records: list) -> tuple[str, tuple[str, ...]]:
        """The main op of ``records`` and the algorithms the library offers for it (the same on every network)."""
        op = main_op_of(records)
        return op, algorithms_for(self.contexts[0].topo, op)

    def fastest(self, step: int, records: list, compressor: str, measured: list[float],
                slot: int | None = None, hierarchy: str = "flat",
                density: float | None = None) -> tuple[str, str, float]:
        """(op, collective, seconds) of the fastest collective for this step's records."""
        op, algos = self.collectives(records)
        times = {a: self.step_seconds(step, records, compressor, measured, a, slot, hierarchy, density)
                 for a in algos}
        best = min(times, key=times.__getitem__)
        return op, best, times[best]


def asf(times: list[float], gains: list[float], weights: tuple[float, float]) -> list[float]:
    """max(w_t · t̂, w_g · ĝ) per candidate: t̂ = (t − t_min)/(t_max − t_min), ĝ = (g_max − g)/(g_max − g_min)."""
    t, g = np.asarray(times), np.asarray(gains)
    t_hat = (t - t.min()) / (np.ptp(t) or 1.0)
    g_hat = (g.max() - g) / (np.ptp(g) or 1.0)
    return list(np.maximum(weights[0] * t_hat, weights[1] * g_hat))


@dataclass
class Controller:
    """What a policy does before each step's compression; picklable with the run (its checkpoint)."""

    policy: str
    warmup: int
    choice: Choice | None = None                 # static: the choice after warm-up
    collective: str | None = None                # adaptive: the chosen collective (None: fastest per step)
    used: list[Used] = field(default_factory=list)  # per step: compressor, ρ, collective, hierarchy
    decisions: list[dict[str, Any]] = field(default_factory=list)
    gain_at_choice: float | None = None
    overhead_s: dict[int, float] = field(default_factory=dict)  # per decision step: compressing every candidate
    phase_seen: int | None = -1
    progress_seen: dict[str, float] | None = None  # the progress fit of the last decision (time-to-target)

    def before(self, step: int, grads: torch.Tensor, run: TrainingRun, ctx: DecisionContext) -> None:
        if step < self.warmup:
            ctx.use(run, Choice(WARMUP_COMPRESSOR, warmup_density(step, self.warmup), ctx.hierarchies[0]))
            self.used.append((WARMUP_COMPRESSOR, run.bc.density, None, run.bc.hierarchy))
            return
        phase = ctx.pricing.schedule.index_at(step)
        if self.policy == "adaptive":
            reason = self._reason(step, phase, run, ctx.drift)
            if reason:
                self._decide(step, phase, reason, grads, run, ctx)
        else:
            assert self.choice is not None
            ctx.use(run, self.choice)
        self.phase_seen = phase
        self.used.append((run.bc.compressor, run.bc.density, self.collective, run.bc.hierarchy))

    def _reason(self, step: int, phase: int | None, run: TrainingRun, drift: float) -> str | None:
        if step == self.warmup:
            return "warm-up over"
        if phase != self.phase_seen:
            return "network changed"
        gains = run.hist.measurement.gain
        if self.gain_at_choice and gains:
            now = float(np.mean(gains[-1]))
            if abs(now - self.gain_at_choice) > drift * self.gain_at_choice:
                return f"gain drifted {now / self.gain_at_choice - 1:+.0%}"
        return None

    def _decide(self, step: int, phase: int | None, reason: str, grads: torch.Tensor, run: TrainingRun,
                ctx: DecisionContext) -> None:
        rows = ctx.explore(step, grads, run)
        if ctx.objective == "asf":
            scores = asf([r["time_s"] for r in rows], [r["gain"] for r in rows], ctx.weights)
            for r, s in zip(rows, scores, strict=True):
                r["asf"] = s
            best = min(range(len(rows)), key=lambda i: (scores[i], rows[i]["time_s"]))
        else:
            best = self._soonest(step, rows, run, ctx)
        chosen = rows[best]
        ctx.use(run, Choice(chosen["compressor"], chosen["density"], chosen["hierarchy"]))
        self.collective = chosen["collective"]
        self.overhead_s[step] = sum(r["compress_s"] for r in rows)  # on the compute stream, before this step
        self.gain_at_choice = chosen["gain"]
        network = ctx.pricing.schedule.phases[phase].label if phase is not None else "the topology's own"
        shown = ("compressor", "density", "hierarchy", "collective", "op", "time_s", "gain", "descent", "asf",
                 "steps_to_target", "time_to_target_s")
        self.decisions.append({"step": step, "phase": None if phase is None else phase + 1, "network": network,
                               "reason": reason, "objective": ctx.objective,
                               "chosen": {k: chosen[k] for k in shown if k in chosen},
                               "progress": self.progress_seen, "exploration_s": self.overhead_s[step],
                               "candidates": rows})

    def _soonest(self, step: int, rows: list[dict[str, Any]], run: TrainingRun, ctx: DecisionContext) -> int:
        """The candidate with the shortest estimated time to target (arcsim.train.estimate); the running one is
        kept unless another is estimated KEEP_MARGIN sooner. Each row gets its estimate."""
        hist, target = run.hist, ctx.target
        progress = None
        if target is not None:
            progress = fit_progress(hist.eval_steps, target.of(hist), hist.descent, target)
        self.progress_seen = None if progress is None else dataclasses.asdict(progress)
        for r in rows:
            if progress is not None:
                r["steps_to_target"] = progress.steps_needed(r["descent"])
                r["time_to_target_s"] = expected_time(progress, r["descent"], step, r["slot_s"],
                                                      ctx.pricing.schedule, ctx.cfg.steps)
            else:  # no fit yet: seconds per unit of progress on the network in force
                r["steps_to_target"] = math.nan
                r["time_to_target_s"] = r["time_s"] / r["descent"] if r["descent"] > 0 else math.inf
        score = [r["time_to_target_s"] for r in rows]
        best = min(range(len(rows)), key=lambda i: (score[i], rows[i]["time_s"]))
        running = next((i for i, r in enumerate(rows) if (r["compressor"], r["density"], r["hierarchy"]) ==
                        (run.bc.compressor, run.bc.density, run.bc.hierarchy)), None)
        if running is not None and score[running] <= score[best] * (1 + KEEP_MARGIN):
            return running
        return best


@dataclass
class DecisionContext:
    """What an adaptive decision needs besides the run: the candidates, the pricing and the training setup."""

    cfg: TrainConfig
    setup: Setup
    pricing: Pricing
    candidates: tuple[str, ...]
    ratios: tuple[float, ...]
    weights: tuple[float, float] = ASF_WEIGHTS
    drift: float = DRIFT
    objective: str = "time-to-target"
    target: Target | None = None
    hierarchies: tuple[str, ...] = ("flat",)  # what the candidates may be; the warm-up runs the first
    grouping: Grouping | None = None          # node-aware: the workers grouped into the topology's nodes

    def grouping_of(self, hierarchy: str) -> Grouping | None:
        return None if hierarchy == "flat" else self.grouping

    def use(self, run: TrainingRun, choice: Choice) -> None:
        """Compress ``run``'s next steps as ``choice`` says (nothing changes when it already does); error feedback
        carries over a change of compressor, ratio or hierarchy (BucketedCompression.regroup)."""
        bc = run.bc
        if bc.hierarchy != choice.hierarchy:
            bc.regroup(self.grouping_of(choice.hierarchy))
        if (bc.compressor, bc.density) != (choice.compressor, choice.density):
            bc.switch(choice.compressor, choice.density)

    def explore(self, step: int, grads: torch.Tensor, run: TrainingRun) -> list[dict[str, Any]]:
        """Every candidate (compressor, ratio, hierarchy) once on ``grads`` with a copy of the run's error feedback
        (regrouped to the candidate's hierarchy), priced with each collective on the network now in force and on
        every network of the schedule; one row per candidate, at its fastest collective now, with its descent
        ratio and step time on each network."""
        mean = grads.mean(dim=0)
        now = self.pricing.slot(step)
        rows = []
        for hierarchy in self.hierarchies:
            for name in self.candidates:
                for ratio in (self.ratios if not INFO[name].density_free else (1.0,)):
                    trial = BucketedCompression(self.setup.buckets, name, ratio, self.cfg.memory, seed=run.bc.seed,
                                                options={"scope": self.cfg.scope}, timed=self.pricing.timed,
                                                grouping=self.grouping_of(hierarchy))
                    trial.take_memories(run.bc)
                    parts, row = trial.step(step, grads, final=True)  # the trial is dropped after this step
                    by_slot = [self.pricing.fastest(step, row["records"], name, row["compress_s"], slot, hierarchy,
                                                    ratio) for slot in range(len(self.pricing.contexts))]
                    op, collective, seconds = by_slot[now]
                    local = sum(compress_times(name, row["compress_s"], self.pricing.contexts[now], hierarchy, ratio))
                    rows.append({"compressor": name, "density": ratio, "hierarchy": hierarchy,
                                 "collective": collective, "op": op, "time_s": seconds,
                                 "gain": float(np.mean(row["gain"])),
                                 "descent": descent_ratio(mean, torch.cat(parts, dim=1)[0]), "compress_s": local,
                                 "slot_s": [t for _, _, t in by_slot]})
        return rows


def price_run(used: list[Used], records: list, compress_s: list, pricing: Pricing,
              slot: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Each step's predicted seconds and collective — the controller's collective, or the step's fastest — on
    the network in force at each step (or all on network ``slot``)."""
    seconds, collectives = [], []
    for step, ((name, density, collective, hierarchy), recs, measured) in enumerate(zip(used, records, compress_s,
                                                                                        strict=False)):
        if collective is None:
            _, collective, t = pricing.fastest(step, recs, name, measured, slot, hierarchy, density)
        else:
            t = pricing.step_seconds(step, recs, name, measured, collective, slot, hierarchy, density)
        seconds.append(t)
        collectives.append(collective)
    return np.asarray(seconds), collectives


def price_static(used: list[Used], records: list, compress_s: list, pricing: Pricing,
                 warmup: int, slot: int | None = None) -> tuple[np.ndarray, list[str], str | None]:
    """A static run priced: warm-up steps on their fastest collective, the rest all on the one collective that
    makes them fastest in total (hindsight). Returns each step's seconds and collective, and that collective
    (None when the run ended inside its warm-up)."""
    head, collectives = price_run(used[:warmup], records[:warmup], compress_s[:warmup], pricing, slot)
    if len(records) <= warmup:
        return head, collectives, None
    _, algos = pricing.collectives(records[warmup])
    tails = {a: [pricing.step_seconds(s, records[s], used[s][0], compress_s[s], a, slot, used[s][3], used[s][1])
                 for s in range(warmup, len(records))] for a in algos}
    best = min(tails, key=lambda a: sum(tails[a]))
    return (np.concatenate([head, np.asarray(tails[best])]), collectives + [best] * len(tails[best]), best)


def time_to(evaluations: list[tuple[int, float]], seconds: np.ndarray, target: Target) -> float:
    """Predicted seconds until the first evaluation that meets ``target`` (NaN if never)."""
    elapsed = np.cumsum(seconds)
    for step, value in evaluations:
        if target.met(value) and step - 1 < len(elapsed):
            return float(elapsed[step - 1])
    return math.nan
