"""Discrete-event simulation (SimPy) of a step schedule on a topology's shared links.

Every rank is a SimPy process that walks through the steps it takes part in. A message starts when
its sender and receiver have both reached its step, waits its path's latency (plus seeded exponential
jitter), then crosses its links as a fluid flow that shares bandwidth with whatever else is on them
(:mod:`arcsim.netsim.fluid`). A rank leaves a step when its messages are done and it has reduced what
it received (γ per byte, times its straggler slowdown). Ranks may start at different times.

Symmetry: when every node is alike (no stragglers, no jitter, equal start times) and the schedule is
unchanged by shifting all ranks by whole translation periods of the topology (one node on a single
switch, one leaf on a fat-tree), every rank behaves like its image in the first period. Only those
ranks are simulated; the links they use stand for their images' links, so a link still carries exactly
as many flows as its physical twin. The result is identical to simulating every rank.

The same holds for rotating the GPU indices inside every node at once (GPU i → i + 1 mod g, its NIC with it,
when the NICs divide the GPUs): NCCL's tree and the rings run one channel per NIC, channel j headed by GPU j, and
the rotation maps channel j onto channel j + 1, so one GPU of each node stands for its node though no shift of
nodes leaves a tree alone. A resource the rotations leave in place (a NIC two GPUs share, a fat-tree's up- and
downlinks) carries each simulated flow's images too, so its simulated flows share 1 / (how many rotations leave it
in place) of its bandwidth (:meth:`Topology.rotated_key`).
"""

from __future__ import annotations

import gc
import itertools
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.collectives import limits
from arcsim.collectives.schedule import Schedule
from arcsim.netsim.analytic import schedule_time
from arcsim.netsim.fluid import FluidNetwork
from arcsim.topology import Topology

if TYPE_CHECKING:
    import simpy


def _events_scheduled(env: simpy.Environment) -> int:
    """Events ``env`` has scheduled: SimPy numbers each one from its ``_eid`` counter (read, not overridden:
    a counting ``schedule`` override cost 1.3 µs per event, ~8 s of a 10,240-rank tree)."""
    counter = env._eid  # type: ignore[attr-defined]
    return int(next(counter))


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic collector off while the simulation runs: its full collections walk every live plan,
    event and closure, so they cost more the larger the run (a 10,240-rank tree: 81.8 s with it, 38.1 s
    without, the same 376 MB peak — the simulation leaves no cycles worth collecting meanwhile)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class DesResult:
    time_s: float  # from the earliest start to the last rank's finish
    events: int  # SimPy events processed
    simulated_ranks: int  # ranks simulated as processes (fewer than ranks when symmetry was used)
    finish_s: np.ndarray  # finish time of each simulated rank


@dataclass(slots=True)
class _Send:
    pair: int  # src · p + dst
    receiver: int  # the simulated rank that stands for dst
    nbytes: float
    links: Any  # the path's resources, resolved by the fluid network once
    latency: float
    crosses: bool  # between nodes: its latency draws the topology's jitter


@dataclass(slots=True)
class _Visit:
    """What one rank does in one step (for every repeat of it)."""

    step: int
    sends: list[_Send]
    recvs: list[int]  # src · p + dst of each message it receives, as the simulated rank that sends it sees it
    reduce_bytes: float


