"""Time to target, estimated online: how many more steps each candidate needs, and what they cost on the
networks to come.

**Progress.** Let b be the run's distance from its target's good end — 1 − accuracy, or the held-out loss
— and d_t the step's first-order descent ratio ⟨ḡ_t, a_t⟩ / ‖ḡ_t‖²: ḡ_t the workers' mean gradient, a_t
the update the compressor delivered (error feedback included). d is the share of dense SGD's first-order
loss decrease the step achieves: 1 for dense, for a sparsifier of ḡ without memory the energy it keeps
(‖C(ḡ)‖² / ‖ḡ‖², its gain squared). Effective steps E_t = Σ_{s<t} d_s. The model: log b falls linearly in
E, ``log b = c − κ E``, fitted by least squares over the run's last ``FIT_WINDOW`` evaluations.

**Steps.** A candidate whose descent ratio on this step's real gradients (with a copy of the run's
error-feedback memory) is d_c needs n_c = log(b_now / b*) / (κ d_c) more steps, b* the target's.

**Time.** Those n_c steps priced one network at a time: the schedule is known in advance, so steps that
fall in a later phase cost that phase's step time (at its fastest collective).

Without a usable fit (fewer than two evaluations in the window, or no progress across it) candidates are
ranked by progress per second on the network now in force, d_c / t_c: the same ranking as time to target
whenever the network does not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from arcsim.network_schedule import NetworkSchedule
from arcsim.train.target import Target

FIT_WINDOW = 4  # evaluations the progress fit uses (the most recent)


def descent_ratio(mean_grad: torch.Tensor, update: torch.Tensor) -> float:
    """⟨ḡ, a⟩ / ‖ḡ‖²: the share of dense SGD's first-order decrease that the update ``a`` achieves."""
    norm = float(mean_grad @ mean_grad)
    return float(mean_grad @ update) / norm if norm > 0 else 0.0


def badness(target: Target, value: float) -> float:
    """Distance from the target's good end: 1 − accuracy, or the loss itself."""
    return 1.0 - value if target.metric == "accuracy" else value


@dataclass(frozen=True)
class Progress:
    """log b = c − κ E over the window, and where the run is now."""

    kappa: float      # decrease of log b per effective step
    b_now: float
    b_target: float

    def steps_needed(self, descent: float) -> float:
        """Steps a candidate with this descent ratio needs to reach the target (inf if it makes no progress)."""
        if self.b_now <= self.b_target:
            return 0.0
        if descent <= 0:
            return math.inf
        return math.log(self.b_now / self.b_target) / (self.kappa * descent)


def fit_progress(eval_steps: Sequence[int], values: Sequence[float], descents: Sequence[float],
                 target: Target) -> Progress | None:
    """The progress model from the run so far (None when it cannot be fitted): ``values`` of the target's metric
    at ``eval_steps`` (evaluated after that many steps), ``descents`` every step's descent ratio."""
    points = [(s, badness(target, v)) for s, v in zip(eval_steps, values, strict=True)
              if math.isfinite(v) and badness(target, v) > 0][-FIT_WINDOW:]
    if len(points) < 2:
        return None
    effective = np.concatenate([[0.0], np.cumsum(descents)])
    e = np.array([effective[min(s, len(effective) - 1)] for s, _ in points])
    log_b = np.log([b for _, b in points])
    if np.ptp(e) <= 0:
        return None
    slope = float(np.polyfit(e, log_b, 1)[0])
    if not slope < 0:
        return None
    return Progress(-slope, points[-1][1], badness(target, target.value))


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
