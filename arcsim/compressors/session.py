"""Run a compressor with its memory over a stream of per-worker gradients, measuring every step (a trace a
group of layers at a time: :func:`arcsim.run.streamed.compress_streamed`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.base import Compressed, Compressor, check_finite, check_input
from arcsim.compressors.layout import Layer
from arcsim.compressors.memory import Memory
from arcsim.compressors.metrics import StepMetrics, fidelity, records_summary, update_error


def compress_steps(batches: Iterable[tuple[int, torch.Tensor]], compressor: Compressor, memory: Memory,
                   layout: tuple[Layer, ...] | None = None) -> Iterator[StepMetrics]:
    """Yield metrics per step; gradients arrive as (step, [P, d]) with all workers in this process."""
    comm: InProcessComm | None = None
    for step, g in batches:
        check_input(g)
        check_finite(g, step)
        if comm is None:
            comm = InProcessComm(g.shape[0])
        mark = comm.log.mark()
        seen: dict[str, Any] = {}

        def observe(u: torch.Tensor, out: Compressed, seen: dict = seen) -> None:
            seen.update(fidelity(u, out, compressor.k_for(u.shape[1])))

        update = memory.step(g, compressor, comm, step, layout, observe)
        nbytes, collectives = records_summary(comm.log.since(mark))
        drift = update_error(update, g)
        del g, update  # free this step before the source reads the next one
        if seen:
            yield StepMetrics(step=step, bytes_per_rank=nbytes, update_error=drift, collectives=collectives, **seen)
        else:  # the memory sent this step dense (EF21's first step)
            yield StepMetrics(step, 1.0, 1.0, 0.0, 1.0, None, nbytes, drift, collectives, dense_step=True)
