"""One training iteration: forward, backward with buckets becoming ready, compression, communication.

Model (what a DDP comm hook on a GPU does):
- compression runs on the compute stream, so each bucket's compression delays the rest of backward;
- a bucket's communication starts when it is compressed and the previous bucket's communication has
  finished (one collective at a time, in bucket order, as NCCL's single stream does);
- the iteration ends when both backward and the last communication are done, and then the work that needs
  the reduced gradients (``after_s``: the optimizer step and DDP's copy of each bucket's result back into
  the gradients, where a profile measured them);
- communication slows the backward it overlaps: the compute stream ends later by ``interference`` × the
  communication that ran before it would have ended (first order: the buckets' ready times are not moved).
  Exposed communication is what remains after the compute
  stream (forward, backward, compression) has finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Timeline:
    iteration_s: float
    compute_s: float          # forward + backward (+ the work after the last communication) as the compute stream
    #                           runs them: with the slowest rank the caller passed and the interference
    compress_s: float         # total compression on the compute stream
    comm_s: float             # total communication time, overlapped or not
    exposed_comm_s: float     # iteration − (compute + compression)
    comm_start: tuple[float, ...]
    comm_end: tuple[float, ...]


def iteration(forward_s: float, backward_s: float, ready_s: Sequence[float], compress_s: Sequence[float],
              comm_s: Sequence[float], after_s: float = 0.0, interference: float = 0.0) -> Timeline:
    """Buckets in order; ``ready_s`` from the start of backward (non-decreasing); ``after_s`` follows the last
    communication and the backward both; ``interference``: backward's slowdown per second of communication it
    overlaps (arcsim.topology.Effects)."""
    shift = 0.0
    link_free = 0.0
    starts, ends = [], []
    for ready, comp, comm in zip(ready_s, compress_s, comm_s, strict=True):
        shift += comp
        start = max(forward_s + ready + shift, link_free)
        link_free = start + comm
        starts.append(start)
        ends.append(link_free)
    compute_end = forward_s + backward_s + shift
    if interference:
        overlap = sum(max(0.0, min(e, compute_end) - s) for s, e in zip(starts, ends, strict=True))
        compute_end += interference * overlap
    end = max(compute_end, link_free)
    return Timeline(end + after_s, compute_end - shift + after_s, shift, float(sum(comm_s)), end - compute_end,
                    tuple(starts), tuple(ends))
