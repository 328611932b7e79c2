"""Quantised reduce-scatters (FSDP's and ZeRO++'s gradient path) as compressors of the data-parallel contract.

FSDP reduce-scatters each unit's gradients and keeps its shard; a compressor here does that on the Communicator
(:meth:`arcsim.comm.Communicator.reduce_scatter`) and then all-gathers the reduced shards, so that every rank holds
the mean as DDP's compressors give it. The gather is fp32 by default (lossless: the error is the reduce-scatter's
alone, what :mod:`arcsim.sharding.quant` measures and FSDP's sharded optimizer step sees); ``gather="quantised"``
re-quantises each rank's reduced shard in the compressor's format for the all-gather — the re-quantising
reduce-scatter/all-gather: about 2·d·bits/8 bytes per rank in all, at the price of a second rounding.

- ``rs-bf16``: each rank's gradient in bf16 on the wire, summed in fp32 by the receiver;
- ``rs-int8``: blockwise int8 (one fp32 scale per QUANT_BLOCK elements), quantised once at the sender, decoded and
  summed in fp32 by the shard's owner — ZeRO++'s one-hop all-to-all reduce-scatter;
- ``qgz`` / ``qgz4``: ZeRO++'s qgZ, int8 or int4: quantised, reduce-scattered inside each node, the node's partial
  sum of its 1/G shard quantised again and reduce-scattered across the nodes (a rail per local rank);
- ``rs-int8-ring``: an int8 *ring* reduce-scatter, the running sum re-quantised at each of its P−1 hops.

Each worker's contribution (what error feedback subtracts) is its gradient as it first sent it, quantised once;
qgZ's second level and the ring's hops re-quantise partial sums that no one worker contributed, so their aggregate
is the mean of the contributions only to within that rounding (a code step of the largest partial sum, over P).

The vector is padded with zeros to a whole number of blocks per rank (FSDP pads too), so a chunk is whole blocks and
its blockwise quantisation is the whole vector's. The math here is the one home of the blockwise quantisation:
:mod:`arcsim.sharding.quant` measures its reductions by running these compressors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import ClassVar, Protocol

import numpy as np
import torch

from arcsim.catalog import QUANT_BLOCK
from arcsim.comm import Communicator
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.base import Compressed, Compressor, DenseContribution, check_input
from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError, CompressionError

GATHERS = ("fp32", "quantised")


def blockwise(x: torch.Tensor, block: int = QUANT_BLOCK, bits: int = 8) -> torch.Tensor:
    """``x`` (…, n) quantised to ``bits``-bit signed integers (symmetric, ±(2^(bits−1)−1)) per block of
    ``block`` elements with a fp32 absmax scale, and back."""
    n = x.shape[-1]
    pad = (-n) % block
    q, scale = _quantise(torch.nn.functional.pad(x.float(), (0, pad)), block, bits)
    return (q.float() * scale).reshape(*x.shape[:-1], -1)[..., :n]


def _quantise(x: torch.Tensor, block: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (int8, …, n/block, block) and scales (fp32, …, n/block, 1) of ``x`` (…, n), n a multiple of block."""
    top = 2 ** (bits - 1) - 1
    flat = x.float().reshape(*x.shape[:-1], -1, block)
    scale = flat.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / top
    return torch.round(flat / scale).clamp(-top, top).to(torch.int8), scale


