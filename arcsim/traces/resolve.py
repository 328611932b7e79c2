"""What a ``--trace`` value means: a file, a trace name, the shipped default, or a known model to capture.

A path with a folder in it means that file and nothing else. A bare name (``resnet50.npz``) is looked up
in the working directory, then among the traces arcsim made (:func:`arcsim.files.generated_traces_dir`,
the user cache), then among those shipped in the package. A known model's name that is found nowhere is
captured into the user cache — or, with ``--no-capture``, refused with the exact capture command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from arcsim.files import generated_traces_dir, packaged, trace_candidates
from arcsim.models import MODELS
from arcsim.traces.format import TraceError

if TYPE_CHECKING:
    from arcsim.traces.capture import CaptureConfig

DEFAULT_TRACE_NAME = "cnn-digits-small.npz"  # its metadata holds the command that captured it


def shipped_traces_dir() -> Path:
    """The traces shipped inside the package (the default trace and the measured compute profiles)."""
    return packaged("traces")


def default_capture(model: str, out: Path) -> CaptureConfig:
    """The capture made for ``--trace <model>.npz``: 8 workers, 3 recorded steps after 2 of training, fp16."""
    from arcsim.traces.capture import CaptureConfig  # (torch: a capture trains)

    return CaptureConfig(model=model, out=out, workers=8, steps=3, every=1, warmup=2, dtype="fp16")


def resolve_trace(value: str | None, allow_capture: bool = True,
                  announce: Callable[[str], None] = print,
                  progress: Callable[[int, int], None] | None = None, force: bool = False) -> Path:
    """Turn a ``--trace`` value into an existing trace file, capturing a known model's trace if allowed (its
    estimate said first, refused past the available memory unless ``force``: arcsim.traces.estimates)."""
    if value is None:
        path = shipped_traces_dir() / DEFAULT_TRACE_NAME
        if not path.exists():
            raise TraceError(f"the default trace {path} is missing from the package; reinstall arcsim")
        return path
    if not value.strip():
        raise TraceError("--trace is empty; give a trace file, or a known model's name such as resnet50.npz")
    given = Path(value)
    bare = given.parent == Path()
    for candidate in trace_candidates(value):
        if candidate.is_dir():
            raise TraceError(f"--trace {value} is a directory; give a trace file (.npz)")
        if candidate.exists():
            return candidate
    model = given.name.removesuffix(".npz")
    if given.suffix != ".npz" or model not in MODELS:
        raise TraceError(f"no such trace file: {value} (known models to capture by name: "
                         f"{', '.join(m + '.npz' for m in MODELS)})")
    out = generated_traces_dir() / given.name if bare else given
    cfg = default_capture(model, out)
    if not allow_capture:
        raise TraceError(f"trace {value} does not exist; capture it with: {cfg.command()}")
    from arcsim.traces.estimates import CAPTURE_BYTES_PER_ELEMENT, TooBig, check_training, training

    try:
        estimate = check_training(f"capturing {value}",
                                  lambda: training(cfg, state_per_element=CAPTURE_BYTES_PER_ELEMENT), force)
    except TooBig as exc:  # not every command that captures on demand takes --force: the capture itself does
        raise TooBig(f"{exc} (or capture it first: {cfg.command()} --force)") from None
    announce(f"trace {value} not found; capturing it now: {cfg.command()}"
             + (f" ({estimate.describe()})" if estimate is not None else ""))
    from arcsim.traces.capture import capture

    started = time.perf_counter()
    capture(cfg, progress)
    announce(f"captured {out} in {time.perf_counter() - started:.0f} s")
    return out
