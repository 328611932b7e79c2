"""Capture a trace from live data-parallel training of W workers simulated in one process.

At every training step all W workers compute gradients at the SAME parameters on DISJOINT shards of
one global batch; their average is applied with SGD (momentum 0.9), exactly what DDP does. Recorded
steps (after ``warmup`` steps, then every ``every``) write each worker's gradient to the trace, so
later recorded steps see a model that has trained, not a fresh initialisation. Each worker keeps its
own BatchNorm batch statistics (DDP without SyncBN).
"""

from __future__ import annotations

import shlex
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from arcsim.compressors.base import Layer
from arcsim.errors import ArcsimError
from arcsim.models import count_params, loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.traces.format import DTYPES, SCHEMA_VERSION, TraceWriter
from arcsim.traces.profile import device_name, resolve_device
from arcsim.traces.timing import ComputeTimer, StepTiming


@dataclass
class CaptureConfig:
    model: str
    out: Path
    dataset: str | None = None
    workers: int = 8
    steps: int = 3
    every: int = 1
    warmup: int = 0
    batch: int | None = None        # per worker; the model's default when None
    device: str = "cpu"
    dtype: str = "fp16"
    seed: int = 0
    lr: float | None = None
    input_size: int | None = None

    def command(self) -> str:
        """The `arcsim trace capture` command line that reproduces this capture."""
        parts = ["arcsim", "trace", "capture", "--model", self.model]
        if self.dataset:
            parts += ["--dataset", self.dataset]
        parts += ["--workers", str(self.workers), "--steps", str(self.steps), "--every", str(self.every),
                  "--warmup", str(self.warmup)]
        if self.batch:
            parts += ["--batch", str(self.batch)]
        parts += ["--device", self.device, "--dtype", self.dtype, "--seed", str(self.seed)]
        if self.lr is not None:
            parts += ["--lr", repr(self.lr)]
        if self.input_size:
            parts += ["--input-size", str(self.input_size)]
        return shlex.join([*parts, "--out", str(self.out)])

    def check(self) -> None:
        for name in ("steps", "every"):
            if getattr(self, name) < 1:
                raise ArcsimError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.workers < 2:
            raise ArcsimError(f"--workers must be at least 2 (a trace compares workers' gradients), got {self.workers}")
        if self.warmup < 0:
            raise ArcsimError(f"--warmup must be ≥ 0, got {self.warmup}")
        if self.batch is not None and self.batch < 1:
            raise ArcsimError(f"--batch must be at least 1, got {self.batch}")
        if self.dtype not in DTYPES:
            raise ArcsimError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if Path(self.out).suffix != ".npz":
            raise ArcsimError(f"--out {self.out}: a trace file name must end in .npz")
        if self.lr is not None and not self.lr > 0:
            raise ArcsimError(f"--lr must be positive, got {self.lr}")

    @property
    def total_steps(self) -> int:
        return self.warmup + (self.steps - 1) * self.every + 1

    def recorded(self, t: int) -> bool:
        return t >= self.warmup and (t - self.warmup) % self.every == 0


