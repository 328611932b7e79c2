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
"""

from __future__ import annotations

import gc
import itertools
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import simpy

from arcsim.collectives import limits
from arcsim.collectives.schedule import Schedule
from arcsim.netsim.analytic import schedule_time
from arcsim.netsim.fluid import FluidNetwork
from arcsim.topology import Topology


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
    dst: int
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
    recvs: list[tuple[int, int]]  # canonical (src, dst) of each message it receives
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
    period = _symmetry_period(schedule, topo, starts) if use_symmetry else topo.nodes
    reps = period * topo.gpus_per_node  # ranks simulated: those of the first `period` nodes
    events = expected_events(schedule, reps)
    limits.check_des(f"{schedule.algo} {schedule.op} on {p:,} ranks", events)
    env = simpy.Environment()
    net = FluidNetwork(env, topo.capacity)
    rng = np.random.default_rng(seed)
    plans = _plans(schedule, topo, period, reps, net)
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

    def launch(k: int, src: int, send: _Send) -> simpy.Event:
        done = message_done((k * p + src) * p + send.dst)
        receiver = send.receiver
        if position[receiver] >= k:
            start(send, done)
        else:
            waiters[receiver][k].append(partial(start, send, done))
        return done

    def rank(r: int) -> Generator[simpy.Event, Any, None]:
        if starts[r] > t0:
            yield env.timeout(starts[r] - t0)
        slowdown = topo.slowdown(r)
        waiting = waiters[r]
        for visit in plans[r]:
            base = offsets[visit.step]
            reduce_s = gamma * visit.reduce_bytes * slowdown
            for k in range(base, base + repeats[visit.step]):
                position[r] = k
                if waiting:
                    for wake in waiting.pop(k, ()):
                        wake()
                events = [launch(k, r, s) for s in visit.sends]
                events += [message_done((k * p + s) * p + d) for s, d in visit.recvs]
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


def expected_events(schedule: Schedule, simulated_ranks: int) -> float:
    """SimPy events a simulation of ``simulated_ranks`` of the schedule's ranks will take, about."""
    share = min(1.0, 2.0 * simulated_ranks / schedule.ranks) if simulated_ranks < schedule.ranks else 1.0
    return limits.des_events(schedule.message_count * share)


def _symmetry_period(schedule: Schedule, topo: Topology, starts: np.ndarray) -> int:
    period = topo.translation_period()
    if period >= topo.nodes or not np.all(starts == starts[0]):
        return topo.nodes
    if schedule.is_translation_invariant(period * topo.gpus_per_node):
        return period
    return topo.nodes


def _plans(schedule: Schedule, topo: Topology, period: int, reps: int, net: FluidNetwork) -> list[list[_Visit]]:
    """For each simulated rank, the steps it takes part in and what it does in each (paths resolved to
    ``net``'s resources)."""
    p = topo.ranks
    plans: list[list[_Visit]] = [[] for _ in range(reps)]
    path_cache: dict[tuple[int, int], tuple[Any, float]] = {}

    def path(src: int, dst: int) -> tuple[Any, float]:
        key = (src, dst)
        if key not in path_cache:
            keys, latency = topo.path(src, dst)
            path_cache[key] = (net.links(tuple(topo.canonical_key(k, period) for k in keys)), latency)
        return path_cache[key]

    for i, step in enumerate(schedule.steps):
        visits: dict[int, _Visit] = {}

        def visit(r: int, i: int = i, visits: dict[int, _Visit] = visits) -> _Visit:
            if r not in visits:
                visits[r] = _Visit(i, [], [], 0.0)
            return visits[r]

        for j in np.flatnonzero(step.src < reps):
            s, d = int(step.src[j]), int(step.dst[j])
            keys, latency = path(s, d)
            visit(s).sends.append(_Send(d, d % reps, float(step.nbytes[j]), keys, latency,
                                        s // topo.gpus_per_node != d // topo.gpus_per_node))
        for j in np.flatnonzero(step.dst < reps):
            s, d = int(step.src[j]), int(step.dst[j])
            shift = (s // reps) * reps
            v = visit(d)
            v.recvs.append((s - shift, (d - shift) % p))
            v.reduce_bytes += float(step.reduce[j])
        for r in sorted(visits):
            plans[r].append(visits[r])
    return plans
