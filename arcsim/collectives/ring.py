"""Ring algorithms over groups of ranks that run side by side (one row of ``groups`` per ring)."""

from __future__ import annotations

import numpy as np

from arcsim.collectives.schedule import Step, make_step


def reduce_scatter(groups: np.ndarray, nbytes: float) -> list[Step]:
    """q−1 steps; each rank passes a 1/q block of its ``nbytes`` vector to the next and reduces one."""
    q = groups.shape[1]
    if q < 2:
        return []
    return [make_step(groups, np.roll(groups, -1, axis=1), nbytes / q, nbytes / q, repeat=q - 1)]


def all_gather(groups: np.ndarray, total: float) -> list[Step]:
    """q−1 steps; each rank forwards one 1/q block of the ``total`` output to the next."""
    q = groups.shape[1]
    if q < 2:
        return []
    return [make_step(groups, np.roll(groups, -1, axis=1), total / q, 0.0, repeat=q - 1)]


def all_reduce(groups: np.ndarray, nbytes: float) -> list[Step]:
    """Bandwidth-optimal ring: reduce-scatter, then all-gather."""
    return reduce_scatter(groups, nbytes) + all_gather(groups, nbytes)
