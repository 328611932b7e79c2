"""Quantisers: every element travels in a few bits, each worker's bucket as one packed all-gather.

- ``qsgd`` (Alistarh et al. 2017): s = ``levels`` levels (default 127, as the GRACE suite: a signed level fits an
  int8). With n = ‖x‖₂ of the whole tensor compressed (a DDP bucket, or what ``arcsim compress`` hands over; with
  ``block`` = d, of each d consecutive elements, the paper's bucketing, each norm sent as fp32) and
  r = |x_j|/n·s, element j is sent as sign(x_j)·(⌊r⌋ + b_j), b_j = 1 with probability r − ⌊r⌋ (stochastic rounding),
  and decoded as sign·level·n/s. Unbiased: E[C(x)] = x. Sent: one int8 per element (int16 above 127 levels, as an
  int8 no longer holds them) and n as fp32.
- ``terngrad`` (Wen et al. 2017): the tensor is first clipped to ±c·σ (σ its standard deviation about its mean,
  c = ``clip``, 2.5 as the paper's experiments and GRACE's code; ``clip=0``: no clipping); then with
  s = max|g| each element is sent as sign(g_j)·s with probability |g_j|/s, else 0. Unbiased for the clipped g
  (for x itself with ``clip=0``). Sent: 2 bits per element (0, +1, −1; four to a byte) and s as fp32.
- ``natural`` (Horváth et al. 2019): |x_j| in [2^e, 2^(e+1)) is rounded to 2^(e+1) with probability |x_j|/2^e − 1,
  else to 2^e, keeping its sign. Unbiased. The paper's 9 bits (sign and fp32's 8-bit exponent) fit in 8 here:
  the sign and a 7-bit offset below the tensor's top exponent T = ⌊log2 max|x|⌋ + 1, sent once as an int32
  (offsets 0…126; 127 codes a zero). A magnitude below the smallest power it can code, 2^(T−126), is rounded to
  that power with probability |x_j|/2^(T−126), else to 0: still unbiased, and 2^126 below the largest element.

None of them sums as it is sent, so, as the benchmark suites run them, each worker's payload (its header, then
its packed codes, in one uint8 message: one latency) is all-gathered and every worker decodes all P payloads and
averages them. The comm log records the payload's real size: 4 + ⌈d·bits/8⌉ bytes per rank (qsgd in blocks: 4 more
per block).

The random draws of worker ``rank`` at ``step`` come from a generator seeded by (seed, step, rank)
(:meth:`PackedCompressor.uniforms`): the same in-process and under torch.distributed, different on every worker
and step. Each worker's row is encoded on its own (O(d) scratch; identical arithmetic whichever communicator).
No error feedback by default (the catalog's ``default_memory`` is ``none``): they are unbiased.
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from typing import ClassVar

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, DenseContribution
from arcsim.compressors.layout import Layer
from arcsim.errors import CompressionError

HEADER_BYTES = 4  # one fp32 (a scale, a norm) or int32 (natural's top exponent) before each worker's codes
TAG = "values+scale"  # the one all-gather of every quantiser and sign compressor


def packed_bytes(d: int, bits: int) -> int:
    """Bytes ``d`` codes of ``bits`` bits take packed (8 // bits to a byte)."""
    return -(-d * bits // 8)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [n] (each < 2^bits, bits in 1, 2, 4, 8) packed 8 // bits to a byte, the first in the low bits."""
    if bits == 8:
        return codes.to(torch.uint8)
    per = 8 // bits
    n = codes.numel()
    padded = torch.zeros(packed_bytes(n, bits) * per, dtype=torch.uint8, device=codes.device)
    padded[:n] = codes
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return torch.bitwise_left_shift(padded.view(-1, per), shifts).sum(dim=1, dtype=torch.uint8)  # bits apart: no carry


def unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``n`` uint8 codes :func:`pack` packed."""
    if bits == 8:
        return packed[:n]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    return torch.bitwise_right_shift(packed.unsqueeze(1), shifts).bitwise_and_(mask).view(-1)[:n]


@functools.lru_cache(maxsize=64)
def byte_table(bits: int, values: tuple[float, ...], device: str) -> torch.Tensor:
    """[256, 8 // bits] float32: what each byte of packed codes decodes to, code c standing for ``values[c]``."""
    per = 8 // bits
    codes = torch.arange(256).unsqueeze(1).bitwise_right_shift(torch.arange(0, 8, bits)).bitwise_and(
        (1 << bits) - 1)
    return torch.tensor(values, dtype=torch.float32)[codes].reshape(256, per).to(device)


def expand(body: torch.Tensor, bits: int, values: tuple[float, ...], d: int) -> torch.Tensor:
    """The ``d`` packed codes of ``body`` as the floats ``values`` gives them. On a CPU one lookup per byte of a
    [256, 8 // bits] table; on a GPU that gather reads 32-byte rows at random (1.9 ms for 25.6 M signs on an
    H200, a tenth of its bandwidth), so the codes are unpacked by shifts and looked up one float each."""
    if body.device.type == "cuda":
        return lookup(value_table(values, str(body.device)), unpack(body, bits, d))
    return lookup(byte_table(bits, values, str(body.device)), body).view(-1)[:d]


@functools.lru_cache(maxsize=64)
def value_table(values: tuple[float, ...], device: str) -> torch.Tensor:
    """``values`` as a float32 tensor on ``device``: what each code stands for."""
    return torch.tensor(values, dtype=torch.float32, device=device)


def lookup(table: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
    """``table``'s row for each byte of the 1-D ``body`` (index_select: 3-4× a fancy index's speed on a CPU)."""
    return torch.index_select(table, 0, body.int())


def local_ranks(comm: Communicator, workers: int) -> list[int]:
    """The global rank of each of the ``workers`` local rows (in-process: 0…P−1; one process: its rank)."""
    ranks: list[int | None] = [None] * workers
    for r in range(comm.world_size):
        i = comm.local_index(r)
        if i is not None and i < workers and ranks[i] is None:
            ranks[i] = r
    return [r if r is not None else i for i, r in enumerate(ranks)]


class PackedCompressor(Compressor):
    """A compressor whose workers each send a header and packed codes by one all-gather; every worker decodes
    all P payloads (:meth:`combine`: their mean by default). Density-free: ``density`` is accepted and unused."""

    header_dtype: ClassVar[torch.dtype] = torch.float32

    @abstractmethod
    def body_bytes(self, d: int) -> int:
        """Bytes of one worker's packed codes for ``d`` elements."""

    @abstractmethod
    def encode(self, row: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One worker's 1-D float32 ``row`` → (its header, a 1-element tensor of header_dtype; its packed codes)."""

    @abstractmethod
    def decode(self, header: torch.Tensor, body: torch.Tensor, d: int) -> torch.Tensor:
        """A payload's header and packed codes → the [d] float32 values they stand for."""

    def uniforms(self, step: int, rank: int, n: int, device: torch.device) -> torch.Tensor:
        """Worker ``rank``'s ``n`` draws from U[0, 1) at ``step``, seeded by (seed, step, rank)."""
        gen = torch.Generator(device=device).manual_seed(hash((self.seed, step, rank)) & 0x7FFF_FFFF_FFFF_FFFF)
        return torch.rand(n, generator=gen, device=device)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        """What is encoded, [W, d] (Signum: each worker's momentum); default ``x`` itself."""
        return x

    def payloads(self, x: torch.Tensor, step: int, ranks: list[int]) -> torch.Tensor:
        """[W, HEADER_BYTES + body_bytes(d)] uint8: every local worker's header and packed codes."""
        w, d = x.shape
        out = torch.empty(w, HEADER_BYTES + self.body_bytes(d), dtype=torch.uint8, device=x.device)
        for i in range(w):
            header, body = self.encode(x[i].float(), step, ranks[i])
            out[i, :HEADER_BYTES] = header.reshape(1).to(self.header_dtype).view(torch.uint8)
            out[i, HEADER_BYTES:] = body
        return out

    def split(self, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One payload row → (header [1] of header_dtype, body bytes)."""
        return payload[:HEADER_BYTES].clone().view(self.header_dtype), payload[HEADER_BYTES:]

    def combine(self, gathered: torch.Tensor, d: int, local: dict[int, int], contribution: torch.Tensor
                ) -> torch.Tensor:
        """[1, d]: the mean of every peer's decoded payload (``gathered`` [P, bytes]); the decoded payload of each
        local worker (peer p is local row ``local[p]``) is written into ``contribution``."""
        acc = torch.zeros(d, dtype=torch.float32, device=gathered.device)
        for p in range(gathered.shape[0]):
            values = self.decode(*self.split(gathered[p]), d)
            if p in local:
                contribution[local[p]] = values
            acc += values
        return acc.div_(gathered.shape[0]).unsqueeze(0)

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        w, d = x.shape
        ranks = local_ranks(comm, w)
        gathered = comm.all_gather(self.payloads(self.target(x), step, ranks), tag=TAG)[0]
        local = {r: i for i, r in enumerate(ranks)}
        contribution = torch.zeros(w, d, dtype=torch.float32, device=x.device)
        agg = self.combine(gathered, d, local, contribution)
        full = torch.full((w,), d, device=x.device)
        return Compressed(agg, DenseContribution(contribution), full, index_based=False)


class QSGD(PackedCompressor):
    """Alistarh et al.'s quantiser. ``block`` 0: one norm for the whole bucket (as GRACE quantises a tensor); d > 0:
    one norm per d consecutive elements (the paper's bucket size d, 512 in its runs), each an fp32 before the codes,
    so a bucket that holds layers of very different scales keeps the small ones (one norm over LLaMA-1B's buckets
    left a relative error of about 12)."""

    name = "qsgd"

    def __init__(self, density: float = 0.01, seed: int = 0, levels: int = 127, block: int = 0) -> None:
        super().__init__(density, seed)
        if int(levels) != levels or not 1 <= levels <= 32767:
            raise CompressionError(f"QSGD levels s must be an integer in [1, 32767] (got {levels}); 127 sends one "
                                   "int8 per element")
        if int(block) != block or block < 0:
            raise CompressionError(f"QSGD block must be a whole number of elements ≥ 0 (got {block}); 0 takes one "
                                   "norm for the whole bucket, the paper's runs 512")
        self.levels, self.block = int(levels), int(block)
        self.code_dtype = torch.int8 if self.levels <= 127 else torch.int16

    def blocks(self, d: int) -> int:
        """Norms sent in the body for ``d`` elements (0: the header's one norm is the bucket's)."""
        return -(-d // self.block) if self.block else 0

    def body_bytes(self, d: int) -> int:
        return 4 * self.blocks(d) + d * (1 if self.code_dtype == torch.int8 else 2)

    def encode(self, row: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        d, norm = row.numel(), row.norm()
        if not self.block:
            if self.whole_norms is not None:  # a sample of the bucket: its elements rounded as the bucket's are
                norm = self.whole_norms[rank].to(row.dtype)
            if float(norm) == 0:
                return norm.reshape(1), torch.zeros(self.body_bytes(d), dtype=torch.uint8, device=row.device)
            return norm.reshape(1), self.codes(row, row.abs() / norm, step, rank).view(torch.uint8)
        padded = torch.nn.functional.pad(row, (0, self.blocks(d) * self.block - d))
        norms = padded.view(-1, self.block).norm(dim=1)
        each = norms.repeat_interleave(self.block)[:d]
        codes = self.codes(row, torch.where(each > 0, row.abs() / each, 0.0), step, rank)
        return norm.reshape(1), torch.cat([norms.float().view(torch.uint8), codes.view(torch.uint8)])

    def codes(self, row: torch.Tensor, ratio: torch.Tensor, step: int, rank: int) -> torch.Tensor:
        """The signed levels of ``row`` given each element's |x|/n (``ratio``), stochastically rounded."""
        scaled = ratio * self.levels  # r in [0, s]
        level = scaled.floor()
        level += self.uniforms(step, rank, row.numel(), row.device) < scaled - level  # up with probability r − ⌊r⌋
        level.clamp_(max=self.levels)  # r a rounding above s (|x_j| = n, less an ulp) must not wrap the int8
        return (level * row.sign()).to(self.code_dtype)

    def decode(self, header: torch.Tensor, body: torch.Tensor, d: int) -> torch.Tensor:
        head = 4 * self.blocks(d)
        codes = body[head:]
        levels = codes.clone().view(self.code_dtype) if self.code_dtype != torch.int8 else codes.view(torch.int8)
        if not self.block:
            return levels.float() * (header[0] / self.levels)
        norms = body[:head].clone().view(torch.float32)
        return levels.float() * (norms.repeat_interleave(self.block)[:d] / self.levels)


TERNARY_BITS = 2  # codes 0 (zero), 1 (+s), 2 (−s)
TERNARY_VALUES = (0.0, 1.0, -1.0, 0.0)  # what each code stands for, in units of s (3 is never sent)


class TernGrad(PackedCompressor):
    name = "terngrad"

    def __init__(self, density: float = 0.01, seed: int = 0, clip: float = 2.5) -> None:
        super().__init__(density, seed)
        if not clip >= 0:
            raise CompressionError(f"TernGrad clip c must be ≥ 0 standard deviations (got {clip}); 0 turns it off")
        self.clip = float(clip)

    def body_bytes(self, d: int) -> int:
        return packed_bytes(d, TERNARY_BITS)

    def clipped(self, row: torch.Tensor) -> torch.Tensor:
        """``row`` clipped to ±clip·σ (σ about the mean, over the whole tensor); ``row`` itself with clip 0."""
        if not self.clip:
            return row
        bound = float(self.clip * (row - row.mean()).pow(2).mean().sqrt())
        return row.clamp(-bound, bound)

    def encode(self, row: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.clipped(row)
        mag = g.abs()
        scale = mag.max()
        if float(scale) > 0:
            kept = self.uniforms(step, rank, row.numel(), row.device) < mag / scale  # with probability |g|/s (0: never)
            codes = kept.to(torch.uint8) << (g < 0).to(torch.uint8)  # 1: +s, 2: −s
        else:
            codes = torch.zeros(row.numel(), dtype=torch.uint8, device=row.device)
        return scale.reshape(1), pack(codes, TERNARY_BITS)

    def decode(self, header: torch.Tensor, body: torch.Tensor, d: int) -> torch.Tensor:
        return expand(body, TERNARY_BITS, TERNARY_VALUES, d) * header[0]


NATURAL_ZERO = 127  # the offset code of an exact (or rounded-down) zero
NATURAL_SPAN = 126  # offsets 0…126 below the top exponent
SIGN_BIT = 0x80


class Natural(PackedCompressor):
    name = "natural"
    header_dtype = torch.int32

    def body_bytes(self, d: int) -> int:
        return d

    def encode(self, row: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        mag = row.abs()
        top = torch.frexp(mag.max()).exponent  # ⌊log2 max⌋ + 1: max|x| < 2^top
        mant, exp = torch.frexp(mag)  # |x| = m·2^exp, m in [0.5, 1): |x| in [2^(exp−1), 2^exp)
        u = self.uniforms(step, rank, row.numel(), row.device)
        lowest = top - NATURAL_SPAN  # the smallest power it codes, 2^lowest
        up = u < 2 * mant - 1  # |x|/2^e − 1 with e = exp − 1
        power = exp - 1 + up.to(exp.dtype)  # the exponent rounded to
        offset = top - power
        tiny = exp - 1 < lowest  # below 2^lowest: to 2^lowest with probability |x|/2^lowest, else to zero
        tiny_up = u < torch.ldexp(mant, exp - lowest)
        offset = torch.where(tiny, torch.where(tiny_up, NATURAL_SPAN, NATURAL_ZERO), offset)
        offset = torch.where(mag == 0, NATURAL_ZERO, offset)
        codes = offset.to(torch.uint8) | torch.where(torch.signbit(row) & (offset != NATURAL_ZERO), SIGN_BIT, 0
                                                     ).to(torch.uint8)
        return top.reshape(1).to(torch.int32), codes

    def decode(self, header: torch.Tensor, body: torch.Tensor, d: int) -> torch.Tensor:
        code = torch.arange(256, dtype=torch.int32, device=body.device)  # every byte, then one lookup per element
        offset = code & 0x7F
        table = torch.ldexp(torch.ones(256, device=body.device), header[0] - offset)
        table = torch.where(offset == NATURAL_ZERO, 0.0, table)
        table = torch.where((code & SIGN_BIT) != 0, -table, table)
        return lookup(table, body)
