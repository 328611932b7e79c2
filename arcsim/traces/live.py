"""Live gradients for `arcsim run --live`: data-parallel training fed straight to the compressors, no file.

:class:`LiveSource` offers what `arcsim run` reads from a trace (layers, metadata, timings, steps) while
training runs: each pass over ``steps_iter()`` trains from the same seed and yields one step's [W, d]
gradients at a time, so memory does not grow with the number of steps. The first recorded step is
trained when the source is opened (it fixes the backward order and the compute timings) and handed to
the first pass, so nothing is trained twice for a single pass. On CUDA the timings are CUDA events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arcsim.compressors.layout import Layer
from arcsim.traces.capture import training_metadata
from arcsim.traces.training import DataParallelSteps, RecordedStep, TrainingConfig


class LiveSource:
    """A trace-shaped view of live data-parallel training (see the module docstring)."""

    def __init__(self, cfg: TrainingConfig, progress: Callable[[int, int], None] | None = None) -> None:
        """Trains up to the first recorded step, calling ``progress(done, total)`` per training step."""
        cfg.check()
        self.cfg = cfg
        training = DataParallelSteps(cfg, progress)
        steps = iter(training)
        first = next(steps)
        training.progress = None  # ``progress`` follows the training up to the first recorded step only
        self._first: tuple[RecordedStep, Iterator[RecordedStep]] | None = (first, steps)
        self.layers: tuple[Layer, ...] = training.layers
        self.device = training.device
        self.meta: dict[str, Any] = {**training_metadata(training), "live": True}
        forward, backward, ready = first.median_timing(self.layers)
        self.forward_s = np.array([forward])
        self.backward_s = np.array([backward])
        self.ready_s = np.array([ready])
        self.path = Path(f"live-{cfg.model}")  # a name for messages; nothing is read or written there
        self.passes = 0  # training passes run so far (each measures several compressors)

    @property
    def label(self) -> str:
        return f"live training on {self.meta['device']} ({self.meta['device_name']})"

    @property
    def steps(self) -> int:
        return self.cfg.steps

    @property
    def workers(self) -> int:
        return self.cfg.workers

    @property
    def elements(self) -> int:
        return sum(la.numel for la in self.layers)

    @property
    def recorded_steps(self) -> list[int]:
        return self.cfg.recorded_steps

    def steps_iter(self) -> Iterator[tuple[int, torch.Tensor]]:
        """One training pass: (training step, [W, d] float32 gradients on the training device) per recorded step.
        The tensor is reused by the next step: use it before asking for the next."""
        self.passes += 1
        if self._first is not None:
            first, rest = self._first
            self._first = None
            yield first.step, first.grads
        else:
            rest = iter(DataParallelSteps(self.cfg))  # trained again from the seed
        for rec in rest:
            yield rec.step, rec.grads
