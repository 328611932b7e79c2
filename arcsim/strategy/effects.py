"""What a synchronous step pays beyond its collectives' schedule, and grows with the rank count: the slowest of p
ranks' compute (stragglers by distribution), jitter on every network step of a collective over TCP, and
communication slowing the backward it overlaps. The terms are the topology's ``effects``
(:class:`arcsim.topology.Effects`; defaults for ethernet fabrics); docs/run.md says what each assumes.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

from arcsim.comm.log import CommRecord
from arcsim.strategy.engine import StepEffects
from arcsim.topology import Topology


@lru_cache(maxsize=1024)
def expected_max_normal(p: int) -> float:
    """E[max of p standard normal draws], by Blom's approximation Φ⁻¹((p − 0.375)/(p + 0.25)) (4.5 % high at
    p = 2, within 1 % of the exact value from p = 8 on; 0 for one draw)."""
    if p <= 1:
        return 0.0
    return NormalDist().inv_cdf((p - 0.375) / (p + 0.25))


def harmonic(n: int) -> float:
    """H_n = E[max of n unit exponentials]."""
    return math.fsum(1.0 / k for k in range(1, n + 1))


def compute_factor(topo: Topology) -> float:
    """The step's compute over one rank's mean: the slowest of the topology's ranks, μ (1 + cv · E[max of p])."""
    return 1.0 + topo.effects.compute_cv * expected_max_normal(topo.ranks)


def _steps(op: str, ranks: int) -> int:
    """Steps of the collective's ring (or binomial broadcast) among ``ranks``."""
    if ranks < 2:
        return 0
    if op == "allreduce":
        return 2 * (ranks - 1)
    if op == "broadcast":
        return math.ceil(math.log2(ranks))
    return ranks - 1  # all-gather, reduce-scatter


def jitter_s(record: CommRecord, topo: Topology) -> float:
    """The expected jitter one collective pays: its steps × E[the slowest of its N network crossings per step]
    (H_N × the mean); nothing inside a node or on one node."""
    return collective_jitter_s(record.op, record.group, topo)


def collective_jitter_s(op: str, group: str, topo: Topology) -> float:
    """:func:`jitter_s` of a collective ``op`` over ``group`` (world, node, inter)."""
    mean = topo.crossing_jitter_s
    if mean == 0 or group == "node" or topo.nodes < 2:
        return 0.0
    ranks = topo.nodes if group == "inter" else topo.ranks
    return _steps(op, ranks) * harmonic(topo.nodes) * mean


def records_jitter_s(records: list[CommRecord], topo: Topology) -> float:
    return math.fsum(jitter_s(r, topo) for r in records)


def step_effects(topo: Topology) -> StepEffects:
    """The timeline engine's factors for ``topo``: the slowest of its ranks' compute, and interference."""
    return StepEffects(compute_factor(topo), topo.effects.interference)