def simulate(schedule: Schedule, topo: Topology, start_times: np.ndarray | None = None,
             seed: int = 0, use_symmetry: bool = True,
             progress: Callable[[float, float], None] | None = None) -> DesResult:
    """Simulate ``schedule``; refused up front if its estimated events pass the limits (limits.check_des).

    For a run estimated past ``limits.PROGRESS_EVENTS`` events, ``progress(fraction, events)`` is called as
    simulated time passes each hundredth of the closed form's time for the schedule (the run goes on past
    it until every rank is done); ``events`` is the estimate, so a caller can say how long to expect.
    """
    p = topo.ranks
    if schedule.ranks != p:
        raise ValueError(f"schedule is for {schedule.ranks} ranks, topology has {p}")
    starts = np.zeros(p) if start_times is None else np.asarray(start_times, dtype=float)
    t0 = float(starts.min())
    fold = _fold(schedule, topo, starts, use_symmetry)
    reps = fold.reps  # ranks simulated
    events = expected_events(schedule, reps)
    limits.check_des(f"{schedule.algo} {schedule.op} on {p:,} ranks", events)
    import simpy  # here, not at the top: only a simulation needs it (fluid.py)

    env = simpy.Environment()
    net = FluidNetwork(env, _capacity(topo, fold))
    rng = np.random.default_rng(seed)
    plans = _plans(schedule, topo, fold, net)
    pp = p * p
    repeats = [s.repeat for s in schedule.steps]
    offsets = [0, *itertools.accumulate(repeats)]  # a list: indexed per visit on the hot path

    position = [-1] * reps  # the step each simulated rank has reached (a list: read per message)
    waiters: list[dict[int, list[Callable[[], None]]]] = [defaultdict(list) for _ in range(reps)]
    pending: dict[int, list] = {}  # (position · p + src) · p + dst -> [event, uses]
    finish = np.full(reps, np.nan)

    def message_done(key: int) -> simpy.Event:
        entry = pending.get(key)
        if entry is None:
            entry = pending[key] = [env.event(), 0]
        entry[1] += 1
        if entry[1] == 2:  # the sender and the receiver have both asked for it
            del pending[key]
        return entry[0]

    def arrive(send: _Send, done: simpy.Event, _: simpy.Event) -> None:
        net.send(send.links, send.nbytes, done)  # the message's own event fires when its bytes are across

    jitter, gamma = topo.crossing_jitter_s, topo.gamma  # locals: read per message

    def start(send: _Send, done: simpy.Event) -> None:
        latency = send.latency
        if jitter and send.crosses:
            latency += jitter * rng.exponential()
        env.timeout(latency).callbacks.append(partial(arrive, send, done))

    def launch(k: int, send: _Send) -> simpy.Event:
        done = message_done(k * pp + send.pair)
        receiver = send.receiver
        if position[receiver] >= k:
            start(send, done)
        else:
            waiters[receiver][k].append(partial(start, send, done))
        return done

    def rank(r: int) -> Generator[simpy.Event, Any, None]:
        if starts[fold.rank(r)] > t0:
            yield env.timeout(starts[fold.rank(r)] - t0)
        slowdown = topo.slowdown(fold.rank(r))
        waiting = waiters[r]
        for visit in plans[r]:
            base = offsets[visit.step]
            reduce_s = gamma * visit.reduce_bytes * slowdown
            for k in range(base, base + repeats[visit.step]):
                position[r] = k
                if waiting:
                    for wake in waiting.pop(k, ()):
                        wake()
                events = [launch(k, s) for s in visit.sends]
                events += [message_done(k * pp + pair) for pair in visit.recvs]
                yield from events
                if reduce_s:
                    yield env.timeout(reduce_s)
        finish[r] = env.now

    for r in range(reps):
        env.process(rank(r))
    horizon = schedule_time(schedule, topo) if progress is not None and events > limits.PROGRESS_EVENTS else 0.0
    with _no_cyclic_gc():
        if progress is not None and horizon > 0:
            progress(0.0, events)
            for hundredth in range(1, 101):
                env.run(until=horizon * hundredth / 100)
                progress(hundredth / 100, events)
        env.run()
    if np.isnan(finish).any():
        stuck = np.flatnonzero(np.isnan(finish))[:5].tolist()
        raise RuntimeError(f"DES deadlock in {schedule.op}/{schedule.algo}: ranks {stuck} never finished")
    return DesResult(float(finish.max()), _events_scheduled(env), reps, finish + t0)


def expected_events(schedule: Schedule, simulated_ranks: int, messages: int | None = None) -> float:
    """SimPy events a simulation of ``simulated_ranks`` of the schedule's ranks will take, about; ``messages``: those
    of a schedule with this one's symmetry but more pieces (default: this one's)."""
    share = min(1.0, 2.0 * simulated_ranks / schedule.ranks) if simulated_ranks < schedule.ranks else 1.0
    return limits.des_events((schedule.message_count if messages is None else messages) * share)


def simulated_ranks(schedule: Schedule, topo: Topology, start_times: np.ndarray | None = None) -> int:
    """The ranks a simulation of ``schedule`` on ``topo`` simulates, its symmetries folded (the tree all-reduce's are
    the same in any number of chunks: each step is the union of its start levels' edges)."""
    starts = np.zeros(topo.ranks) if start_times is None else np.asarray(start_times, dtype=float)
    return _fold(schedule, topo, starts, use_symmetry=True).reps


