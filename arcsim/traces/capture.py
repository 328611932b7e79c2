"""Capture a trace: the recorded steps of data-parallel training (:mod:`arcsim.traces.training`) written
to a file, each worker's gradient in the stored dtype, with the median timings of the workers."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from arcsim.errors import ArcsimError
from arcsim.models.source import absolute_ref
from arcsim.traces.format import DTYPES, SCHEMA_VERSION, TraceWriter
from arcsim.traces.timing import device_name
from arcsim.traces.training import DataParallelSteps, TrainingConfig


@dataclass
class CaptureConfig(TrainingConfig):
    out: Path = field(default=Path("trace.npz"), kw_only=True)
    dtype: str = field(default="fp16", kw_only=True)

    def record_dtype(self) -> torch.dtype:
        return torch.float16 if self.dtype == "fp16" else torch.float32

    def command(self) -> str:
        """The `arcsim trace capture` command line that reproduces this capture."""
        parts = ["arcsim", "trace", "capture", "--model", self.model]
        for key, value in self.source.args:
            parts += ["--model-arg", f"{key}={value}"]
        if self.dataset:
            parts += ["--dataset", self.dataset]
        if self.data:
            parts += ["--data", self.data]
        parts += ["--workers", str(self.workers), "--steps", str(self.steps), "--every", str(self.every),
                  "--warmup", str(self.warmup)]
        if self.batch:
            parts += ["--batch", str(self.batch)]
        parts += ["--device", self.device, "--dtype", self.dtype, "--seed", str(self.seed)]
        if self.optimizer is not None:
            parts += ["--optimizer", self.optimizer]
        if self.lr is not None:
            parts += ["--lr", repr(self.lr)]
        if self.momentum is not None:
            parts += ["--momentum", repr(self.momentum)]
        if self.betas is not None:
            parts += ["--betas", f"{self.betas[0]!r},{self.betas[1]!r}"]
        if self.weight_decay:
            parts += ["--weight-decay", repr(self.weight_decay)]
        if self.precision != "fp32":
            parts += ["--precision", self.precision]
        if self.input_size:
            parts += ["--input-size", str(self.input_size)]
        return shlex.join([*parts, "--out", str(self.out)])

    def check(self) -> None:
        super().check()
        if self.dtype not in DTYPES:
            raise ArcsimError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if Path(self.out).suffix != ".npz":
            raise ArcsimError(f"--out {self.out}: a trace file name must end in .npz")


def capture(cfg: CaptureConfig, progress: Callable[[int, int], None] | None = None) -> Path:
    """Run the capture and write the trace atomically; returns its path. ``progress(done, total)`` per step."""
    cfg.check()
    training = DataParallelSteps(cfg, progress)
    started = time.perf_counter()
    writer: TraceWriter | None = None
    try:
        for rec in training:
            if writer is None:
                meta = _metadata(cfg, training)
                writer = TraceWriter(cfg.out, meta, training.layers, cfg.dtype).__enter__()
            forward, backward, ready = rec.median_timing(training.layers)
            writer.write_step(rec.grads, rec.losses, forward, backward, ready)
        assert writer is not None
        writer.meta["capture_seconds"] = round(time.perf_counter() - started, 3)
        writer.__exit__(None, None, None)
        writer = None
    except BaseException as exc:
        if writer is not None:
            writer.__exit__(type(exc), exc, exc.__traceback__)
        raise
    return Path(cfg.out)


def training_metadata(training: DataParallelSteps) -> dict[str, Any]:
    """What a trace (or a live run) says about the training its gradients come from."""
    import arcsim

    cfg, ds, dev = training.cfg, training.data, training.device
    data = ({"dataset": ds.name, "dataset_description": ds.description, "synthetic_data": ds.synthetic,
             "input_shape": list(ds.spec.shape), "classes": ds.spec.classes} if ds is not None else
            {"dataset": absolute_ref(cfg.data or ""), "dataset_description": f"the user's batches from {cfg.data}",
             "synthetic_data": False})
    return {"schema_version": SCHEMA_VERSION, "model": training.source.label,
            "model_source": training.source.to_meta(), **data,
            "params": training.params, "batch_per_worker": training.batch, "workers": cfg.workers,
            "steps": cfg.steps, "recorded_steps": cfg.recorded_steps, "warmup": cfg.warmup, "every": cfg.every,
            "optimizer": cfg.describe_optimizer(), "lr": cfg.learning_rate(), "precision": cfg.precision,
            "device": dev.type, "device_name": device_name(dev), "torch_version": torch.__version__,
            "arcsim_version": getattr(arcsim, "__version__", "unknown"), "seed": cfg.seed}


def _metadata(cfg: CaptureConfig, training: DataParallelSteps) -> dict[str, Any]:
    return {**training_metadata(training), "dtype": cfg.dtype, "command": cfg.command(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
