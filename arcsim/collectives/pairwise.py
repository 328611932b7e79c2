"""All-to-all: by pairwise exchange (Thakur, Rabenseifner & Gropp 2005; Open MPI's large-message all-to-all): p − 1
steps, in step s rank r sends its block for r + s (mod p) to it and receives r − s's; or direct (NCCL's grouped
send/recv to every peer): every block at once, one step whose messages share the ports they cross."""

from __future__ import annotations

import numpy as np

from arcsim.collectives import limits
from arcsim.collectives.schedule import Step, make_step


def all_to_all(p: int, nbytes: float) -> list[Step]:
    """``nbytes``: each rank's whole send buffer (p blocks of nbytes / p, its own block staying home), so the
    closed form on a flat cluster is (p − 1)·α + (p − 1)/p · nbytes · β."""
    if p < 2:
        return []
    limits.expect_stored(p * (p - 1))
    ranks = np.arange(p)
    return [make_step(ranks, (ranks + s) % p, nbytes / p, 0.0) for s in range(1, p)]


def direct(p: int, nbytes: float) -> list[Step]:
    """One step of p·(p − 1) messages of ``nbytes`` / p: on a flat cluster α + (p − 1)/p · nbytes · β (each
    rank's port carries all its blocks), the latency paid once."""
    if p < 2:
        return []
    limits.expect_stored(p * (p - 1))
    ranks = np.arange(p)
    src = np.repeat(ranks, p - 1)
    dst = (src + np.tile(np.arange(1, p), p)) % p
    return [make_step(src, dst, nbytes / p, 0.0)]
