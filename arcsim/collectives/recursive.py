"""Recursive halving/doubling algorithms, for any rank count.

When p is not a power of two, the first 2r ranks (r = p − 2^⌊log2 p⌋) fold in pairs before the
power-of-two part (odd rank sends its whole vector to the even one, which reduces it) and unfold
after it (the even rank sends the result back) — Thakur, Rabenseifner & Gropp (2005).
"""

from __future__ import annotations

import numpy as np

from arcsim.collectives.schedule import Step, make_step


def _fold(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(real rank of each virtual rank, odd ranks that fold, even ranks they fold into)."""
    p2 = 1 << (p.bit_length() - 1)
    r = p - p2
    even = np.arange(r) * 2
    odd = even + 1
    active = np.concatenate([even, np.arange(2 * r, p)])
    return active, odd, even


def _folded(p: int, nbytes: float, core: list[Step]) -> list[Step]:
    _, odd, even = _fold(p)
    if odd.size == 0:
        return core
    return [make_step(odd, even, nbytes, nbytes), *core, make_step(even, odd, nbytes, 0.0)]


def halving_doubling_all_reduce(p: int, nbytes: float) -> list[Step]:
    """Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.

    Partners at distance 1, 2, 4, … exchange n/2, n/4, … so the largest messages go to the nearest
    ranks (inside a node when ranks are numbered node by node).
    """
    active, _, _ = _fold(p)
    k = active.size.bit_length() - 1
    v = np.arange(active.size)
    halving = [make_step(active[v], active[v ^ (1 << j)], nbytes / 2 ** (j + 1), nbytes / 2 ** (j + 1))
               for j in range(k)]
    doubling = [make_step(active[v], active[v ^ (1 << j)], nbytes / 2 ** (j + 1), 0.0)
                for j in reversed(range(k))]
    return _folded(p, nbytes, halving + doubling)


def doubling_all_reduce(p: int, nbytes: float) -> list[Step]:
    """Recursive doubling: log2 p exchanges of the whole vector (latency-optimal, for short messages)."""
    active, _, _ = _fold(p)
    k = active.size.bit_length() - 1
    v = np.arange(active.size)
    core = [make_step(active[v], active[v ^ (1 << j)], nbytes, nbytes) for j in range(k)]
    return _folded(p, nbytes, core)


def halving_reduce_scatter(p: int, total: float) -> list[Step]:
    """The recursive doubling all-gather run backwards, for any p: ⌈log2 p⌉ steps, the farthest partner first; in
    each, rank r sends (and its partner reduces) the blocks that rank's half still owes, min(d, p − d) of total/p,
    to r + d."""
    ranks = np.arange(p)
    distances = [1 << i for i in range(max(p - 1, 1).bit_length())] if p > 1 else []
    return [make_step(ranks, (ranks + d) % p, min(d, p - d) * total / p, min(d, p - d) * total / p)
            for d in reversed(distances)]


def doubling_all_gather(p: int, total: float) -> list[Step]:
    """Recursive doubling for any p (dissemination/Bruck form): ⌈log2 p⌉ steps.

    In step i rank r sends everything it has so far, min(2^i, p − 2^i) blocks of total/p, to r − 2^i.
    For p a power of two the cost equals the textbook recursive-doubling all-gather.
    """
    ranks = np.arange(p)
    steps = []
    d = 1
    while d < p:
        steps.append(make_step(ranks, (ranks - d) % p, min(d, p - d) * total / p, 0.0))
        d *= 2
    return steps
