"""Error feedback: what each worker compresses, and what it keeps for later (methods.md).

- ``none``: compress g; apply the aggregate.
- ``ef14``: u = g + e; send C(u); e ← u − C(u).
- ``ef21``: c = C(g − h); h ← h + c; h̄ ← h̄ + mean(c); apply h̄. First step dense: h = g, h̄ = mean(g).
- ``ef21m``: v ← (1 − η) v + η g, then EF21 on v; first step v = h = g. η = 0.1 by default.
State is per local worker ([W, d]) and lives across steps; updates are in place. ``observe(u, out)``
is called after compression and before the memory moves on, so callers can measure u. ``final``: no later
step reads the memory (the last step of a measurement), so it is left as it is. EF14's first step
compresses g itself (compressors never write to their input) and copies it only to keep e.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.layout import Layer
from arcsim.errors import CompressionError

Observer = Callable[[torch.Tensor, Compressed], None]


class Memory(ABC):
    name: str
    per_rank: tuple[str, ...] = ()  # state tensors with a row per local worker ([W, d]), None before the first step
    shared: tuple[str, ...] = ()    # state tensors every worker holds alike ([1, d])

    def step(self, g: torch.Tensor, compressor: Compressor, comm: Communicator, step: int,
             layout: tuple[Layer, ...] | None = None, observe: Observer | None = None,
             final: bool = False) -> torch.Tensor:
        """Compress this step's gradients g [W, d]; return the update [1, d] every worker applies. The
        compressor sees the raw gradient first (``observe_gradient``), whatever the memory then sends."""
        compressor.observe_gradient(g)
        return self._step(g, compressor, comm, step, layout, observe, final)

    @abstractmethod
    def _step(self, g: torch.Tensor, compressor: Compressor, comm: Communicator, step: int,
              layout: tuple[Layer, ...] | None, observe: Observer | None, final: bool) -> torch.Tensor:
        """This memory's rule for one step."""

    def residual(self) -> torch.Tensor | None:
        """What the memory kept after the last step (u − contribution), per local worker."""
        return None


class NoMemory(Memory):
    name = "none"

    def _step(self, g, compressor, comm, step, layout, observe, final):
        out = compressor.compress(g, comm, step, layout)
        if observe:
            observe(g, out)
        return out.aggregate


class EF14(Memory):
    name = "ef14"
    per_rank = ("error",)

    def __init__(self) -> None:
        self.error: torch.Tensor | None = None

    def _step(self, g, compressor, comm, step, layout, observe, final):
        first = self.error is None  # e = 0: u = g, compressed as it is (compressors never write to their input)
        u = g.float() if first else self.error.add_(g)  # u = g + e, in place
        out = compressor.compress(u, comm, step, layout)
        if observe:
            observe(u, out)
        if not final:
            if first and u is g:  # the memory owns its u (a measurement's g is shared by its compressors)
                u = u.clone()
            out.contribution.subtract_from(u)  # e ← u − C(u)
            self.error = u
        return out.aggregate

    def residual(self) -> torch.Tensor | None:
        return self.error


class EF21(Memory):
    name = "ef21"
    per_rank: tuple[str, ...] = ("h", "last_target")
    shared = ("h_mean",)

    def __init__(self) -> None:
        self.h: torch.Tensor | None = None
        self.h_mean: torch.Tensor | None = None
        self.last_target: torch.Tensor | None = None

    def target(self, g: torch.Tensor) -> torch.Tensor:
        return g.float()

    def _step(self, g, compressor, comm, step, layout, observe, final):
        v = self.last_target = self.target(g)
        if self.h is None:  # first step: dense, so h starts at the true gradient
            self.h = v.clone()
            self.h_mean = comm.all_reduce(self.h, tag="ef21-init")
            return self.h_mean.clone()
        u = v - self.h
        out = compressor.compress(u, comm, step, layout)
        if observe:
            observe(u, out)
        if not final:
            out.contribution.add_to(self.h)
        self.h_mean.add_(out.aggregate)
        return self.h_mean.clone()

    def residual(self) -> torch.Tensor | None:
        return None if self.h is None or self.last_target is None else self.last_target - self.h


class EF21M(EF21):
    name = "ef21m"
    per_rank = ("h", "last_target", "v")

    def __init__(self, eta: float = 0.1) -> None:
        super().__init__()
        if not 0 < eta <= 1:
            raise CompressionError(f"EF21M momentum η must be in (0, 1] (got {eta})")
        self.eta = eta
        self.v: torch.Tensor | None = None

    def target(self, g: torch.Tensor) -> torch.Tensor:
        if self.v is None:
            self.v = g.float().clone()
        else:
            self.v.mul_(1 - self.eta).add_(g, alpha=self.eta)
        return self.v


MEMORIES: dict[str, type[Memory]] = {m.name: m for m in (NoMemory, EF14, EF21, EF21M)}


def make_memory(name: str) -> Memory:
    if name not in MEMORIES:
        raise CompressionError(f"unknown memory {name!r}; choose one of {', '.join(MEMORIES)}")
    return MEMORIES[name]()
