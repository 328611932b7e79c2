"""Measure a compressor on a random sample of every layer, and state the error it adds.

Where a trace is large (workers × elements × steps above arcsim.run.sampling.sample_threshold()), each bucket is
measured on a smaller bucket made of the same random share (1 in ``stride``) of every one of its layers' lines:
the columns of a ≥ 2-D layer seen as [rows, the rest] — every row kept, 1 in ``stride`` of its elements, the
same in each row — and runs of ROW_1D elements of a 1-D one. So every layer is there, in its proportion, with
every row: a per-layer k, ARC-Top-K's rows per layer, 1-bit Adam's per-tensor scales keep their meaning, and an
embedding's or output layer's few heavy token rows are in the sample (sampling rows instead missed them: the
output layer's ‖ḡ‖² came out at a third of its value on LLaMA-60M). Each step's sampled columns are gathered once
and every measurement compresses them, error feedback and all. A layer keeps at least one line, so a small one
is sampled at a larger share than the bucket's: each sampled element is weighted by its own layer's elements over
its sampled ones, and a bucket's err², ref², update error and ‖ḡ‖² are those weighted sums (a layer kept whole
counts once, exactly); its elements selected and messages are the sample's grown by the bucket's elements over
its sampled ones — ARC-Top-K's sketch (a few numbers per row) by the rows', a per-worker or per-layer scalar
(arcsim.comm.log.FIXED_TAGS) as it is. The sampled lines fall in GROUPS random groups, and each measurement keeps
err² and ref² per group, so the error's interval adds the sampling's (random groups, :func:`groups_half_width`) to
the spread over steps. What that interval does not hold: a compressor's behaviour on fewer elements — a k of a few
elements per layer rounds, Gaussian-K's threshold search settles elsewhere — measured against --exact in
docs/run.md.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.catalog import INFO
from arcsim.comm.log import FIXED_TAGS, ROOT_TAGS, CommRecord, resized
from arcsim.compressors.layout import Layer
from arcsim.strategy.buckets import Bucket

if TYPE_CHECKING:
    import torch

    from arcsim.run.measurement import Measurement

TARGET_SHARE = 0.5    # a sample is cut to this share of the sampling threshold's work …
MIN_BUCKET_SHARE = 1e-3  # … keeping at least this share of it in every bucket (50,000 elements by default)
MIN_STRIDE = 2.0      # a sample that would keep more than half of the elements is not taken
ROW_1D = 64           # a 1-D layer's rows: runs of this many elements (ARC-Top-K's block)
GROUPS = 8            # random groups of the sampled lines (columns, 1-D runs), for the sampling's interval


def takes_layer_sample(compressor: str, options: Mapping[str, Any], node_aware: bool = False) -> bool:
    """Whether ``compressor`` (with its own ``options``) is measured on a sample: all but PowerSGD, whose result
    follows the whole matrix (a sample of a matrix's columns is another matrix, of another rank's worth), and
    QSGD with one norm per bucket where it compresses slices of node means (``node_aware``): its rounding follows
    the bucket's norm (its noise grows as √n: on the shipped CNN a 1-in-5 sample with the sample's own norm gave
    0.028 for an error of 0.064), which a flat measurement hands it (:func:`needs_whole_norms`)."""
    if INFO[compressor].selection == "low-rank":
        return False
    return not (node_aware and needs_whole_norms(compressor, options))


def needs_whole_norms(compressor: str, options: Mapping[str, Any]) -> bool:
    """Whether ``compressor`` measured on a sample needs each worker's norm of the whole bucket (QSGD, one norm
    per bucket): its elements are then rounded on the bucket's scale, as they are in the whole bucket."""
    return compressor == "qsgd" and int(options.get("block", 0)) == 0


