"""Compute profiles: forward time and per-layer gradient-ready times of a model on a device (no gradients kept).

A profile is a small JSON file; measured ones ship in ``traces/profiles`` (the wheel's
``arcsim/data/traces/profiles``) and are named bare.
``arcsim run --compute-profile`` combines one with the gradients of a trace captured elsewhere (e.g. H100
timings with CPU-captured gradients).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arcsim.errors import ArcsimError
from arcsim.files import packaged, read_json
from arcsim.processes import torch_version

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
    torch_version: str = field(default_factory=torch_version)
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
