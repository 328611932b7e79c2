"""Time to target, estimated online: how many more steps each candidate needs, and what they cost on the
networks to come.

**Progress.** Let b be the run's distance from its target's good end — 1 − accuracy, or the held-out loss
— and d_t the step's first-order descent ratio ⟨ḡ_t, a_t⟩ / ‖ḡ_t‖²: ḡ_t the workers' mean gradient, a_t
the update the compressor delivered (error feedback included). d is the share of dense SGD's first-order
loss decrease the step achieves: 1 for dense, for a sparsifier of ḡ without memory the energy it keeps
(‖C(ḡ)‖² / ‖ḡ‖², its gain squared). Effective steps E_t = Σ_{s<t} d_s. The model: log b falls linearly in
E, ``log b = c − κ E``, fitted by least squares over the run's last ``FIT_WINDOW`` evaluations (over the
second half of the run so far when those show no progress).

**Steps.** A candidate whose descent ratio on this step's real gradients (with a copy of the run's
error-feedback memory) is d_c needs n_c = Δ / (κ d_c) more steps, Δ = log(b_now / b*), b_now the latest
evaluation and b* the target's.

**Uncertainty.** Near a target the metric is noisy and Δ small, so n_c is uncertain: with s the fit's
residual standard deviation (of log b) and se(κ) its slope's standard error, log n_c has standard deviation
σ = √((s/Δ)² + (se(κ)/κ)²). Times are the expectation over that lognormal spread (Gauss–Hermite nodes):
a candidate whose likely finish falls just before a slow phase pays for the chance that it does not.
Replayed on the 17 static runs of the claims that reached 98 % (benchmarks/estimator_backtest.py: 1,077
predictions), the median prediction is 1.00× the steps really needed but only 43 % lie within 2× of it; 63 %
of the truths lie within ±1σ, so the spread is about as wide as the errors are (a power law in E, tried
beside it, over-predicted 3.0× at the median).

**Time.** Those steps priced one network at a time: the schedule is known in advance, so steps that fall
in a later phase cost that phase's step time (at its fastest collective).

Without a usable fit (fewer than two evaluations, or no progress across either window)
candidates are ranked by progress per second on the network now in force, d_c / t_c: the same ranking as
time to target whenever the network does not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from arcsim.network_schedule import NetworkSchedule
from arcsim.run.target import Target

FIT_WINDOW = 4  # evaluations the progress fit uses (the most recent)
NODES = 9       # Gauss–Hermite nodes of the expectation over the spread of the steps


def descent_ratio(mean_grad: torch.Tensor, update: torch.Tensor) -> float:
    """⟨ḡ, a⟩ / ‖ḡ‖²: the share of dense SGD's first-order decrease that the update ``a`` achieves."""
    norm = float(mean_grad @ mean_grad)
    return float(mean_grad @ update) / norm if norm > 0 else 0.0


def badness(target: Target, value: float) -> float:
    """Distance from the target's good end: 1 − accuracy, or the loss itself."""
    return 1.0 - value if target.metric == "accuracy" else value


@dataclass(frozen=True)
class Progress:
    """log b = c − κ E over the window, where the run is now, and how uncertain the steps it predicts are."""

    kappa: float      # decrease of log b per effective step
    b_now: float
    b_target: float
    spread: float     # σ of log(steps needed); 0 when two evaluations fix the line exactly

    def steps_needed(self, descent: float) -> float:
        """Median steps a candidate with this descent ratio needs (inf if it makes no progress)."""
        if self.b_now <= self.b_target:
            return 0.0
        if descent <= 0:
            return math.inf
        return math.log(self.b_now / self.b_target) / (self.kappa * descent)

    def outcomes(self, descent: float) -> list[tuple[float, float]]:
        """(steps, weight) over the lognormal spread; one case, the median, when there is no spread."""
        median = self.steps_needed(descent)
        if self.spread <= 0 or median in (0.0, math.inf):
            return [(median, 1.0)]
        z, w = np.polynomial.hermite_e.hermegauss(NODES)
        return [(median * math.exp(self.spread * zi), wi / w.sum()) for zi, wi in zip(z, w, strict=True)]


def _line(e: np.ndarray, log_b: np.ndarray) -> tuple[float, float, float] | None:
    """(κ, s, se(κ)) of log b = c − κ e by least squares, or None without a falling line."""
    if len(e) < 2 or np.ptp(e) <= 0:
        return None
    slope, intercept = np.polyfit(e, log_b, 1)
    if not slope * np.ptp(e) < -1e-9:  # log b must fall across the window, beyond rounding
        return None
    if len(e) == 2:
        return float(-slope), 0.0, 0.0
    residual = log_b - (intercept + slope * e)
    s = float(np.sqrt(residual @ residual / (len(e) - 2)))
    return float(-slope), s, s / float(np.sqrt(((e - e.mean()) ** 2).sum()))


def fit_progress(eval_steps: Sequence[int], values: Sequence[float], descents: Sequence[float],
                 target: Target) -> Progress | None:
    """The progress model from the run so far (None when it cannot be fitted): ``values`` of the target's metric
    at ``eval_steps`` (evaluated after that many steps), ``descents`` every step's descent ratio."""
    effective = np.concatenate([[0.0], np.cumsum(descents)])
    points = [(s, badness(target, v)) for s, v in zip(eval_steps, values, strict=True)
              if math.isfinite(v) and badness(target, v) > 0]
    if not points:
        return None
    last = points[-1][0]
    for window in (points[-FIT_WINDOW:], [p for p in points if p[0] >= last / 2]):
        e = np.array([effective[min(s, len(effective) - 1)] for s, _ in window])
        line = _line(e, np.log([b for _, b in window]))
        if line is not None:
            break
    else:
        return None
    kappa, s, se = line
    b_now, b_target = points[-1][1], badness(target, target.value)
    gap = math.log(b_now / b_target) if b_now > b_target else math.inf
    return Progress(kappa, b_now, b_target, math.hypot(s / gap, se / kappa))


def expected_time(progress: Progress, descent: float, start: int, seconds_by_slot: Sequence[float],
                  schedule: NetworkSchedule, horizon: int) -> float:
    """The expected seconds to the target over the spread of ``progress`` (time_over_schedule per case)."""
    return sum(w * time_over_schedule(start, n, seconds_by_slot, schedule, horizon)
               for n, w in progress.outcomes(descent))


def time_over_schedule(start: int, steps: float, seconds_by_slot: Sequence[float], schedule: NetworkSchedule,
                       horizon: int) -> float:
    """Seconds for ``steps`` steps from ``start``, each priced on the network in force at it: slot 0 the
    topology's own, slot i + 1 phase i; past ``horizon`` (the run's end) the last network stays."""
    if steps <= 0:
        return 0.0
    if math.isinf(steps):
        return math.inf
    bounds = [p.start for p in schedule.phases]
    total, at, left = 0.0, start, steps
    while left > 0:
        index = schedule.index_at(at)
        slot = 0 if index is None else index + 1
        following = [b for b in bounds if b > at]
        span = left if not following or at >= horizon else min(left, following[0] - at)
        total += span * seconds_by_slot[slot]
        at, left = at + math.ceil(span), left - span
    return total
