"""A model of any size without a trace: ``arcsim run --params 123M [--layers N]``.

The compressors run on a scaled-down SAMPLE of the model (every layer shrunk by the same factor, at most
:data:`SAMPLE_ELEMENTS` in all) with synthetic heavy-tailed gradients: Student-t (3 degrees of freedom)
noise per worker on top of a shared part whose 64-element blocks have log-normal scales (the structure
of :mod:`arcsim.traces.synthetic`'s ``correlated`` kind). DDP buckets shrink by the same factor, so the
sample has the full model's buckets. What the compressors then send is scaled back to the full size,
message by message: payloads that grow with the bucket (values, indices, and PowerSGD's P and Q, whose
rank follows the density) by the element ratio, ARC-Top-K's sketch (a few numbers per row of a square
layer) by its square root, and fixed-size exchanges (counts, norms, k, λ) not at all — exact to the
rounding of k in the sample. The error a compressor makes is the
sample's: synthetic, and said so in the output. No full-size tensor is ever made, so 100 B parameters
cost what 1 M do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arcsim.comm.log import CommRecord, scaled
from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError

SAMPLE_ELEMENTS = 2**18  # what the compressors run on, across all layers
SAMPLE_WORKERS = 4
SAMPLE_STEPS = 2
DEFAULT_LAYERS = 32


@dataclass(frozen=True)
class ParamsModel:
    params: int
    layers: int

    def __post_init__(self) -> None:
        if not 1 <= self.layers <= min(self.params, 100_000):
            raise ArcsimError(f"--layers must be between 1 and min(params, 100000) (got {self.layers})")

    @property
    def name(self) -> str:
        return f"synthetic-{format_params(self.params)}"

    @property
    def full_layer(self) -> int:
        return self.params // self.layers

    @property
    def sample_layer(self) -> int:
        """Elements of one sample layer: a square side², at most SAMPLE_ELEMENTS / layers and the full layer."""
        side = max(1, math.isqrt(max(1, min(self.full_layer, SAMPLE_ELEMENTS // self.layers))))
        return side * side

    @property
    def scale(self) -> float:
        """Full elements per sample element."""
        return self.params / (self.sample_layer * self.layers)

    def scale_record(self, r: CommRecord) -> CommRecord:
        """What ``r`` (sent by a compressor on the sample) is on the full model."""
        return scaled(r, self.scale)

    def sample_trace(self, directory: Path, seed: int = 0) -> Path:
        """The sample as a trace file (written once per (params, layers, seed), then reused)."""
        import torch  # here, not above: a bad --params is answered before torch loads

        from arcsim.traces.format import SCHEMA_VERSION, TraceWriter
        from arcsim.traces.synthetic import block_scales

        path = directory / f".{self.name}-l{self.layers}-s{seed}.npz"
        if path.exists():
            return path
        side = math.isqrt(self.sample_layer)
        layers = tuple(Layer(f"layer{i}.weight", (side, side), i * self.sample_layer) for i in range(self.layers))
        d = self.sample_layer * self.layers
        meta = {"schema_version": SCHEMA_VERSION, "model": self.name, "dataset": "none", "synthetic_data": True,
                "params": self.params, "batch_per_worker": 0, "workers": SAMPLE_WORKERS, "steps": SAMPLE_STEPS,
                "recorded_steps": list(range(SAMPLE_STEPS)), "dtype": "fp32", "device": "none",
                "torch_version": torch.__version__, "seed": seed,
                "command": f"arcsim run --params {self.params} --layers {self.layers}",
                "sample_of": {"params": self.params, "layers": self.layers, "scale": self.scale}}
        shape = block_scales(d, seed, spread=1.5)
        with TraceWriter(path, json.loads(json.dumps(meta)), layers, "fp32") as writer:
            for step in range(SAMPLE_STEPS):
                rng = np.random.default_rng([seed, step])
                shared = rng.standard_normal(d) * shape
                noise = rng.standard_t(3, size=(SAMPLE_WORKERS, d)) * shape
                grads = torch.from_numpy(0.8**0.5 * shared + 0.2**0.5 * noise / 3**0.5)
                writer.write_step(grads, [0.0] * SAMPLE_WORKERS, 0.0, 0.0, [0.0] * self.layers)
        return path


def format_params(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return str(n)
