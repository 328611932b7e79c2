"""The sign family: each worker sends one bit per element (its sign; x ≥ 0 sends +, as one bit cannot send 0),
eight to a byte, and one fp32 scale: 4 + ⌈d/8⌉ bytes, all-gathered (signs do not sum as sent), and every worker
decodes all P payloads.

- ``signsgd``, signSGD with majority vote (Bernstein et al. 2018): the update is the vote sign(Σ_p sign(x_p)) (a tie,
  possible with an even P, abstains: 0). The reference applies the vote times the learning rate; a compressor here
  returns an estimate of the mean gradient, so the vote is scaled by the mean over workers of each worker's
  ‖x_p‖₁/d (the scale each payload carries). Each worker's contribution (what error feedback subtracts, if asked
  for) is its own ‖x‖₁/d·sign(x); unlike every other compressor the aggregate is the vote, not the mean of those.
- ``signum`` (Bernstein et al. 2018): the same vote on the sign of each worker's momentum m ← β·m + (1 − β)·x
  (β = ``beta``, 0.9; the first step m = x, as the GRACE suite), kept by the compressor (one per bucket) across
  steps; the scale is each worker's ‖m‖₁/d.
- ``efsignsgd``, EF-SignSGD (Karimireddy et al. 2019): C(x) = ‖x‖₁/d·sign(x), averaged over the workers (no vote),
  with error feedback (the catalog's default memory ``ef14``: e ← u − C(u)).
"""

from __future__ import annotations

import torch

from arcsim.compressors.quantisers import PackedCompressor, expand, pack, packed_bytes
from arcsim.errors import CompressionError

SIGN_BITS = 1
SIGN_VALUES = (-1.0, 1.0)  # bit 0: x < 0, bit 1: x ≥ 0


class SignCompressor(PackedCompressor):
    """‖x‖₁/d·sign(x) per worker, one bit per element; decoded as the mean over the workers."""

    def body_bytes(self, d: int) -> int:
        return packed_bytes(d, SIGN_BITS)

    def encode(self, row: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return row.abs().mean().reshape(1), pack((row >= 0).to(torch.uint8), SIGN_BITS)

    def signs(self, body: torch.Tensor, d: int) -> torch.Tensor:
        """±1 per element, float32."""
        return expand(body, SIGN_BITS, SIGN_VALUES, d)

    def decode(self, header: torch.Tensor, body: torch.Tensor, d: int) -> torch.Tensor:
        return self.signs(body, d) * header[0]


class EFSignSGD(SignCompressor):
    name = "efsignsgd"


class SignSGD(SignCompressor):
    name = "signsgd"

    def combine(self, gathered: torch.Tensor, d: int, local: dict[int, int], contribution: torch.Tensor
                ) -> torch.Tensor:
        """The majority vote of every peer's signs times the mean of their scales."""
        votes = torch.zeros(d, dtype=torch.float32, device=gathered.device)
        scale = 0.0
        for p in range(gathered.shape[0]):
            header, body = self.split(gathered[p])
            signs = self.signs(body, d)
            if p in local:
                contribution[local[p]] = signs * header[0]
            votes += signs
            scale += float(header[0])
        return votes.sign_().mul_(scale / gathered.shape[0]).unsqueeze(0)


class Signum(SignSGD):
    name = "signum"

    def __init__(self, density: float = 0.01, seed: int = 0, beta: float = 0.9) -> None:
        super().__init__(density, seed)
        if not 0 <= beta < 1:
            raise CompressionError(f"Signum momentum β must be in [0, 1) (got {beta})")
        self.beta = float(beta)
        self._momentum: dict[tuple[int, int], torch.Tensor] = {}  # per [W, d]: a compressor serves one bucket

    def target(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.shape[0], x.shape[1])
        m = self._momentum.get(key)
        if m is None:
            m = self._momentum[key] = x.float().clone()
        else:
            m.mul_(self.beta).add_(x.float(), alpha=1 - self.beta)
        return m
