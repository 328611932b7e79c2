"""Two streams, as FSDP2 runs on a GPU: the compute stream runs each unit's forward (the root first) and then
each unit's backward (in reverse, the root last); the communication stream runs the step's collectives one
at a time in issue order (:func:`arcsim.sharding.schedule.fsdp_schedule`; NCCL serialises them on the links).

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
               collectives: Sequence[tuple[str, str, str]], comm_s: Sequence[float]) -> StreamTimeline:
    """``order``: the non-root units in forward order; ``forward_s``/``backward_s``: each unit's compute (the
    root's under ROOT); ``collectives``: (op, unit, phase) of each collective in issue order."""
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

    link_free = 0.0
    starts, ends = [], []
    for (op, unit, phase), seconds in zip(collectives, comm_s, strict=True):
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
            ready = end[i]
        begin = max(ready, link_free)
        link_free = begin + seconds
        starts.append(begin)
        ends.append(link_free)
        if op == "allgather":
            waits[(phase, unit)] = link_free
    time_until(len(tasks) - 1)
    compute = sum(end[i] - start[i] for i in range(len(tasks)))
    finish = max(end[-1], link_free)
    return StreamTimeline(finish, compute, float(sum(comm_s)), finish - compute, tuple(starts), tuple(ends))