def rows_of(layer: Layer) -> tuple[int, int]:
    """(rows, row length) of ``layer``: its first axis (≥ 2-D), else runs of ROW_1D elements (the last shorter)."""
    if len(layer.shape) >= 2 and layer.shape[0] > 0:
        return layer.shape[0], layer.numel // layer.shape[0]
    return -(-layer.numel // ROW_1D), ROW_1D


@dataclass(frozen=True, eq=False)
class SampledBucket:
    """One bucket's sample: ``bucket`` the smaller bucket (same index, every layer with its sampled lines, laid out
    one after another from ``bucket.lo`` of the compact vector); ``index`` the trace-vector position of each of its
    elements; ``groups`` which random group each is in; ``elements`` and ``rows`` the whole bucket's elements and
    rows (as ARC-Top-K counts rows: :func:`rows_of`); ``whole_lo`` where the whole bucket starts in the trace vector."""

    bucket: Bucket
    index: np.ndarray
    groups: Groups
    elements: int
    rows: int
    whole_lo: int

    @property
    def factor(self) -> float:
        """Its expansion factor: the whole bucket's elements over its sampled elements."""
        return self.elements / self.bucket.numel

    @property
    def rows_factor(self) -> float:
        """The whole bucket's rows over the sample's (a sample of columns keeps every row)."""
        return self.rows / sum(rows_of(la)[0] for la in self.bucket.layers)


def _sample_layer(layer: Layer, share: float, rng: np.random.Generator, at: int
                  ) -> tuple[Layer, np.ndarray, np.ndarray]:
    """``layer`` sampled at ``share`` of its lines — the columns of a ≥ 2-D layer seen as [rows, the rest], every
    row kept; a 1-D layer's runs of ROW_1D elements — laid out from ``at``: the small layer, its elements' trace
    positions, and the group of each of its columns (of a 1-D layer, each element)."""
    matrix = len(layer.shape) >= 2 and layer.shape[0] > 0
    if matrix:
        length = layer.shape[0]
        lines = layer.numel // length
    else:
        lines, length = rows_of(layer)
    keep = lines if share >= 1 else min(lines, max(1, round(lines * share)))
    chosen = rng.choice(lines, keep, replace=False) if keep < lines else np.arange(lines)
    group = (np.arange(keep) + int(rng.integers(GROUPS))) % GROUPS  # (the lines come in a random order)
    order = np.lexsort((chosen, group))  # group by group, each group's lines in their order
    chosen, group = chosen[order], group[order]
    if matrix:  # [rows, kept columns], row-major
        index = (layer.offset + np.arange(length, dtype=np.int64)[:, None] * lines + chosen[None, :]).ravel()
        return Layer(layer.name, (length, keep), at), index, group
    starts = layer.offset + chosen.astype(np.int64) * length
    sizes = np.minimum(starts + length, layer.offset + layer.numel) - starts
    index = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    shape = (keep, *layer.shape[1:]) if len(layer.shape) >= 2 else (int(sizes.sum()),)
    return Layer(layer.name, shape, at), index, np.repeat(group, sizes)


@dataclass(frozen=True, eq=False)
class LayerSample:
    """Every bucket's sample (:class:`SampledBucket`), at ``stride`` (1 / the share of lines kept)."""

    stride: float
    seed: int
    parts: tuple[SampledBucket, ...]

    @classmethod
    def plan(cls, buckets: Sequence[Bucket], work: float, threshold: float, seed: int = 0) -> LayerSample | None:
        """The sample for a measurement of ``work`` (workers × elements × steps) over ``buckets``; None where the
        work is within ``threshold`` or a sample would keep more than 1 / MIN_STRIDE of the elements."""
        stride = work / (TARGET_SHARE * threshold)
        if work <= threshold or stride < MIN_STRIDE:
            return None
        floor = MIN_BUCKET_SHARE * threshold  # elements of a bucket a sample keeps at least
        parts, at = [], 0
        for b in buckets:
            own = max(1.0, min(stride, b.numel / floor))
            share = 1.0 if own < MIN_STRIDE else 1 / own
            layers, index, pieces, start = [], [], [], at
            for j, layer in enumerate(b.layers):
                if layer.numel == 0:  # (nothing to sample, nothing to send)
                    layers.append(Layer(layer.name, layer.shape, at))
                    continue
                rng = np.random.default_rng([seed, b.index, j])
                small, got, columns = _sample_layer(layer, share, rng, at)
                layers.append(small)
                index.append(got)
                whole = small.numel == layer.numel
                pieces.append((at - start, at - start + small.numel, columns.size, None if whole else columns,
                               layer.numel / small.numel))
                at += small.numel
            parts.append(SampledBucket(Bucket(b.index, tuple(layers), start, at, b.ready_s), np.concatenate(index),
                                       Groups(tuple(pieces)), b.numel, sum(rows_of(la)[0] for la in b.layers), b.lo))
        if at * MIN_STRIDE > sum(b.numel for b in buckets):
            return None
        return cls(stride, seed, tuple(parts))

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        return tuple(p.bucket for p in self.parts)

    @property
    def sampled(self) -> int:
        return sum(p.bucket.numel for p in self.parts)

    @property
    def elements(self) -> int:
        return sum(p.elements for p in self.parts)

    @functools.cached_property
    def signature(self) -> dict[str, Any]:
        """What names the sample in a measurement's cache key: its every position."""
        digest = hashlib.sha256()
        for p in self.parts:
            digest.update(p.index.tobytes())
        return {"stride": round(self.stride, 6), "seed": self.seed, "groups": GROUPS, "index": digest.hexdigest()}

    @functools.cached_property
    def index(self) -> torch.Tensor:
        """The trace-vector position of every sampled element, in the compact vector's order."""
        import torch

        return torch.from_numpy(np.concatenate([p.index for p in self.parts]))

    @functools.cached_property
    def groups(self) -> dict[int, Groups]:
        """Each bucket's groups (:class:`Groups`), by bucket index."""
        return {p.bucket.index: p.groups for p in self.parts}

    def gather(self, chunks: Iterable[torch.Tensor], workers: int, norms: BucketNorms | None = None) -> torch.Tensor:
        """The sampled columns [workers, sampled] of a step read as consecutive column chunks (in order, from 0); each
        chunk also added to ``norms``, where given."""
        import torch

        index = self.index.numpy()
        order = np.argsort(index, kind="stable")
        wanted = index[order]
        out = torch.empty(workers, wanted.size, dtype=torch.float32)
        lo = 0
        for chunk in chunks:
            hi = lo + chunk.shape[1]
            if norms is not None:
                norms.add(lo, chunk)
            a, b = np.searchsorted(wanted, [lo, hi])
            if b > a:
                out[:, torch.from_numpy(order[a:b])] = chunk[:, torch.from_numpy(wanted[a:b] - lo)].float()
            lo = hi
        if wanted.size and lo <= wanted[-1]:
            raise ValueError(f"the chunks end at column {lo}, before the sample's last ({wanted[-1]})")
        return out

    def expand(self, meas: Measurement) -> Measurement:
        """``meas``, measured on the sample, as the whole buckets' estimate (see the module's docstring)."""
        factors = [p.factor for p in self.parts]  # (err², ref², update error and ‖ḡ‖² came weighted by layer)
        meas.selected = [[v * f for v, f in zip(row, factors, strict=True)] for row in meas.selected]
        meas.records = [[[grown(r, p) for r in recs] for recs, p in zip(step, self.parts, strict=True)]
                        for step in meas.records]
        meas.elements = self.elements
        meas.layer_sample = {"stride": self.stride, "sampled_fraction": self.sampled / self.elements, "groups": GROUPS}
        return meas


class BucketNorms:
    """Each worker's norm of each whole bucket of one step, summed from the step's column chunks as they are read:
    what a compressor that scales by the bucket's norm needs where it compresses the sample (needs_whole_norms)."""

    def __init__(self, sample: LayerSample, workers: int) -> None:
        import torch

        self.spans = [(p.whole_lo, p.whole_lo + p.elements) for p in sample.parts]
        self.squares = torch.zeros(len(self.spans), workers, dtype=torch.float64)

    def add(self, lo: int, chunk: torch.Tensor) -> None:
        """Columns [lo, lo + chunk's width) of the step, every worker's."""
        import torch

        hi = lo + chunk.shape[1]
        for i, (a, b) in enumerate(self.spans):
            if min(b, hi) > max(a, lo):
                part = chunk[:, max(a, lo) - lo:min(b, hi) - lo]
                self.squares[i] += torch.linalg.vector_norm(part, dim=1, dtype=torch.float32).double().pow(2)

    def norms(self) -> torch.Tensor:
        """[buckets, workers], float32."""
        return self.squares.sqrt().float()


@dataclass(frozen=True, eq=False)
class Groups:
    """Which group each element of a small bucket is in, and what it stands for, layer by layer: (lo, hi, width,
    groups, weight) — the elements lo:hi are rows of ``width`` columns, column c in group ``groups[c]`` (a 1-D
    layer: one row), each standing for ``weight`` elements of the whole layer (its elements over its sampled ones;
    a layer kept whole: weight 1 and groups None, the exact part)."""

    pieces: tuple[tuple[int, int, int, np.ndarray | None, float], ...]

    def sums(self, values: torch.Tensor) -> list[float]:
        """The whole bucket's estimates of Σ ``values`` (one per element of the small bucket, any shape) from each
        group's elements, weighted by what each stands for; last, the exact part (the layers kept whole)."""
        import torch

        flat = values.reshape(-1)
        out = np.zeros(GROUPS + 1)
        for lo, hi, width, groups, weight in self.pieces:
            if groups is None:
                out[GROUPS] += float(flat[lo:hi].sum(dtype=torch.float64))
                continue
            columns = flat[lo:hi].view(-1, width).sum(dim=0, dtype=torch.float64).cpu().numpy()
            out[:GROUPS] += weight * np.bincount(groups, columns, GROUPS)
        return out.tolist()

    def total(self, values: torch.Tensor) -> float:
        """The whole bucket's estimate of Σ ``values``."""
        return float(sum(self.sums(values)))


def grown(r: CommRecord, part: SampledBucket) -> CommRecord:
    """``r`` as the whole bucket sends it: per-element parts by the bucket's expansion factor, ARC-Top-K's sketch
    (a few numbers per row) by its rows', per-worker and per-layer scalars as they are."""
    if r.tag in FIXED_TAGS:
        return r
    factor = part.rows_factor if r.tag in ROOT_TAGS else part.factor
    return resized(r, max(1, round(r.elements * factor)))


def groups_half_width(err2_parts: Any, ref2_parts: Any, fraction: float, confidence: float = 0.95) -> float | None:
    """The half-width of Σ err² / Σ ref²'s ``confidence`` interval from a random-groups sample: ``err2_parts`` and
    ``ref2_parts`` are [..., G + 1] (any leading axes: steps, buckets), each group's estimate of the sampled part's
    sum over G, then the exact part (:meth:`Groups.sums`); group g alone estimates the ratio as
    (exact + G·e_g) / (exact + G·r_g), and the spread of those estimates is the sampling's (with the finite-population
    correction 1 − ``fraction``). None where fewer than two groups hold anything."""
    from scipy.special import stdtrit

    e = np.asarray(err2_parts, dtype=float).reshape(-1, GROUPS + 1).sum(axis=0)
    r = np.asarray(ref2_parts, dtype=float).reshape(-1, GROUPS + 1).sum(axis=0)
    held = r[:GROUPS] > 0
    if held.sum() < 2:
        return None
    ratio = float(e.sum() / r.sum())
    per_group = (e[GROUPS] + GROUPS * e[:GROUPS][held]) / (r[GROUPS] + GROUPS * r[:GROUPS][held])
    g = per_group.size
    variance = (1 - fraction) * float(((per_group - ratio) ** 2).sum()) / (g * (g - 1))
    return float(stdtrit(g - 1, 0.5 + confidence / 2) * math.sqrt(variance))


def describe_layer_sample(sampled: dict[str, Any], buckets: int) -> str:
    """A sentence on the sample, for the run's assumptions."""
    return (f"SAMPLED: large measurements compressed a random {sampled['sampled_fraction']:.1%} of every layer "
            f"(up to 1 in {sampled['stride']:.1f} of its columns, every row kept; of a 1-D layer, runs of {ROW_1D} "
            f"elements; each of the {buckets} buckets on its own), each bucket's error terms and messages scaled up "
            "by its elements over its sampled ones (per-worker and per-layer scalars as they are); errors are "
            f"estimates and their ± includes the sampling ({sampled['groups']} random groups of columns); with "
            "--sharding, the quantised reductions' errors are measured on the same share of their blocks; "
            "docs/run.md; --exact measures every element")