@dataclass(frozen=True)
class Codec:
    """How a chunk travels: ``encode`` (…, c) fp32 → (…, bytes) payload, ``decode`` back to fp32."""

    bits: int  # 16: bf16; 8 or 4: blockwise integers with a fp32 scale per block
    block: int = QUANT_BLOCK

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits == 16:
            return x.to(torch.bfloat16)
        q, scale = _quantise(x, self.block, self.bits)
        codes = q.reshape(*x.shape[:-1], -1)
        if self.bits == 4:  # two codes a byte: code + 8 in 1…15, the even element in the low nibble
            u = (codes + 8).to(torch.uint8)
            codes = u[..., 0::2] | (u[..., 1::2] << 4)
        scales = scale.reshape(*x.shape[:-1], -1).contiguous().view(torch.uint8)
        return torch.cat([codes.view(torch.uint8), scales], dim=-1)

    def decode(self, payload: torch.Tensor) -> torch.Tensor:
        if self.bits == 16:
            return payload.float()
        per_byte = 2 if self.bits == 4 else 1
        size = payload.shape[-1]
        n = size * per_byte * self.block // (self.block + 4 * per_byte)  # size = n/per_byte + 4·n/block
        raw = payload[..., :n // per_byte]
        if self.bits == 4:
            codes = torch.stack([(raw & 15).to(torch.int8) - 8, (raw >> 4).to(torch.int8) - 8], dim=-1).flatten(-2)
        else:
            codes = raw.view(torch.int8)
        scales = payload[..., n // per_byte:].contiguous().view(torch.float32)
        return (codes.float().reshape(*codes.shape[:-1], -1, self.block) * scales.unsqueeze(-1)).flatten(-2)

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (…, n) as it arrives (any n: the last block padded with zeros)."""
        return x.to(torch.bfloat16).float() if self.bits == 16 else blockwise(x, self.block, self.bits)


class ShardedReduction(Compressor):
    """A reduce-scatter of the gradient in ``codec``'s format, then an all-gather of the reduced shards."""

    way: ClassVar[str]    # the name arcsim.sharding.quant gives this reduction
    codec: ClassVar[Codec]

    def __init__(self, density: float = 0.01, seed: int = 0, gather: str = "fp32") -> None:
        super().__init__(density, seed)
        if gather not in GATHERS:
            raise CompressionError(f"unknown gather {gather!r}; choose fp32 (lossless, the reduce-scatter's error "
                                   "alone) or quantised (the reduced shard re-quantised for the all-gather)")
        self.gather = gather

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        check_input(x)
        w, d = x.shape
        agg = self.aggregate(x, comm)
        sent = self.codec.roundtrip(x)  # what each worker sent first (blockwise: the padding changes nothing)
        full = torch.full((w,), d, device=x.device)
        return Compressed(agg, DenseContribution(sent), full, index_based=False)

    def aggregate(self, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        """[1, d]: the mean every rank holds after the reduce-scatter and the all-gather."""
        d = x.shape[1]
        unit = comm.world_size * self.codec.block
        xp = torch.nn.functional.pad(x.float(), (0, math.ceil(d / unit) * unit - d))
        shard, order = self.reduce(xp, comm)  # [W, n/P]: each local worker's reduced shard; order: whose is where
        del xp
        if self.gather == "quantised":
            got = self.codec.decode(comm.all_gather(self.codec.encode(shard), tag="shard"))
        else:
            got = comm.all_gather(shard, tag="shard")
        return got[0:1, order].reshape(1, -1)[:, :d].contiguous()

    def reduce(self, xp: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        """Each local worker's shard of the mean [W, n/P] (world rank r holds chunk r), and the world ranks in the
        order of the chunks they hold."""
        w, p = xp.shape[0], comm.world_size
        payload = self.codec.encode(xp.reshape(w, p, -1))
        return comm.reduce_scatter(payload, "mean", "values", decode=self.codec.decode), torch.arange(p)


class RsBf16(ShardedReduction):
    name = "rs-bf16"
    way = "bf16"
    codec = Codec(16)


class RsInt8(ShardedReduction):
    name = "rs-int8"
    way = "int8"
    codec = Codec(8)


class RsInt8Ring(ShardedReduction):
    name = "rs-int8-ring"
    way = "int8-ring"
    codec = Codec(8)

    def reduce(self, xp: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        w, p = xp.shape[0], comm.world_size
        shard = comm.reduce_scatter(xp.reshape(w, p, -1), "mean", "values", decode=self.codec.decode,
                                    encode=self.codec.encode)
        return shard, torch.arange(p)


class Qgz(ShardedReduction):
    """qgZ: in the node, then across. ``gpus_per_node`` G: how the P workers stand as nodes (None: two nodes of
    P/2, as :func:`arcsim.sharding.quant.trace_errors` takes a trace's workers); a level of one rank is done where
    the data is (nothing sent, the arithmetic the same)."""

    name = "qgz"
    way = "int8-hier"
    codec = Codec(8)

    def __init__(self, density: float = 0.01, seed: int = 0, gather: str = "fp32",
                 gpus_per_node: int | None = None) -> None:
        super().__init__(density, seed, gather)
        if gpus_per_node is not None and gpus_per_node < 1:
            raise CompressionError(f"gpus_per_node must be ≥ 1 (got {gpus_per_node})")
        self.gpus_per_node = gpus_per_node

    def reduce(self, xp: torch.Tensor, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        w, p = xp.shape[0], comm.world_size
        g = self.gpus_per_node or max(p // 2, 1)
        if p % g:
            raise CompressionError(f"{p} workers are no whole number of {g}-GPU nodes")
        nodes = p // g
        # a level of one group is the communicator itself (no subgroups: under torch.distributed a group of a
        # group, a node-aware hook's rail, cannot make its own, since new_group needs every rank of the job)
        node, inter = (comm, comm) if g in (1, p) else comm.subgroups(g)
        c = self.codec
        # in the node: local rank l receives chunk l (1/G) of its node's sum
        part = (c.roundtrip(xp) if g == 1 else
                node.reduce_scatter(c.encode(xp.reshape(w, g, -1)), "sum", "values", decode=c.decode))
        # across the nodes, on a rail: node j's rank l receives piece j of chunk l (1/P) of the total
        total = (c.roundtrip(part) if nodes == 1 else
                 inter.reduce_scatter(c.encode(part.reshape(w, nodes, -1)), "sum", "values", decode=c.decode))
        # world rank r = j·G + l holds piece l·N + j: the world's all-gather lists ranks, the vector pieces
        ranks = torch.arange(p).reshape(nodes, g).T.reshape(-1)
        return total / p, ranks


class Qgz4(Qgz):
    name = "qgz4"
    way = "int4-hier"
    codec = Codec(4)


SHARDED: tuple[type[ShardedReduction], ...] = (RsBf16, RsInt8, Qgz, RsInt8Ring, Qgz4)
BY_WAY: dict[str, type[ShardedReduction]] = {cls.way: cls for cls in SHARDED}


REDUCTIONS = ("bf16", "int8", "int8-hier", "int8-ring", "int4-hier")


def reduce_mean(grads: torch.Tensor, way: str, gpus_per_node: int) -> torch.Tensor:
    """The mean of ``grads`` (workers × elements) as reduction ``way`` computes it: its compressor on the workers
    stacked in one process, the fp32 all-gather (every rank's copy of the mean)."""
    if way not in REDUCTIONS:
        raise ArcsimError(f"unknown reduction {way!r}; choose among {', '.join(REDUCTIONS)}")
    if way in ("int8-hier", "int4-hier") and grads.shape[0] % gpus_per_node:
        raise ArcsimError(f"{grads.shape[0]} workers are no whole number of {gpus_per_node}-GPU nodes")
    cls = BY_WAY[way]
    comp = cls(gpus_per_node=gpus_per_node) if issubclass(cls, Qgz) else cls()
    return comp.aggregate(grads, InProcessComm(grads.shape[0]))[0]


@dataclass(frozen=True)
class ReductionError:
    how: str
    steps: int
    workers: int
    gpus_per_node: int
    rel_error_mean: float
    rel_error_max: float

    def to_dict(self) -> dict:
        return asdict(self)


STEP_PIECE_ELEMENTS = 1 << 23  # a step measured in column pieces of about this many columns (whole blocks per rank)


def step_piece(workers: int) -> int:
    """Columns of one piece of a step: whole QUANT_BLOCK blocks on each of ``workers`` ranks, so that a piece's
    blockwise quantisation is the whole vector's (bf16, int8 and qgZ alike; the int8 ring re-quantises each block
    in the order of the rank that owns it, which differs by piece: the same rounding, another order). About
    STEP_PIECE_ELEMENTS whatever the workers, so a piece of every worker is O(workers × STEP_PIECE_ELEMENTS)."""
    unit = QUANT_BLOCK * workers
    return max(1, STEP_PIECE_ELEMENTS // unit) * unit


def reduction_errors(steps: Iterable[torch.Tensor | Iterable[torch.Tensor]], gpus_per_node: int,
                     ways: tuple[str, ...] = REDUCTIONS) -> list[ReductionError]:
    """The aggregate error of each way of reducing, over the steps: each step workers × elements, or an iterable of
    its column pieces (each ``step_piece(workers)`` wide but the last: memory O(workers × piece), not the step)."""
    errors: dict[str, list[float]] = {w: [] for w in ways}
    workers = 0
    for step in steps:
        err2 = dict.fromkeys(ways, 0.0)
        ref2 = 0.0
        for piece in ([step] if isinstance(step, torch.Tensor) else step):
            grads = piece.float()
            workers = grads.shape[0]
            exact = grads.mean(0)
            ref2 += float(exact.pow(2).sum())
            for w in ways:
                err2[w] += float((reduce_mean(grads, w, gpus_per_node) - exact).pow(2).sum())
        if ref2 == 0:
            continue
        for w in ways:
            errors[w].append(err2[w] / ref2)
    if not any(errors.values()):
        raise ArcsimError("the trace has no step with a non-zero mean gradient to measure an error against")
    return [ReductionError(w, len(e), workers, gpus_per_node, sum(e) / len(e), max(e)) for w, e in errors.items()]


MIN_SAMPLED_UNITS = 256  # a step's units sampled_pieces keeps, at least (in expectation)


def sampled_pieces(steps: Iterable[torch.Tensor | Iterable[torch.Tensor]], workers: int, share: float,
                   seed: int = 0, elements: int = 0) -> Iterator[Iterator[torch.Tensor]]:
    """Each step as :func:`reduction_errors` reads it, of a random ``share`` of its units — QUANT_BLOCK columns on each
    of the ``workers`` ranks, side by side — joined into pieces of whole units: every block is quantised and reduced
    as in the whole step (each way's rounding is its block's own; the int8 ring's order of ranks is another), so the
    error Σ err² / Σ ref² over the units kept estimates the step's. The share is raised to keep MIN_SAMPLED_UNITS of a
    step of ``elements`` (many workers make few, wide units). A step's last part short of a unit is left out."""
    unit = QUANT_BLOCK * workers
    if elements:
        share = min(1.0, max(share, MIN_SAMPLED_UNITS * unit / elements))
    for index, step in enumerate(steps):
        rng = np.random.default_rng([seed, index])
        yield _joined((piece[:, _kept_columns(piece.shape[1] // unit, unit, share, rng)]
                       for piece in ([step] if isinstance(step, torch.Tensor) else step)), step_piece(workers))


def _kept_columns(units: int, unit: int, share: float, rng: np.random.Generator) -> torch.Tensor:
    picks = np.flatnonzero(rng.random(units) < share)
    return torch.from_numpy((picks[:, None] * unit + np.arange(unit)).reshape(-1))


def _joined(parts: Iterable[torch.Tensor], width: int) -> Iterator[torch.Tensor]:
    """``parts`` (columns side by side) as pieces of about ``width`` columns (each whole parts, the last shorter)."""
    held: list[torch.Tensor] = []
    columns = 0
    for part in parts:
        if part.shape[1]:
            held.append(part)
            columns += part.shape[1]
        if columns >= width:
            yield torch.cat(held, dim=1)
            held, columns = [], 0
    if held:
        yield torch.cat(held, dim=1)


class ReadsColumns(Protocol):
    """A stored trace (arcsim.traces.format.Trace) as :func:`trace_pieces` reads it."""

    @property
    def steps(self) -> int: ...
    @property
    def workers(self) -> int: ...
    def step_chunks(self, index: int, chunk: int = ...) -> Iterator[torch.Tensor]: ...


def trace_pieces(trace: ReadsColumns) -> Iterator[Iterator[torch.Tensor]]:
    """A stored trace's steps, each as its column pieces for :func:`reduction_errors` (read piece by piece)."""
    for index in range(trace.steps):
        yield trace.step_chunks(index, step_piece(trace.workers))
