"""Data parallelism with whole replicas (DDP, Horovod): each gradient group (a DDP bucket, a Horovod fusion buffer)
is compressed on the compute stream once its last gradient is ready, then sent on the one collective stream, in
order (NCCL's single stream; a DDP comm hook's collectives). How the groups are formed is the framework's
(:mod:`arcsim.strategy.frameworks`); this turns them into the engine's items."""

from __future__ import annotations

import math
from collections.abc import Sequence

from arcsim.strategy.engine import LINKS, NO_STEP_EFFECTS, Item, StepEffects, Timeline, overlap_s, run


def bucketed_items(forward_s: float, backward_s: float, ready_s: Sequence[float], compress_s: Sequence[float],
                   comm_s: Sequence[float]) -> list[Item]:
    """Forward; backward cut at each group's ready time (``ready_s`` from the start of backward), each cut followed
    by the group's compression and, once that ends, its collectives (``comm_s``: their seconds, jitter included);
    the rest of backward."""
    items = [Item("compute", forward_s)]
    done = 0.0
    for ready, comp, comm in zip(ready_s, compress_s, comm_s, strict=True):
        items.append(Item("compute", ready - done))
        done = ready
        items.append(Item("compress", comp))
        items.append(Item("comm", comm, LINKS, ((len(items) - 1, "end"),)))
    items.append(Item("compute", backward_s - done))
    return items


def bucketed_step(forward_s: float, backward_s: float, ready_s: Sequence[float], compress_s: Sequence[float],
                  comm_s: Sequence[float], after_s: float = 0.0, effects: StepEffects = NO_STEP_EFFECTS) -> Timeline:
    """One step of bucketed data parallelism on the timeline engine (``after_s``: the optimizer step and the copies
    back, after both streams)."""
    return run(bucketed_items(forward_s, backward_s, ready_s, compress_s, comm_s), effects, after_s)


def bucketed_iteration_s(forward_s: float, backward_s: float, ready_s: Sequence[float], compress_s: Sequence[float],
                         comm_s: Sequence[float], after_s: float = 0.0,
                         effects: StepEffects = NO_STEP_EFFECTS) -> float:
    """``bucketed_step(...).iteration_s`` without building the step's items: the engine's placement of
    :func:`bucketed_items` as the same float operations in the same order, so the same number to the last bit
    (tests/test_strategy.py holds the two together). For the steps priced by the thousand (the policy's coordinate
    descent: 21,586 steps of LLaMA-1B on 4x8-eth25-a100, 34 of its 48 s of pricing under a profiler through the
    engine). With interference, the compute lane with no negative stretch is busy from 0 to its end, one span; one
    with a negative stretch (ready times out of order) is placed by the engine."""
    slowdown, interference = effects.slowdown, effects.interference
    compute = 0.0 + forward_s * slowdown  # (0.0 +: the engine's start plus seconds, so -0.0 comes out as it does)
    links, last_comm = 0.0, -math.inf  # the engine takes the max over the comm ends it placed, if any
    comms: list[tuple[float, float]] = []  # (with interference)
    done = 0.0
    in_order = True  # no compute-lane stretch is negative (with interference)
    for ready, comp, comm in zip(ready_s, compress_s, comm_s, strict=True):
        stretch = (ready - done) * slowdown
        compute = compute + stretch
        done = ready
        compute = compute + comp
        begin = max(links, compute)  # both links are free at once: the comm waits for them and its compression
        links = begin + comm
        last_comm = max(last_comm, links)
        if interference:
            in_order = in_order and stretch >= 0 and comp >= 0
            comms.append((begin, links))
    tail = (backward_s - done) * slowdown
    compute = compute + tail
    if interference:
        if not (in_order and forward_s * slowdown >= 0 and tail >= 0):
            return bucketed_step(forward_s, backward_s, ready_s, compress_s, comm_s, after_s, effects).iteration_s
        compute = compute + interference * overlap_s(comms, [(0.0, compute)] if compute > 0 else [])
    return max(compute, last_comm) + after_s
