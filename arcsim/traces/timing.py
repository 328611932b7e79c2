"""Compute timings: forward time and the moment each parameter's gradient is ready in backward.

A compute profile (arcsim.traces.profile) is measured here (:func:`measure_profile`). A post-accumulate-grad hook per
parameter marks when autograd has finished that gradient — the moment
DDP may put it in a bucket. On CUDA the marks are CUDA events on the current stream (so kernels are not
serialised by host syncs); on the CPU they are host clock readings. The first backward also fixes the
backward order of the layers (the order their gradients become ready).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arcsim.errors import ArcsimError
from arcsim.models import count_params
from arcsim.models.datasets import make_dataset
from arcsim.models.source import ModelSource, UserBatches, as_source, to_device
from arcsim.traces.profile import ComputeProfile, LayerTiming


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ArcsimError("--device cuda asked for, but this torch sees no CUDA device; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise ArcsimError(f"unknown device {name!r}; use cpu or cuda")
    return torch.device(name)


def measure_profile(model: str | ModelSource, batch: int, device: str = "cpu", dataset: str | None = None,
                    input_size: int | None = None, repeats: int = 10, warmup: int = 3, bf16: bool = False,
                    progress: Callable[[], None] | None = None, data: str | None = None) -> ComputeProfile:
    """Median forward/backward/per-layer-ready times over ``repeats`` timed iterations after ``warmup``, of a
    zoo model or any model source, on a built-in dataset or one batch of the user's ``data``."""
    if batch < 1 or repeats < 1 or warmup < 0:
        raise ArcsimError("--batch and --repeats must be ≥ 1 and --warmup ≥ 0")
    source = as_source(model)
    source.check()
    dev = resolve_device(device)
    name = source.dataset_for(dataset, data, input_size)
    ds = None if name is None else make_dataset(name, input_size)
    spec = ds.spec if ds is not None else None
    torch.manual_seed(0)
    net = source.build(spec).to(dev).train()
    if ds is not None:
        example: Any = tuple(t.to(dev) for t in ds.draw(batch, torch.Generator().manual_seed(0)))
    else:
        assert data is not None
        example = to_device(UserBatches(data, batch, 0).next(), dev)
    timer = ComputeTimer(net, dev)

    def forward() -> torch.Tensor:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            return source.loss(net, example, spec)

    runs = []
    for i in range(warmup + repeats):
        net.zero_grad(set_to_none=True)
        _, timing = timer.run(forward)
        if i >= warmup:
            runs.append(timing)
        if progress:
            progress()
    timer.close()
    order = runs[0].order
    layers = [LayerTiming(name, dict(net.named_parameters())[name].numel(),
                          statistics.median(r.ready_s[name] for r in runs)) for name in order]
    inputs = ({"dataset": ds.name, "input_shape": list(ds.spec.shape)} if ds is not None else {"data": data})
    return ComputeProfile(source.label, batch, dev.type, device_name(dev),
                          statistics.median(r.forward_s for r in runs), statistics.median(r.backward_s for r in runs),
                          layers, "profile", repeats,
                          extra={**inputs, "params": count_params(net), "model_source": source.to_meta(),
                                 "precision": "bf16-autocast" if bf16 else "fp32"})
