"""Compute timings: forward time and the moment each parameter's gradient is ready in backward.

A post-accumulate-grad hook per parameter marks when autograd has finished that gradient — the moment
DDP may put it in a bucket. On CUDA the marks are CUDA events on the current stream (so kernels are not
serialised by host syncs); on the CPU they are host clock readings. The first backward also fixes the
backward order of the layers (the order their gradients become ready).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class Clock:
    """Marks on the host clock (CPU) or CUDA events (GPU); ``seconds(a, b)`` after ``finish()``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, start: object, end: object) -> float:
        if self.cuda:
            return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
        return float(end) - float(start)  # type: ignore[arg-type]


@dataclass
class StepTiming:
    forward_s: float
    backward_s: float
    ready_s: dict[str, float]   # parameter name → seconds from the start of backward
    order: list[str]            # parameter names in the order their gradients became ready


class ComputeTimer:
    """Times one forward + backward; parameters without a gradient in a step are absent from ``ready_s``."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.clock = Clock(device)
        self.marks: dict[str, object] = {}
        self.order: list[str] = []
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(name))
                        for name, p in model.named_parameters() if p.requires_grad]

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def mark(_: torch.Tensor) -> None:
            self.marks[name] = self.clock.mark()
            self.order.append(name)
        return mark

    def run(self, forward: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, StepTiming]:
        """Run ``forward()`` (returning a scalar loss) and its backward; return the loss and the timing."""
        self.marks, self.order = {}, []
        self.clock.finish()
        start = self.clock.mark()
        loss = forward()
        mid = self.clock.mark()
        loss.backward()
        end = self.clock.mark()
        self.clock.finish()
        ready = {name: self.clock.seconds(mid, m) for name, m in self.marks.items()}
        timing = StepTiming(self.clock.seconds(start, mid), self.clock.seconds(mid, end), ready, list(self.order))
        return loss.detach(), timing

    def close(self) -> None:
        for h in self.handles:
            h.remove()
