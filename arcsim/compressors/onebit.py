"""1-bit Adam's compressed all-reduce (Tang et al. 2021) as DeepSpeed runs it (``NcclBackend.compressed_allreduce``,
called by ``OnebitAdam`` after its ``freeze_step``).

Per tensor (``scope="tensor"``, DeepSpeed's: it compresses every parameter's momentum on its own; ``"bucket"``: the
whole bucket as one tensor) of n elements, padded with zeros to D, a multiple of P·lcm(P, 8) (P ranks), cut into P
chunks of D/P, chunk j served by rank j:

1. *worker*: x ← x + worker error; scale s = ‖x‖₂ / √D; the signs (x ≥ 0 → +1, else −1) go packed, 1 bit each, by an
   ALL-TO-ALL (chunk j to rank j, tag ``signs``) and the scale by an all-gather (``scales``); the worker error becomes
   x − s·sign(x) (the padding included, as DeepSpeed's);
2. *server* (rank j, for chunk j): the mean of the P decompressed chunks (Σ_i s_i·sign_i / P), plus its server error;
   its scale ‖·‖₂/√(D/P), its signs and the new server error as the worker's;
3. the servers' signs (1 bit each, ``server-signs``) and scales (``server-scales``) are all-gathered, and every rank
   decompresses the whole tensor, the padding dropped.

A bucket's tensors travel in the same four collectives (chunk j of each tensor side by side in the message to rank
j; the scales of all its tensors in one all-gather), where DeepSpeed issues four per parameter tensor: the same
bytes, fewer latencies. Its error compensation is its own (worker and server error, zero at the first compressed
step): arcsim runs it with memory ``none`` (:func:`arcsim.catalog.memory_for`).

*Warm-up*: 1-bit Adam runs plain Adam, its gradients all-reduced dense, for its first ``freeze_step`` steps;
``warmup_steps`` does that (a dense fp32 all-reduce, tag ``warmup``) for steps below it. Its default is 0 because
``arcsim run`` measures a few steps of a trace, all of which would be warm-up; the time to a target of a job that warms
up is dense's time for those steps plus this compressor's for the rest.

What it compresses is what it is given: in ``run``, the hooks and ``train`` the gradient, the optimizer supplying the
momentum (1-bit Adam compresses Adam's momentum itself and freezes its variance, which arcsim does not model).
The aggregate is the mean over workers of each one's *contribution*: its decompressed message plus P times the change
of its server error on the chunk it serves (so the contributions average to what the servers sent). Its error is
measured against what that output approximates (``Compressed.reference``): the mean of the compensated inputs plus the
server errors owed, as an error-feedback memory's against the input it compensated; against the mean gradient alone
it would count the owed errors, which the compensation repays on later steps (their sum is exact: a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import (
    Compressed,
    Compressor,
    DenseContribution,
    check_scope,
    selection_groups,
)
from arcsim.compressors.layout import Layer
from arcsim.errors import CompressionError

_BITS = (128, 64, 32, 16, 8, 4, 2, 1)  # the first element in the highest bit, as numpy's and cupy's packbits


def pack_signs(nonnegative: torch.Tensor) -> torch.Tensor:
    """[..., 8m] booleans (x ≥ 0) → [..., m] uint8, eight to a byte."""
    weights = torch.tensor(_BITS, dtype=torch.uint8, device=nonnegative.device)
    bits = nonnegative.reshape(*nonnegative.shape[:-1], -1, 8).to(torch.uint8)
    return (bits * weights).sum(dim=-1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """[..., m] uint8 → [..., 8m] float32 of ±1 (a set bit is +1)."""
    weights = torch.tensor(_BITS, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) & weights) != 0
    return bits.reshape(*packed.shape[:-1], -1).float() * 2 - 1


def signs(t: torch.Tensor) -> torch.Tensor:
    """±1 as DeepSpeed decompresses: x ≥ 0 (zero included) → +1, else −1."""
    return (t >= 0).float() * 2 - 1


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a bucket sits: in the input (``offsets``, ``sizes``), padded to ``padded`` (a multiple of
    P·lcm(P, 8)) at ``starts`` of the padded vector, and as chunks of ``chunks`` at ``chunk_starts`` of a server's
    message."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    padded: tuple[int, ...]
    starts: tuple[int, ...]
    chunks: tuple[int, ...]
    chunk_starts: tuple[int, ...]
    ranks: int

    @classmethod
    def of(cls, groups: list[tuple[int, int]], ranks: int) -> Layout:
        unit = ranks * (ranks * 8 // math.gcd(ranks, 8))
        padded = tuple(math.ceil(n / unit) * unit for _, n in groups)
        chunks = tuple(p // ranks for p in padded)
        starts = tuple(sum(padded[:i]) for i in range(len(padded)))
        chunk_starts = tuple(sum(chunks[:i]) for i in range(len(chunks)))
        return cls(tuple(o for o, _ in groups), tuple(n for _, n in groups), padded, starts, chunks, chunk_starts,
                   ranks)

    @property
    def total(self) -> int:
        return sum(self.padded)

    @property
    def chunk(self) -> int:
        """Elements one server serves: its chunk of every tensor."""
        return sum(self.chunks)

    def per_element(self, per_tensor: torch.Tensor, chunked: bool) -> torch.Tensor:
        """[..., tensors] → [..., elements]: each tensor's value repeated over its padded elements or its chunk."""
        counts = torch.tensor(self.chunks if chunked else self.padded, device=per_tensor.device)
        return per_tensor.repeat_interleave(counts, dim=-1)

    def norms(self, t: torch.Tensor, chunked: bool) -> torch.Tensor:
        """[W, tensors]: ‖piece‖₂ / √(piece length) of each tensor's piece of ``t`` [W, padded or chunk]."""
        starts, sizes = (self.chunk_starts, self.chunks) if chunked else (self.starts, self.padded)
        return torch.stack([t[:, s:s + n].norm(dim=1) / math.sqrt(n) for s, n in zip(starts, sizes, strict=True)],
                           dim=1)

    def to_servers(self, t: torch.Tensor) -> torch.Tensor:
        """[W, padded] → [W, P, chunk]: the message to each server, its chunk of every tensor side by side."""
        return torch.cat([t[:, s:s + p].reshape(t.shape[0], self.ranks, c)
                          for s, p, c in zip(self.starts, self.padded, self.chunks, strict=True)], dim=2)

    def from_servers(self, t: torch.Tensor) -> torch.Tensor:
        """[W, P, chunk] → [W, padded]: the inverse of :meth:`to_servers`."""
        return torch.cat([t[:, :, s:s + c].reshape(t.shape[0], -1)
                          for s, c in zip(self.chunk_starts, self.chunks, strict=True)], dim=1)

    def unpad(self, t: torch.Tensor, d: int) -> torch.Tensor:
        """[W, padded] → [W, d]: each tensor's elements back at its offset."""
        out = torch.zeros(t.shape[0], d, dtype=t.dtype, device=t.device)
        for o, n, s in zip(self.offsets, self.sizes, self.starts, strict=True):
            out[:, o:o + n] = t[:, s:s + n]
        return out

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[W, d] → [W, padded]: each tensor at its padded start, zeros after it."""
        out = torch.zeros(x.shape[0], self.total, dtype=torch.float32, device=x.device)
        for o, n, s in zip(self.offsets, self.sizes, self.starts, strict=True):
            out[:, s:s + n] = x[:, o:o + n]
        return out


def local_ranks(comm: Communicator, w: int) -> list[int]:
    """The global rank of each of the ``w`` local rows (the first rank a row holds)."""
    rows: dict[int, int] = {}
    for r in range(comm.world_size):
        row = comm.local_index(r)
        if row is not None and row not in rows:
            rows[row] = r
    return [rows.get(row, row) for row in range(w)]


class OneBit(Compressor):
    name = "onebit"

    def __init__(self, density: float = 0.01, seed: int = 0, scope: str = "tensor", warmup_steps: int = 0) -> None:
        super().__init__(density, seed)
        self.scope = check_scope(scope)
        if not (isinstance(warmup_steps, int) and warmup_steps >= 0):
            raise CompressionError(f"onebit's warmup_steps (DeepSpeed's freeze_step) must be a whole number ≥ 0 (got "
                                   f"{warmup_steps})")
        self.warmup_steps = warmup_steps
        self._errors: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def errors(self, lay: Layout, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(worker error [W, padded], server error [W, chunk]): zero at the first compressed step, as DeepSpeed's."""
        key = (w, lay)
        if key not in self._errors:
            self._errors[key] = (torch.zeros(w, lay.total, device=device), torch.zeros(w, lay.chunk, device=device))
        return self._errors[key]

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        w, d = x.shape
        everything = torch.full((w,), d, device=x.device)
        if step < self.warmup_steps:  # 1-bit Adam's warm-up: plain Adam, gradients all-reduced dense
            return Compressed(comm.all_reduce(x.float(), tag="warmup"), DenseContribution(x), everything, False)
        p = comm.world_size
        lay = Layout.of(selection_groups(d, layout, self.scope), p)
        worker_error, server_error = self.errors(lay, w, x.device)
        # 1. the worker: error-compensated signs × ‖x‖/√D
        mine = lay.pad(x).add_(worker_error)
        scale = lay.norms(mine, chunked=False)  # [W, tensors]
        sent = signs(mine) * lay.per_element(scale, chunked=False)
        worker_error.copy_(mine - sent)
        received = comm.all_to_all(pack_signs(lay.to_servers(mine >= 0)), tag="signs")  # [W, P, chunk/8]
        scales = comm.all_gather(scale, tag="scales")[0]  # [P, tensors]
        # 2. the server: the mean of the P decompressed chunks, its own error added, compressed again
        served = (unpack_signs(received) * (lay.per_element(scales, chunked=True) / p)).sum(dim=1)  # [W, chunk]
        served.add_(server_error)
        server_scale = lay.norms(served, chunked=True)
        before = server_error.clone()
        server_error.copy_(served - signs(served) * lay.per_element(server_scale, chunked=True))
        # 3. every server's signs and scales to everyone
        back = comm.all_gather(pack_signs(served >= 0), tag="server-signs")[0]  # [P, chunk/8]
        back_scales = comm.all_gather(server_scale, tag="server-scales")[0]  # [P, tensors]
        whole = unpack_signs(back) * lay.per_element(back_scales, chunked=True)  # [P, chunk]
        aggregate = lay.unpad(lay.from_servers(whole.unsqueeze(0)), d)
        # each worker's contribution: its message, and P × what its serving moved into or out of its server error
        moved = torch.zeros(w, p, lay.chunk, device=x.device)
        for row, rank in enumerate(local_ranks(comm, w)):
            moved[row, rank] = (before[row] - server_error[row]) * p
        contribution = lay.unpad(sent + lay.from_servers(moved), d)
        reference = None  # what the servers' output approximates: the compensated input and the server errors owed
        if w == p:  # every worker here (in-process): rank j serves chunk j
            reference = lay.unpad(mine.mean(dim=0, keepdim=True) + lay.from_servers(before.unsqueeze(0)), d)
        return Compressed(aggregate, DenseContribution(contribution), everything, index_based=False,
                          reference=reference)
