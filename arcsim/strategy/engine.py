"""The one timeline engine: a step's work items on lanes, in the order the strategy issues them.

A strategy (DDP, Horovod, FSDP, HSDP, ZeRO++) hands the engine a list of :class:`Item`: stretches of compute and
compression on the ``compute`` lane, and collectives on the links they use (``node``: the node's NVLink or PCIe;
``inter``: the NICs and rails between nodes; a collective over the whole world holds both). Each item starts when
every lane it holds is free and every item it waits for has started or ended (``after``), and holds its lanes
until it ends; items are placed in list order, so the list is the issue order and must name only earlier items
in ``after``. This is ASTRA-sim's workload graph, for one step, placed greedily as a GPU's streams run it.

The cluster's effects (:class:`StepEffects`) enter here and nowhere else: the slowest of the ranks' compute stretches
every compute item (never compression: arcsim prices compression per GPU kernel), and communication slows the
work it overlaps — the compute lane ends later by ``interference`` × the seconds of communication that ran while
it was busy (not while it waited for a collective; first order: the items' start times are not moved). Jitter
belongs to each collective's price (:func:`arcsim.strategy.effects.jitter_s`): the callers add it to its seconds.

After both lanes end, ``after_s`` (the optimizer step, DDP's copies of the reduced buckets back into the
gradients) runs before the next step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import NamedTuple

from arcsim.errors import ArcsimError

COMPUTE = "compute"
EDGES = ("start", "end")  # what an item may wait for of an earlier one
LINKS = ("node", "inter")  # a collective of the world group (or of some ranks across nodes) holds both


class Item(NamedTuple):
    """One stretch of work: ``kind`` compute or compress (on the compute lane) or comm (a collective on
    ``lanes``); ``after``: (index of an earlier item, "start" or "end") it waits for. A tuple: policies build and
    run steps by the thousand.

    A compute stretch may be negative: a strategy that places a collective at a gradient's ready time cuts backward
    at those times, and ready times measured per layer need not be monotone."""

    kind: str
    seconds: float
    lanes: tuple[str, ...] = (COMPUTE,)
    after: tuple[tuple[int, str], ...] = ()


def link_lanes(group: str) -> tuple[str, ...]:
    """The links a collective of ``group`` holds: its own for ``node`` and ``inter``, both for the world."""
    return (group,) if group in LINKS else LINKS


@dataclass(frozen=True)
class StepEffects:
    """What the cluster adds to a step (arcsim.topology.Effects as factors: arcsim.strategy.effects.step_effects)."""

    slowdown: float = 1.0       # the slowest rank's compute over one rank's mean
    interference: float = 0.0   # compute's slowdown per second of communication it overlaps


NO_STEP_EFFECTS = StepEffects()


@dataclass(frozen=True)
class Timeline:
    iteration_s: float
    compute_s: float          # the compute items (+ after_s) as the compute lane ran them: with the slowest rank
    #                           and the interference
    compress_s: float         # the compression items
    comm_s: float             # every collective's seconds, overlapped or not
    exposed_comm_s: float     # the step (before after_s) less the compute lane's busy time
    comm_start: tuple[float, ...]
    comm_end: tuple[float, ...]


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``spans`` as disjoint spans in order (empty ones dropped)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_s(intervals: Sequence[tuple[float, float]], spans: list[tuple[float, float]]) -> float:
    """Σ over ``intervals`` of their overlap with the disjoint, ordered ``spans``: one sweep of both in start order."""
    total, first = 0.0, 0
    for s, e in sorted(intervals):
        while first < len(spans) and spans[first][1] <= s:  # spans wholly before this interval (and every later one)
            first += 1
        k = first
        while k < len(spans) and spans[k][0] < e:
            total += max(0.0, min(e, spans[k][1]) - max(s, spans[k][0]))
            k += 1
    return total


def run(items: Sequence[Item], effects: StepEffects = NO_STEP_EFFECTS, after_s: float = 0.0) -> Timeline:
    """Place ``items`` in order (see the module's docstring) and sum the step up; an ``after`` that names no earlier
    item, or an edge other than ``start`` or ``end``, is refused (ArcsimError)."""
    free: dict[str, float] = {}
    start = [0.0] * len(items)
    end = [0.0] * len(items)
    busy = compress = comm = 0.0
    comm_start: list[float] = []
    comm_end: list[float] = []
    for i, (kind, seconds, lanes, after) in enumerate(items):
        if kind == "compute":
            seconds *= effects.slowdown
        begin = free.get(lanes[0], 0.0) if len(lanes) == 1 else max(free.get(lane, 0.0) for lane in lanes)
        for j, edge in after:
            if not (isinstance(j, Integral) and 0 <= j < i) or edge not in EDGES:
                earlier = "the first item waits for none" if i == 0 else f"an earlier item's index is 0 to {i - 1}"
                raise ArcsimError(f"timeline item {i} ({kind}) waits for ({j!r}, {edge!r}): an item waits only for "
                                  f"the start or end of an item issued before it ({earlier}; the edge \"start\" "
                                  "or \"end\")")
            begin = max(begin, start[j] if edge == "start" else end[j])
        start[i], end[i] = begin, begin + seconds
        for lane in lanes:
            free[lane] = end[i]
        if kind == "comm":
            comm += seconds
            comm_start.append(begin)
            comm_end.append(end[i])
        else:
            busy += seconds
            compress += seconds if kind == "compress" else 0.0
    compute_end = free.get(COMPUTE, 0.0)
    if effects.interference:
        busy_spans = _merged([(start[i], min(end[i], compute_end)) for i, item in enumerate(items)
                              if item.kind != "comm"])
        slowed = effects.interference * overlap_s(list(zip(comm_start, comm_end, strict=True)), busy_spans)
        compute_end += slowed
        busy += slowed
    last = max(compute_end, *comm_end) if comm_end else compute_end
    return Timeline(last + after_s, busy - compress + after_s, compress, comm, last - busy, tuple(comm_start),
                    tuple(comm_end))