def capture(cfg: CaptureConfig, progress: Callable[[int, int], None] | None = None) -> Path:
    """Run the capture and write the trace atomically; returns its path. ``progress(done, total)`` per step."""
    cfg.check()
    entry = model_entry(cfg.model)
    ds = make_dataset(cfg.dataset or entry.default_dataset, cfg.input_size)
    dev = resolve_device(cfg.device)
    batch = cfg.batch or entry.default_batch
    torch.manual_seed(cfg.seed)
    model = entry.build(ds.spec).to(dev).train()
    params = dict(model.named_parameters())
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr or entry.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(cfg.seed)
    timer = ComputeTimer(model, dev)
    started = time.perf_counter()
    writer: TraceWriter | None = None
    layers: tuple[Layer, ...] = ()
    buf: torch.Tensor | None = None  # [workers, d] gradients of the step being recorded
    recorded = [t for t in range(cfg.total_steps) if cfg.recorded(t)]
    try:
        for t in range(cfg.total_steps):
            x, y = ds.draw(cfg.workers * batch, gen)
            shards = zip(x.chunk(cfg.workers), y.chunk(cfg.workers), strict=True)
            avg = {name: torch.zeros_like(p) for name, p in params.items()}
            losses: list[float] = []
            timings: list[StepTiming] = []
            for xw, yw in shards:
                model.zero_grad(set_to_none=True)
                xw, yw = xw.to(dev), yw.to(dev)
                def forward(xw: torch.Tensor = xw, yw: torch.Tensor = yw) -> torch.Tensor:
                    return loss_fn(ds.spec.kind, model(xw), yw)

                loss, timing = timer.run(forward)
                if not layers:  # backward order, fixed by the first backward
                    order = timing.order + [n for n in params if n not in timing.order]
                    layers = _layout(order, params)
                for name, p in params.items():
                    if p.grad is not None:
                        avg[name] += p.grad / cfg.workers
                if cfg.recorded(t):
                    if buf is None:
                        buf = torch.empty(cfg.workers, sum(la.numel for la in layers), device=dev)
                    torch.cat([_grad(params[la.name]) for la in layers], out=buf[len(losses)])
                    losses.append(float(loss))
                    timings.append(timing)
            if cfg.recorded(t):
                if writer is None:
                    meta = _metadata(cfg, entry.name, ds, batch, count_params(model), recorded, dev)
                    writer = TraceWriter(cfg.out, meta, layers, cfg.dtype).__enter__()
                assert buf is not None  # a recorded step filled it
                end = statistics.median(tm.backward_s for tm in timings)
                writer.write_step(buf, losses, statistics.median(tm.forward_s for tm in timings), end,
                                  [statistics.median(tm.ready_s.get(la.name, end) for tm in timings) for la in layers])
            for name, p in params.items():
                p.grad = avg[name]
            opt.step()
            if progress:
                progress(t + 1, cfg.total_steps)
        assert writer is not None
        writer.meta["capture_seconds"] = round(time.perf_counter() - started, 3)
        writer.__exit__(None, None, None)
        writer = None
    except BaseException as exc:
        if writer is not None:
            writer.__exit__(type(exc), exc, exc.__traceback__)
        raise
    finally:
        timer.close()
    return Path(cfg.out)


def _grad(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros(p.numel(), device=p.device) if p.grad is None else p.grad.detach().reshape(-1).float()


def _layout(order: list[str], params: Mapping[str, torch.Tensor]) -> tuple[Layer, ...]:
    layers, offset = [], 0
    for name in order:
        layers.append(Layer(name, tuple(params[name].shape), offset))
        offset += params[name].numel()
    return tuple(layers)


def _metadata(cfg: CaptureConfig, model: str, ds: object, batch: int, params: int, recorded: list[int],
              dev: torch.device) -> dict:
    import arcsim

    return {"schema_version": SCHEMA_VERSION, "model": model, "dataset": ds.name,  # type: ignore[attr-defined]
            "dataset_description": ds.description, "synthetic_data": ds.synthetic,  # type: ignore[attr-defined]
            "input_shape": list(ds.spec.shape), "classes": ds.spec.classes,  # type: ignore[attr-defined]
            "params": params, "batch_per_worker": batch, "workers": cfg.workers, "steps": cfg.steps,
            "recorded_steps": recorded, "warmup": cfg.warmup, "every": cfg.every, "dtype": cfg.dtype,
            "optimizer": "SGD momentum 0.9", "lr": cfg.lr or model_entry(model).lr,
            "device": dev.type, "device_name": device_name(dev), "torch_version": torch.__version__,
            "arcsim_version": getattr(arcsim, "__version__", "unknown"), "seed": cfg.seed,
            "command": cfg.command(), "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