@dataclass(frozen=True)
class _Fold:
    """The symmetry a run uses: the ranks simulated are those of the first ``period`` nodes whose GPU index is below
    ``rotation``; every other rank is the image of one of them under a shift by whole periods of nodes and a
    rotation of GPU indices (inside every node at once) by a multiple of ``rotation``. With neither, every rank."""

    nodes: int
    gpus: int  # per node
    period: int  # nodes
    rotation: int  # GPU indices

    @property
    def reps(self) -> int:
        return self.period * self.rotation

    def index(self, r: Any) -> Any:
        """The simulated rank (its index among those simulated) that stands for rank ``r``."""
        node, gpu = r // self.gpus, r % self.gpus
        return node % self.period * self.rotation + gpu % self.rotation

    def rank(self, i: int) -> int:
        """The rank that simulated rank ``i`` is."""
        return i // self.rotation * self.gpus + i % self.rotation

    def back(self, by: Any, r: Any) -> Any:
        """Rank ``r`` under the symmetry that takes rank ``by`` to the rank simulated for it."""
        g, node, gpu = self.gpus, by // self.gpus, by % self.gpus
        return ((r // g - (node - node % self.period)) % self.nodes * g
                + (r % g - (gpu - gpu % self.rotation)) % g)


def _fold(schedule: Schedule, topo: Topology, starts: np.ndarray, use_symmetry: bool) -> _Fold:
    g = topo.gpus_per_node
    none = _Fold(topo.nodes, g, topo.nodes, g)
    if not use_symmetry or not np.all(starts == starts[0]):
        return none
    period = topo.translation_period()
    if period >= topo.nodes or not schedule.is_translation_invariant(period * g):
        period = topo.nodes
    base = topo.rotation_period()
    for rotation in range(base, g, base):  # the smallest rotation (a divisor of g) leaving the schedule unchanged
        if g % rotation == 0 and _rotation_invariant(schedule, g, rotation):
            return _Fold(topo.nodes, g, period, rotation)
    return _Fold(topo.nodes, g, period, g)


def _rotation_invariant(schedule: Schedule, gpus: int, rotation: int) -> bool:
    """True when renumbering GPU i of every node as GPU (i + rotation) mod g leaves each step's messages unchanged."""
    def rotated(r: np.ndarray) -> np.ndarray:
        return r - r % gpus + (r % gpus + rotation) % gpus

    p = schedule.ranks
    for s in schedule.steps:
        here = np.lexsort((s.reduce, s.nbytes, s.src * p + s.dst))
        there = np.lexsort((s.reduce, s.nbytes, rotated(s.src) * p + rotated(s.dst)))
        if not (np.array_equal((s.src * p + s.dst)[here], (rotated(s.src) * p + rotated(s.dst))[there])
                and np.array_equal(s.nbytes[here], s.nbytes[there])
                and np.array_equal(s.reduce[here], s.reduce[there])):
            return False
    return True


def _capacity(topo: Topology, fold: _Fold) -> Callable[[Any], float]:
    """Each simulated resource's bandwidth: a resource that rotations of GPU indices leave in place (a NIC several
    GPUs share, the fabric's links) carries the images of its simulated flows too, as many of each as there are
    such rotations, so its simulated flows get that share of its bandwidth."""
    if fold.rotation == fold.gpus:
        return topo.capacity
    return lambda key: topo.capacity(key) / topo.rotated_key(key, fold.rotation)[1]


def _plans(schedule: Schedule, topo: Topology, fold: _Fold, net: FluidNetwork) -> list[list[_Visit]]:
    """For each simulated rank, the steps it takes part in and what it does in each (paths resolved to
    ``net``'s resources)."""
    p, g, reps = topo.ranks, topo.gpus_per_node, fold.reps
    plans: list[list[_Visit]] = [[] for _ in range(reps)]
    path_cache: dict[tuple[int, int], tuple[Any, float]] = {}

    def canonical(key: Any) -> Any:
        key = topo.canonical_key(key, fold.period)
        return key if fold.rotation == g else topo.rotated_key(key, fold.rotation)[0]

    def path(src: int, dst: int) -> tuple[Any, float]:
        key = (src, dst)
        if key not in path_cache:
            keys, latency = topo.path(src, dst)
            path_cache[key] = (net.links(tuple(canonical(k) for k in keys)), latency)
        return path_cache[key]

    def simulated(r: np.ndarray) -> np.ndarray:
        return (r // g < fold.period) & (r % g < fold.rotation)

    for i, step in enumerate(schedule.steps):
        visits: dict[int, _Visit] = {}

        def visit(r: int, i: int = i, visits: dict[int, _Visit] = visits) -> _Visit:
            if r not in visits:
                visits[r] = _Visit(i, [], [], 0.0)
            return visits[r]

        sending = np.flatnonzero(simulated(step.src))
        src, dst = step.src[sending], step.dst[sending]
        for s, d, who, receiver, nbytes in zip(src.tolist(), dst.tolist(), fold.index(src).tolist(),
                                               fold.index(dst).tolist(), step.nbytes[sending].tolist(), strict=True):
            keys, latency = path(s, d)
            visit(who).sends.append(_Send(s * p + d, receiver, nbytes, keys, latency, s // g != d // g))
        receiving = np.flatnonzero(simulated(step.dst))
        src, dst = step.src[receiving], step.dst[receiving]
        pairs = fold.back(src, src) * p + fold.back(src, dst)  # as the simulated image of its sender sends it
        for who, pair, reduce in zip(fold.index(dst).tolist(), pairs.tolist(), step.reduce[receiving].tolist(),
                                     strict=True):
            v = visit(who)
            v.recvs.append(pair)
            v.reduce_bytes += reduce
        for r in sorted(visits):
            plans[r].append(visits[r])
    return plans
