"""The exact Pareto front of (iteration time, relative error) and the rule that picks one point from it.

The grid (compressor × collective × ratio) is small enough to enumerate, so the front is exact: a point
is on it when no other point is at least as good in both objectives and better in one.

Picking a point, with the objectives made dimensionless — time as the fraction slower than the fastest
point on the front, error as is (it is already relative), so 1% slower weighs like 0.01 of error:
- knee (default): the point farthest below the straight line joining the front's two extremes — where
  giving up more fidelity stops buying much speed (or the reverse);
  If no point lies below the chord there is no knee, and the equal-weight ASF below decides;
- ASF (``--weights T,E``): the point minimising max(T·time, E·error), the achievement scalarising
  function with the ideal point (fastest time, zero error) as reference.
"""

from __future__ import annotations

import numpy as np


def pareto_front(objectives: np.ndarray) -> list[int]:
    """Indices of the non-dominated rows (minimisation), sorted by the first objective, duplicates once."""
    order = np.lexsort((objectives[:, 1], objectives[:, 0]))
    front, best_second = [], np.inf
    for i in order:
        if objectives[i, 1] < best_second:
            front.append(int(i))
            best_second = objectives[i, 1]
    return front


def _dimensionless(front: np.ndarray) -> np.ndarray:
    """Time as the fraction slower than the fastest point; error as is (already a relative error)."""
    t_min = front[:, 0].min()
    return np.column_stack([front[:, 0] / t_min - 1.0 if t_min > 0 else front[:, 0], front[:, 1]])


def choose(front: np.ndarray, weights: tuple[float, float] | None = None) -> tuple[int, str]:
    """Index into ``front`` (rows sorted by the first objective) of the chosen point, and the rule used."""
    if len(front) == 1:
        return 0, "the only Pareto-optimal point"
    z = _dimensionless(front)
    if weights is not None:
        w = np.asarray(weights, dtype=float) / sum(weights)
        return int(np.argmin(np.max(z * w, axis=1))), f"ASF with weights time {w[0]:.2f}, error {w[1]:.2f}"
    a, b = z[0], z[-1]  # the fastest and the most faithful extremes
    chord = b - a
    # signed distance below the chord (positive: the point bulges towards the ideal corner)
    below = (chord[0] * (z[:, 1] - a[1]) - chord[1] * (z[:, 0] - a[0])) / np.hypot(*chord)
    below = -below if chord[0] > 0 else below
    if below.max() > 1e-9:
        return int(np.argmax(below)), ("knee: the point that gains most over the straight line between the "
                                       "fastest and the most faithful")
    return int(np.argmin(np.max(z, axis=1))), ("no clear knee (no point beats the straight line between the "
                                               "extremes): the balanced point, time and error weighted equally")
