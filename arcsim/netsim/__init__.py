"""Network backends behind one interface: ``analytic`` (closed form) and ``des`` (SimPy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from arcsim.collectives.schedule import Schedule
from arcsim.errors import CollectiveError
from arcsim.netsim import analytic, des
from arcsim.topology import Topology

ENGINES = ("analytic", "des")


@dataclass(frozen=True)
class Estimate:
    engine: str
    time_s: float
    events: int = 0  # DES only: SimPy events processed
    simulated_ranks: int = 0  # DES only: rank processes simulated (fewer than ranks when symmetry applies)


def estimate(schedule: Schedule, topo: Topology, engine: str, *, start_times: np.ndarray | None = None,
             seed: int = 0, progress: Callable[[float, float], None] | None = None) -> Estimate:
    """Seconds ``schedule`` takes on ``topo`` by ``engine``.

    ``start_times`` (DES only) are per-rank arrival times; the time is counted from the first arrival.
    ``progress`` (DES only): see :func:`arcsim.netsim.des.simulate`.
    """
    if engine == "analytic":
        return Estimate("analytic", analytic.schedule_time(schedule, topo))
    if engine == "des":
        result = des.simulate(schedule, topo, start_times=start_times, seed=seed, progress=progress)
        return Estimate("des", result.time_s, result.events, result.simulated_ranks)
    raise CollectiveError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
