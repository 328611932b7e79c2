"""Baselines without selection: fp32 all-reduce, and fp16 or bf16 casts (half the bytes, still all-reduce;
bf16 keeps fp32's range with 8 bits of mantissa, as PyTorch's bf16_compress_hook sends it)."""

from __future__ import annotations

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import Compressed, Compressor, DenseContribution
from arcsim.compressors.layout import Layer


class Dense(Compressor):
    name = "dense"

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        agg = comm.all_reduce(x.float(), tag="values")
        full = torch.full((x.shape[0],), x.shape[1], device=x.device)
        return Compressed(agg, DenseContribution(x), full, index_based=False)


class Fp16(Compressor):
    name = "fp16"
    dtype = torch.float16

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        half = x.to(self.dtype)
        agg = comm.all_reduce(half, tag="values").float()
        full = torch.full((x.shape[0],), x.shape[1], device=x.device)
        return Compressed(agg, DenseContribution(half), full, index_based=False)


class Bf16(Fp16):
    name = "bf16"
    dtype = torch.bfloat16
