"""Deep Gradient Compression (Lin et al., ICLR 2018) as the authors' code runs it (synxlin/deep-gradient-compression:
``DGCCompressor`` with ``DGCSGDMemory`` and ``DGCSGD``).

Each bucket keeps, per local worker, DGC's momentum u and velocity v (its error compensation: arcsim runs it with
memory ``none``, see :func:`arcsim.catalog.memory_for`). One step of a worker's gradient g:

1. *local gradient clipping* (``clip_norm``, off by default as in the reference's configs): each compressed layer's
   gradient is scaled down to an ℓ2 norm of at most clip_norm · N^-1/2 (N ranks), the paper's threshold for one of N
   workers;
2. *momentum correction*: u ← m·u + g, v ← v + u (``momentum`` m = 0.9);
3. *sampled threshold*, per layer: the reference's sample of |v| — every ``stride``-th entry from a random start
   (``strided``, its default), or as many drawn uniformly (``strided=False``), about ``sample_ratio`` (1 %) of the
   layer and never fewer than 2/ρ; the threshold is the smallest of the sample's ⌈ρ·samples⌉ largest; the layer
   keeps |v| ≥ threshold. If more than 1.3·k pass (k = ⌈ρ·n⌉, the reference's count), the exact top-k of those is
   kept; if fewer than 0.8·k pass, the threshold is lowered by 0.8 and counted again, at most 10 times; between the
   two bounds, or when the tries run out, what passed is kept, cut to its first k by position (the reference's
   ``indices[:num_selects]``): so a worker sends at most k, and fewer only when the tries ran out (reported in
   ``selected``). A layer of at most 2/ρ elements is thresholded on itself (no sample, no adaptation). The random
   start or draw comes from (seed, step, layer), the same on every worker, as the reference's generators seeded
   alike on every rank;
4. *momentum factor masking*: u and v are zeroed where sent (``masking=False``: v only);
5. values and indices are all-gathered (packed into one, as Top-K), every worker padded to Σk with value 0, and the
   mean is scattered.

As the reference, only layers of two or more dimensions are compressed (``scope="tensor"``): the others (biases,
norms) are all-reduced dense and the momentum is applied to their mean (the reference's ``compensate`` without
accumulation after its all-reduce). A flat vector, or a bucket of vectors only, is compressed whole (the reference
would send it dense). ``scope="bucket"``: the whole bucket is one tensor to compress.

*Warm-up* (``warmup_steps`` W, default 0: ``arcsim run`` measures a few steps of a trace): at step s < W the density is
max(c^(s+1), ρ), c = ``warmup_coeff`` (default ρ^(1/(W+1)), the reference's); ρ = 0.001 over W = 4 gives the paper's
0.25, 0.063, 0.016, 0.004, then 0.001. The reference counts epochs; arcsim counts the steps it is called with.

*What it returns.* DGC's update a_t — the mean of what was sent, and the dense layers' momentum — as the reference
does: its DGCSGD applies it with no momentum of its own (the momentum is in a_t already). ``optimizer_momentum=True``
returns a_t − m·a_{t−1} instead, which a plain momentum optimizer (``torch.optim.SGD(momentum=m)``, no dampening, no
Nesterov) turns back into a_t exactly, weight decay included (DGCSGD keeps a momentum of the decay alone, which the
SGD buffer then holds beside a_t): DGC in a job whose optimizer has momentum m — ``arcsim train`` with SGD sets it,
and m to the optimizer's; a DDP hook's user sets it in ``CompressionState(options=...)``.

Its error in ``run`` and ``compress`` is measured against the workers' mean velocity before sending (the dense
layers' momentum where they are all-reduced; ``Compressed.reference``), as an error-feedback memory's is against the
input it compensated: a_t carries DGC's momentum (up to 1/(1 − m) times a steady gradient), so against the mean
gradient it would look worse each step the velocity grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from arcsim.comm import Communicator
from arcsim.compressors.base import (
    Compressed,
    DenseContribution,
    GatheringCompressor,
    sparse_aggregate,
)
from arcsim.compressors.layout import Layer
from arcsim.errors import CompressionError

UPPER, LOWER, ADAPTATIONS = 1.3, 0.8, 10  # the reference's compress_upper_bound, compress_lower_bound, iterations


@dataclass(frozen=True)
class Sampling:
    """How the reference thresholds a layer of n elements at ratio ρ (``DGCCompressor.initialize``)."""

    k: int        # num_selects: ⌈ρ·n⌉
    samples: int  # num_samples: n when the layer is thresholded on itself
    top: int      # top_k_samples: ⌈ρ·samples⌉
    stride: int   # sample_stride


def sampling(n: int, ratio: float, sample_ratio: float) -> Sampling:
    """The reference's sample for a layer of ``n`` at ``ratio``: about ``sample_ratio`` of it, at least 2/ratio, taken
    every ``stride``-th (a stride of 32·j + 1, lowered by 8 until the sample is large enough)."""
    stride, samples = 1, n
    if sample_ratio < 1.0:
        enough = max(math.ceil(n * sample_ratio), math.ceil(2 / ratio))
        if n > math.ceil(2 / ratio):
            stride = math.ceil(n / enough / 32) * 32 + 1
            samples = n // stride
            while samples < enough:
                stride -= 8
                samples = n // stride
    return Sampling(math.ceil(n * ratio), samples, math.ceil(samples * ratio), stride)


def sample_positions(n: int, plan: Sampling, strided: bool, gen: torch.Generator) -> torch.Tensor | None:
    """Where the layer is sampled (None: the whole layer): every stride-th entry from a random start, or
    ``plan.samples`` positions drawn uniformly with replacement."""
    if plan.samples >= n:
        return None
    if strided:
        start = int(torch.randint(plan.stride, (1,), generator=gen))
        return torch.arange(start, n, plan.stride)
    return torch.randint(n, (plan.samples,), generator=gen)


def dgc_select(importance: torch.Tensor, plan: Sampling, positions: torch.Tensor | None) -> torch.Tensor:
    """Indices one worker sends from a layer of |v| (``importance``, 1-D), the reference's ``_sparsify``."""
    samples = importance if positions is None else importance[positions.to(importance.device)]
    threshold = samples.topk(plan.top, sorted=False).values.min()
    picked = torch.nonzero(importance >= threshold).view(-1)
    if positions is not None:
        for _ in range(ADAPTATIONS):
            count = picked.numel()
            if count > plan.k:
                if count > plan.k * UPPER:  # too many: the exact top-k of those that passed
                    picked = picked[importance[picked].topk(plan.k, sorted=False).indices]
                break
            if count >= LOWER * plan.k:
                break
            threshold = threshold * LOWER  # too few: a lower threshold, counted again
            picked = torch.nonzero(importance >= threshold).view(-1)
    return picked[:plan.k]


