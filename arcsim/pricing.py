"""Price one collective on a topology: choose the algorithm(s), run the engine(s), report nccl-tests figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from arcsim.collectives import ALGORITHMS, build, busbw_factor, normalize_op
from arcsim.collectives.limits import TooMuchWork
from arcsim.comm.log import CommRecord
from arcsim.errors import CollectiveError
from arcsim.netsim import ENGINES, estimate
from arcsim.topology import Topology

ALGO_CHOICES = ("ring", "tree", "rhd", "rd", "hierarchical", "chain", "auto", "all")


@dataclass(frozen=True)
class CollectiveResult:
    topology: str
    op: str
    algo: str
    engine: str
    ranks: int
    bytes: float
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    auto: bool  # chosen by 'auto' (cheapest by the closed form)
    steps: int
    messages: int
    detail: str
    events: int  # DES: SimPy events processed (0 for analytic)
    simulated_ranks: int  # DES: rank processes simulated (fewer than ranks when symmetry applies)

    def to_dict(self) -> dict:
        return asdict(self)


def algorithms_for(op: str) -> tuple[str, ...]:
    return tuple(ALGORITHMS[normalize_op(op)])


def cheapest_algorithm(topo: Topology, op: str, nbytes: float) -> str:
    """The algorithm the closed form prices lowest for this size (what 'auto' picks), among those within the
    work limits (arcsim.collectives.limits); refused only if none is."""
    times, refused = {}, []
    for algo in algorithms_for(op):
        try:
            times[algo] = estimate(build(op, algo, nbytes, topo), topo, "analytic").time_s
        except TooMuchWork as exc:
            refused.append(str(exc))
    if not times:
        raise TooMuchWork("; ".join(refused))
    return min(times, key=times.__getitem__)


def start_times(topo: Topology, compute_s: float) -> np.ndarray:
    """Arrival time of each rank when each first computes for ``compute_s`` × its straggler slowdown."""
    return np.array([compute_s * topo.slowdown(r) for r in range(topo.ranks)])


def price_collective(topo: Topology, op: str, algo: str, nbytes: float, engines: tuple[str, ...],
                     compute_s: float = 0.0, seed: int = 0,
                     progress: Callable[[str, float, float], None] | None = None) -> list[CollectiveResult]:
    """Every (algorithm, engine) asked for; ``progress(algorithm, fraction, events)`` follows long DES runs."""
    op = normalize_op(op)
    for engine in engines:
        if engine not in ENGINES:
            raise CollectiveError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)} or both")
    if algo == "all":
        algos = list(algorithms_for(op))
    elif algo == "auto":
        algos = [cheapest_algorithm(topo, op, nbytes)]
    else:
        algos = [algo]
    arrivals = start_times(topo, compute_s) if compute_s > 0 else None
    factor = busbw_factor(op, topo.ranks)
    results = []
    for name in algos:
        schedule = build(op, name, nbytes, topo)
        for engine in engines:
            follow = None if progress is None else (lambda done, events, name=name: progress(name, done, events))
            est = estimate(schedule, topo, engine, start_times=arrivals, seed=seed, progress=follow)
            algbw = nbytes / est.time_s if est.time_s > 0 else float("inf")
            results.append(CollectiveResult(
                topology=topo.name, op=op, algo=name, engine=engine, ranks=topo.ranks, bytes=float(nbytes),
                time_s=est.time_s, algbw_Bps=algbw, busbw_Bps=algbw * factor, auto=algo == "auto",
                steps=schedule.step_count, messages=schedule.message_count, detail=schedule.detail,
                events=est.events, simulated_ranks=est.simulated_ranks,
            ))
    return results


@dataclass(frozen=True)
class PricedRecord:
    op: str
    tag: str
    algo: str
    bytes: float  # the collective's size in nccl-tests terms (all-gather: total output on this topology)
    time_s: float


class Pricer:
    """Prices collectives by (op, algorithm, bytes per rank) on one topology and engine, with a cache.

    Ops the topology has measured (``calibration``, from arcsim calibrate) are priced by their fitted line
    and reported with the algorithm "measured"; the others by the engine on the step description.
    """

    def __init__(self, topo: Topology, engine: str = "analytic") -> None:
        self.topo, self.engine = topo, engine
        self._cache: dict[tuple[str, str, float], PricedRecord] = {}

    def price(self, op: str, bytes_per_rank: float, algo: str = "auto", tag: str = "") -> PricedRecord:
        """The collective's size is per rank; an all-gather's total output is that × the topology's ranks."""
        key = (op, algo, bytes_per_rank)
        if key not in self._cache:
            self._cache[key] = self._price(op, algo, bytes_per_rank)
        hit = self._cache[key]
        return PricedRecord(op, tag, hit.algo, hit.bytes, hit.time_s)

    def _price(self, op: str, algo: str, bytes_per_rank: float) -> PricedRecord:
        nbytes = bytes_per_rank * (self.topo.ranks if op == "allgather" else 1)
        fit = self.topo.calibration.get(normalize_op(op))
        if fit is not None:  # a measured collective overrides the step model, whatever the algorithm
            return PricedRecord(op, "", "measured", nbytes, fit.time(nbytes))
        chosen = cheapest_algorithm(self.topo, op, nbytes) if algo == "auto" else algo
        time_s = estimate(build(op, chosen, nbytes, self.topo), self.topo, self.engine).time_s
        return PricedRecord(op, "", chosen, nbytes, time_s)

    def records(self, records: list[CommRecord], algorithms: dict[str, str] | None = None) -> list[PricedRecord]:
        chosen = algorithms or {}
        return [self.price(r.op, r.bytes_per_rank, chosen.get(r.op, "auto"), r.tag) for r in records]


def price_records(records: list[CommRecord], topo: Topology, engine: str = "analytic",
                  algorithms: dict[str, str] | None = None) -> list[PricedRecord]:
    """Price each logged collective on ``topo``: the hand-off from a CommLog to the network backends.

    Sizes are per rank, so a log recorded with P simulated workers prices on a topology with any rank
    count: an all-gather's total output is bytes_per_rank × the topology's ranks. ``algorithms`` maps
    an op to an algorithm name (default 'auto', the cheapest by the closed form).
    """
    return Pricer(topo, engine).records(records, algorithms)
