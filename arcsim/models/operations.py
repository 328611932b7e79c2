"""One training step of a model as the device model reads it: its forward and backward operations, each with its
class, FLOPs and bytes, and when each parameter's gradient is ready (counted by arcsim.models.meta_count, kept by
arcsim.models.workload).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OP_CLASSES = ("conv", "matmul", "attention", "memory")
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation"}


def op_class(name: str) -> str:
    """The class of an aten operation by its name (``convolution_backward`` → conv, ``bmm`` → matmul)."""
    if "convolution" in name or name.startswith("conv"):
        return "conv"
    if "attention" in name:
        return "attention"
    if name in _MATMUL:
        return "matmul"
    return "memory"


@dataclass(frozen=True)
class Op:
    cls: str
    flops: float
    bytes: float


@dataclass
class Workload:
    """The operations of one forward (loss included) and one backward, in order."""

    model: str
    batch: int
    input_shape: tuple[int, ...]
    forward: list[Op] = field(default_factory=list)
    backward: list[Op] = field(default_factory=list)
    ready_after: dict[str, int] = field(default_factory=dict)  # parameter → backward ops done when it is ready
    numel: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # parameters in the order their gradients become ready
    _arrays: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def arrays(self, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``forward`` or ``backward`` as arrays: FLOPs, bytes, and the index of each operation's class in
        OP_CLASSES (kept once computed)."""
        if phase not in self._arrays:
            ops = getattr(self, phase)
            self._arrays[phase] = (np.array([op.flops for op in ops], dtype=float),
                                   np.array([op.bytes for op in ops], dtype=float),
                                   np.array([OP_CLASSES.index(op.cls) for op in ops], dtype=np.int64))
        return self._arrays[phase]

    def totals(self, phase: str) -> dict[str, tuple[float, float, int]]:
        """Per class: (FLOPs, bytes, operations) of ``forward`` or ``backward``."""
        out = {c: (0.0, 0.0, 0) for c in OP_CLASSES}
        for op in getattr(self, phase):
            f, b, n = out[op.cls]
            out[op.cls] = (f + op.flops, b + op.bytes, n + 1)
        return out
