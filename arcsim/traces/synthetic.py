"""Synthetic per-worker gradients for trying compressors without a trace.

Kinds (each step a fresh draw from (seed, step); values normalised to unit RMS per worker):
- ``normal``: i.i.d. N(0, 1) per worker — nothing shared, nothing structured.
- ``laplace``: i.i.d. Laplace — heavier tails.
- ``t3``: i.i.d. Student-t with 3 degrees of freedom — heavy tails (Gaussian-k misses k here).
- ``correlated``: g_i = √s · c + √(1 − s) · n_i. The common part c has block structure: blocks of 64
  elements whose scales are log-normal with spread σ (fixed across steps, like layers whose gradients
  stay large), so energy concentrates in some blocks; n_i is each worker's own N(0, 1) noise.
  Knobs: ``shared`` s ∈ [0, 1] (share of each worker's energy that is common; default 0.8) and
  ``spread`` σ ≥ 0 (default 1.5). This is the structure ARC-Top-K and AR-Top-K rely on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from arcsim.errors import CompressionError
from arcsim.processes import physical_memory_bytes

if TYPE_CHECKING:
    import torch

KINDS = ("normal", "laplace", "t3", "correlated")
BLOCK = 64


BYTES_PER_ELEMENT = 16  # a step's fp32 gradients, the fp64 draw they come from, and the compressor's scratch


def block_scales(elements: int, seed: int, spread: float) -> np.ndarray:
    """A log-normal scale (spread σ) per block of BLOCK elements, fixed by ``seed``, repeated over its elements."""
    scales = np.random.default_rng([seed, 0xB10C]).lognormal(0.0, spread, size=-(-elements // BLOCK))
    return np.repeat(scales, BLOCK)[:elements]


def synthetic_steps(kind: str, workers: int, elements: int, steps: int, seed: int = 0, shared: float = 0.8,
                    spread: float = 1.5) -> Iterator[tuple[int, torch.Tensor]]:
    """(step, gradients [workers, elements]) for ``steps`` steps; the arguments are checked at the call (before
    torch loads), the steps drawn as they are taken."""
    if kind not in KINDS:
        raise CompressionError(f"unknown synthetic kind {kind!r}; choose one of {', '.join(KINDS)}")
    if workers < 2:
        raise CompressionError(f"need at least 2 workers (got {workers})")
    if elements < 1:
        raise CompressionError(f"need at least 1 element (got {elements})")
    if steps < 1:
        raise CompressionError(f"need at least 1 step (got {steps})")
    if not 0 <= shared <= 1 or spread < 0:
        raise CompressionError("shared must be in [0, 1] and spread ≥ 0")
    need, have = workers * elements * BYTES_PER_ELEMENT, physical_memory_bytes()
    if need > 0.8 * have:
        raise CompressionError(f"{workers} workers × {elements:,} elements need about {need / 2**30:,.0f} GiB at "
                               f"once (more than this machine's {have / 2**30:.0f} GiB); use "
                               "fewer --elements or --workers")
    return _draws(kind, workers, elements, steps, seed, shared, spread)


def _draws(kind: str, workers: int, elements: int, steps: int, seed: int, shared: float,
           spread: float) -> Iterator[tuple[int, torch.Tensor]]:
    import torch

    block_scale = block_scales(elements, seed, spread)
    block_scale /= np.sqrt(np.mean(block_scale**2))
    for step in range(steps):
        rng = np.random.default_rng([seed, step])
        if kind == "normal":
            g = rng.standard_normal((workers, elements))
        elif kind == "laplace":
            g = rng.laplace(size=(workers, elements)) / np.sqrt(2)
        elif kind == "t3":
            g = rng.standard_t(3, size=(workers, elements)) / np.sqrt(3)
        else:
            common = rng.standard_normal(elements) * block_scale
            g = np.sqrt(shared) * common + np.sqrt(1 - shared) * rng.standard_normal((workers, elements))
        yield step, torch.from_numpy(g.astype(np.float32))
