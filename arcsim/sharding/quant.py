"""ZeRO++'s quantised reductions measured on a gradient trace (`arcsim shard`'s error table): the ways and their
math are the quantised reduce-scatter compressors' (:mod:`arcsim.compressors.sharded`: ``reduction_errors``)."""

from __future__ import annotations

from arcsim.compressors.sharded import ReductionError, reduction_errors, trace_pieces


def trace_errors(trace: str | None, gpus_per_node: int | None = None) -> tuple[str, list[ReductionError]]:
    """The errors on a gradient trace (None: the shipped default); ``gpus_per_node`` defaults to half its
    workers (two nodes)."""
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    path = resolve_trace(trace, allow_capture=False)
    tr = open_trace(path)
    g = gpus_per_node or max(tr.workers // 2, 1)
    steps = trace_pieces(tr) if tr.random_access else (grads for _, grads in tr.steps_iter())
    return str(path), reduction_errors(steps, g)
