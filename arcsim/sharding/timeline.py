"""Two streams, as FSDP2 runs on a GPU: the compute stream runs each unit's forward (the root first) and then
each unit's backward (in reverse, the root last); the communication stream runs the step's collectives one
at a time in issue order (:func:`arcsim.sharding.schedule.fsdp_schedule`; NCCL serialises them on the links).

One refinement by the links a collective uses: FSDP2 runs HSDP's cross-node all-reduces on a stream of their
own, and they use only the NICs while the node's all-gathers and reduce-scatters use only NVLink, so a
collective of the ``inter`` group and one of the ``node`` group may run at once. A ``world`` collective uses
both and waits for both (on one node, ``world`` and ``node`` are the same links and never overlap).

- a unit's forward or backward waits for its all-gather;
- a forward all-gather may start when the previous unit's forward starts (prefetch one unit ahead; the first
  ones at once), a backward all-gather when the previous unit in backward starts (the first one, and the
  root's, when forward ends);
- a reduce-scatter may start when its unit's backward ends; what follows it for the same unit (HSDP's
  all-reduce, qgZ's second step) follows it.
The iteration ends when both streams are done; exposed communication is what is left after compute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arcsim.sharding.units import ROOT


@dataclass(frozen=True)
class StreamTimeline:
    iteration_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    comm_start: tuple[float, ...]
    comm_end: tuple[float, ...]


def two_stream(order: Sequence[str], forward_s: dict[str, float], backward_s: dict[str, float],
               collectives: Sequence[tuple[str, str, str]], comm_s: Sequence[float],
               groups: Sequence[str] | None = None) -> StreamTimeline:
    """``order``: the non-root units in forward order; ``forward_s``/``backward_s``: each unit's compute (the
    root's under ROOT); ``collectives``: (op, unit, phase) of each collective in issue order; ``groups``: the
    group of each (default: all ``world``, one stream)."""
    tasks = [("forward", ROOT), *(("forward", u) for u in order), *(("backward", u) for u in reversed(order)),
             ("backward", ROOT)]
    index = {t: i for i, t in enumerate(tasks)}
    start = [0.0] * len(tasks)
    end = [0.0] * len(tasks)
    done = 0  # tasks timed so far
    waits: dict[tuple[str, str], float] = {}  # (phase, unit) → end of its all-gather

    def time_until(i: int) -> None:
        nonlocal done
        while done <= i:
            phase, unit = tasks[done]
            prev = end[done - 1] if done else 0.0
            start[done] = max(prev, waits.get((phase, unit), 0.0))
            seconds = (forward_s if phase == "forward" else backward_s).get(unit, 0.0)
            end[done] = start[done] + seconds
            done += 1

    lane_free = {"node": 0.0, "inter": 0.0}
    after_unit: dict[str, float] = {}  # the end of a unit's last gradient collective: the next one follows it
    starts, ends = [], []
    groups = groups if groups is not None else ["world"] * len(collectives)
    for (op, unit, phase), seconds, group in zip(collectives, comm_s, groups, strict=True):
        if op == "allgather":
            i = index[(phase, unit)]
            ready = 0.0
            if phase == "backward" and unit == ROOT:  # gathered first in backward, computed last
                time_until(len(order))
                ready = end[len(order)]
            elif i > 0:
                time_until(i - 1)
                first_backward = phase == "backward" and tasks[i - 1][0] == "forward"
                ready = end[i - 1] if first_backward else start[i - 1]
        else:
            i = index[("backward", unit)]
            time_until(i)
            ready = max(end[i], after_unit.get(unit, 0.0))
        lanes = (group,) if group in lane_free else tuple(lane_free)
        begin = max(ready, *(lane_free[lane] for lane in lanes))
        finish = begin + seconds
        for lane in lanes:
            lane_free[lane] = finish
        starts.append(begin)
        ends.append(finish)
        if op == "allgather":
            waits[(phase, unit)] = finish
        else:
            after_unit[unit] = finish
    time_until(len(tasks) - 1)
    compute = sum(end[i] - start[i] for i in range(len(tasks)))
    last = max(end[-1], *ends) if ends else end[-1]
    return StreamTimeline(last, compute, float(sum(comm_s)), last - compute, tuple(starts), tuple(ends))