class DGC(GatheringCompressor):
    name = "dgc"

    def __init__(self, density: float = 0.01, seed: int = 0, scope: str = "tensor", packed: bool = True,
                 momentum: float = 0.9, masking: bool = True, clip_norm: float | None = None,
                 sample_ratio: float = 0.01, strided: bool = True, warmup_steps: int = 0,
                 warmup_coeff: float | None = None, optimizer_momentum: bool = False) -> None:
        super().__init__(density, seed, scope, packed)
        if not 0 <= momentum < 1:
            raise CompressionError(f"DGC's momentum must be in [0, 1) (got {momentum})")
        if clip_norm is not None and not clip_norm > 0:
            raise CompressionError(f"DGC's clip_norm must be positive, or None for no clipping (got {clip_norm})")
        if not 0.01 <= sample_ratio <= 1:
            raise CompressionError(f"DGC's sample_ratio must be in [0.01, 1] (got {sample_ratio}); the reference "
                                   "raises smaller ones to 0.01")
        if not (isinstance(warmup_steps, int) and warmup_steps >= 0):
            raise CompressionError(f"DGC's warmup_steps must be a whole number ≥ 0 (got {warmup_steps})")
        if warmup_coeff is not None and not 0 < warmup_coeff <= 1:
            raise CompressionError(f"DGC's warmup_coeff must be in (0, 1] (got {warmup_coeff}), e.g. 0.25")
        self.momentum, self.masking, self.clip_norm = float(momentum), bool(masking), clip_norm
        self.sample_ratio, self.strided = float(sample_ratio), bool(strided)
        self.warmup_steps, self.warmup_coeff = warmup_steps, warmup_coeff
        self.optimizer_momentum = bool(optimizer_momentum)
        self._state: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def ratio_at(self, step: int, rho: float) -> float:
        """The density at ``step``: the warm-up's max(c^(step+1), ρ) during it, else ρ."""
        if step >= self.warmup_steps:
            return rho
        coeff = self.warmup_coeff if self.warmup_coeff is not None else rho ** (1.0 / (self.warmup_steps + 1))
        return max(coeff ** (step + 1), rho)

    def parts(self, d: int, layout: tuple[Layer, ...] | None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(offset, numel) of the layers compressed, and of those all-reduced dense (fewer than two dimensions)."""
        if self.scope == "bucket" or layout is None:
            return [(0, d)], []
        matrices = [(la.offset, la.numel) for la in layout if len(la.shape) >= 2 and la.numel]
        if not matrices:
            return [(la.offset, la.numel) for la in layout if la.numel], []
        return matrices, [(la.offset, la.numel) for la in layout if len(la.shape) < 2 and la.numel]

    def state(self, w: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(u, v, last): momentum and velocity per local worker [W, d], and the last update a_{t−1} [1, d]."""
        key = (w, d)
        if key not in self._state:
            self._state[key] = (torch.zeros(w, d, device=device), torch.zeros(w, d, device=device),
                                torch.zeros(1, d, device=device))
        return self._state[key]

    def clip(self, t: torch.Tensor, ranks: int) -> torch.Tensor:
        """Each row of ``t`` scaled to an ℓ2 norm of at most clip_norm / √ranks (the reference's clip_grad_norm_)."""
        if self.clip_norm is None:
            return t
        limit = self.clip_norm / math.sqrt(ranks)
        coef = limit / (t.norm(dim=1, keepdim=True) + 1e-6)
        return t * coef.clamp(max=1.0)

    def generator(self, step: int, offset: int) -> torch.Generator:
        return torch.Generator().manual_seed(hash((self.seed, step, offset)) & 0x7FFF_FFFF_FFFF_FFFF)

    def compress(self, x: torch.Tensor, comm: Communicator, step: int,
                 layout: tuple[Layer, ...] | None = None, density: float | None = None) -> Compressed:
        w, d = x.shape
        ratio = self.ratio_at(step, self.rho(density))
        groups, dense = self.parts(d, layout)
        u, v, last = self.state(w, d, x.device)
        g = x.float()
        m = self.momentum
        for off, n in groups:  # clipping (per layer, as the reference's memory), then momentum correction
            grad = self.clip(g[:, off:off + n], comm.world_size)
            u[:, off:off + n].mul_(m).add_(grad)
            v[:, off:off + n].add_(u[:, off:off + n])
        # what the sent values approximate: the workers' mean velocity (in-process, where every worker is here)
        reference = v.mean(dim=0, keepdim=True) if w == comm.world_size else None
        picks: list[list[torch.Tensor]] = [[] for _ in range(w)]
        width = 0
        for off, n in groups:
            plan = sampling(n, ratio, self.sample_ratio)
            width += min(plan.k, n)
            if plan.k >= n:  # everything: nothing to threshold
                for row in range(w):
                    picks[row].append(torch.arange(off, off + n, device=x.device))
                continue
            where = sample_positions(n, plan, self.strided, self.generator(step, off))
            for row in range(w):
                picks[row].append(dgc_select(v[row, off:off + n].abs(), plan, where) + off)
        idx = torch.zeros(w, max(1, width), dtype=torch.int64, device=x.device)
        vals = torch.zeros(w, max(1, width), dtype=torch.float32, device=x.device)
        selected = torch.zeros(w, dtype=torch.int64, device=x.device)
        for row, parts in enumerate(picks):  # ragged rows, padded with value 0 at index 0
            mine = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=x.device)
            idx[row, :mine.numel()] = mine
            vals[row, :mine.numel()] = v[row, mine]
            selected[row] = mine.numel()
            v[row, mine] = 0.0  # momentum factor masking
            if self.masking:
                u[row, mine] = 0.0
        gathered_vals, gathered_idx = self.gather(comm, vals, idx)
        update = sparse_aggregate(d, gathered_idx, gathered_vals, comm.world_size)
        contribution = torch.zeros(w, d, dtype=torch.float32, device=x.device)
        contribution.scatter_add_(1, idx, vals)
        if dense:
            cols = torch.cat([torch.arange(off, off + n, device=x.device) for off, n in dense])
            mine_dense = g[:, cols]
            mean = comm.all_reduce(mine_dense, tag="dense")
            at = 0
            clipped = mean.clone()
            for _, n in dense:
                clipped[:, at:at + n] = self.clip(mean[:, at:at + n], comm.world_size)
                at += n
            applied = last[:, cols] * m + clipped  # the momentum of the averaged gradient
            update[:, cols] = applied
            if reference is not None:
                reference[:, cols] = applied
            contribution[:, cols] = applied + (mine_dense - mean)  # each worker's share, averaging to `applied`
            selected += cols.numel()
        out = update - m * last if self.optimizer_momentum else update.clone()
        if self.optimizer_momentum:
            contribution.sub_(last, alpha=m)
            if reference is not None:
                reference.sub_(last, alpha=m)
        last.copy_(update)
        return Compressed(out, DenseContribution(contribution), selected, index_based=not self.optimizer_momentum,
                          reference=reference)
