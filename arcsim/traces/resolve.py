"""What a ``--trace`` value means: a file, a name under traces/, the shipped default, or a known model to capture.

``--trace resnet50.npz`` with no such file captures the default trace of that model into traces/
(git-ignored) — or, with ``--no-capture``, stops with the exact capture command.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from arcsim.models import MODELS
from arcsim.traces.capture import CaptureConfig, capture
from arcsim.traces.format import TraceError

REPO_TRACES = Path(__file__).resolve().parents[2] / "traces"
DEFAULT_TRACE_NAME = "cnn-digits-small.npz"
SHIPPED_DEFAULT = CaptureConfig(model="cnn", dataset="digits", workers=8, steps=16, every=4, warmup=20, batch=16,
                                dtype="fp16", out=Path("traces") / DEFAULT_TRACE_NAME)


def trace_dir() -> Path:
    """Where named traces live: $ARCSIM_TRACE_DIR, else traces/ of this checkout, else ./traces."""
    if "ARCSIM_TRACE_DIR" in os.environ:
        return Path(os.environ["ARCSIM_TRACE_DIR"])
    return REPO_TRACES if REPO_TRACES.is_dir() else Path("traces")


def default_capture(model: str, out: Path) -> CaptureConfig:
    """The capture made for ``--trace <model>.npz``: 8 workers, 3 recorded steps after 2 of training, fp16."""
    return CaptureConfig(model=model, out=out, workers=8, steps=3, every=1, warmup=2, dtype="fp16")


def resolve_trace(value: str | None, allow_capture: bool = True,
                  announce: Callable[[str], None] = print,
                  progress: Callable[[int, int], None] | None = None) -> Path:
    """Turn a ``--trace`` value into an existing trace file, capturing a known model's trace if allowed."""
    if value is None:
        path = trace_dir() / DEFAULT_TRACE_NAME
        if not path.exists():
            raise TraceError(f"the default trace {path} is missing; recreate it with: {SHIPPED_DEFAULT.command()}")
        return path
    given = Path(value)
    for candidate in (given, trace_dir() / given.name):
        if candidate.exists():
            return candidate
    model = given.name.removesuffix(".npz")
    if given.suffix != ".npz" or model not in MODELS:
        raise TraceError(f"no such trace file: {value} (known models to capture by name: "
                         f"{', '.join(m + '.npz' for m in MODELS)})")
    out = given if given.parent != Path() else trace_dir() / given.name
    cfg = default_capture(model, out)
    if not allow_capture:
        raise TraceError(f"trace {value} does not exist; capture it with: {cfg.command()}")
    announce(f"trace {value} not found; capturing it now: {cfg.command()}")
    started = time.perf_counter()
    capture(cfg, progress)
    announce(f"captured {out} in {time.perf_counter() - started:.0f} s")
    return out
