"""Compute profiles: forward time and per-layer gradient-ready times of a model on a device (no gradients kept).

A profile is a small JSON file; measured ones ship in ``traces/profiles`` (the wheel's
``arcsim/data/traces/profiles``) and are named bare.
``arcsim run --compute-profile`` combines one with the gradients of a trace captured elsewhere (e.g. H100
timings with CPU-captured gradients).
"""

from __future__ import annotations

import math
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from arcsim.errors import ArcsimError
from arcsim.files import packaged, read_json
from arcsim.models import count_params
from arcsim.models.datasets import make_dataset
from arcsim.models.source import ModelSource, UserBatches, as_source, to_device
from arcsim.traces.timing import ComputeTimer

PROFILE_SCHEMA = 1
PROFILE_DIR = packaged("traces", "profiles")  # the measured profiles the package ships


@dataclass
class LayerTiming:
    name: str
    numel: int
    ready_s: float


@dataclass
class ComputeProfile:
    """Forward and backward of one worker's batch; ``layers`` in backward (gradient-ready) order."""

    model: str
    batch: int
    device: str
    device_name: str
    forward_s: float
    backward_s: float
    layers: list[LayerTiming]
    source: str                     # "profile" or "trace"
    repeats: int = 1
    torch_version: str = torch.__version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": PROFILE_SCHEMA, **asdict(self)}

    @property
    def compute_s(self) -> float:
        """All the compute an iteration does in series: forward, backward and what follows them."""
        return self.forward_s + self.backward_s + self.after_backward_s

    @property
    def after_backward_s(self) -> float:
        """Work that waits for the last bucket's communication (the optimizer step, DDP's copies of the results
        back into the gradients), where the profile measured it (``extra``; arcsim validate's worker does)."""
        return float(self.extra.get("after_backward_s", 0.0))

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> ComputeProfile:
        if data.get("schema_version") != PROFILE_SCHEMA:
            raise ArcsimError(f"{where}: compute profile schema {data.get('schema_version')!r} is not "
                              f"{PROFILE_SCHEMA}; re-run arcsim trace profile")
        try:
            fields = {k: v for k, v in data.items() if k != "schema_version"}
            fields["layers"] = [LayerTiming(**row) for row in fields["layers"]]
            profile = cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ArcsimError(f"{where} is not a compute profile ({exc})") from None
        profile.check(where)
        return profile

    def check(self, where: str) -> None:
        """Times finite and ≥ 0, counts whole and ≥ 1: a measured compute cannot be otherwise."""
        times = {"forward_s": self.forward_s, "backward_s": self.backward_s,
                 "after_backward_s": self.extra.get("after_backward_s", 0.0) if isinstance(self.extra, dict) else 0,
                 **{f"ready_s of {la.name}": la.ready_s for la in self.layers}}
        for label, value in times.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ArcsimError(f"{where}: {label} is {value!r}, not a time in seconds")
            if not math.isfinite(value):
                raise ArcsimError(f"{where}: {label} is not finite ({value}); profile the model again")
            if value < 0:
                raise ArcsimError(f"{where}: {label} is negative ({value:g} s); profile the model again")
        counts = {"batch": self.batch, **{f"numel of {la.name}": la.numel for la in self.layers}}
        for label, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArcsimError(f"{where}: {label} is {value!r}, not a whole number ≥ 1")


def load_profile(path: str | Path) -> ComputeProfile:
    """A profile file; a bare name not in the working directory is looked up among the shipped profiles."""
    path = Path(path)
    shipped = PROFILE_DIR / path.name
    if not path.exists() and path.parent == Path() and shipped.is_file():
        path = shipped
    if not path.exists():
        raise ArcsimError(f"no such compute profile: {path} (make one with arcsim trace profile)")
    return ComputeProfile.from_json(read_json(path, "compute profile", ArcsimError), str(path))


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
