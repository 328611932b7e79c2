"""What pricing needs of one compressor measured over a trace (arcsim.run.measure measures it): each step's and
bucket's collective records, error terms, compression gain, selected elements and compression time. Plain data,
no torch: a run whose measurements are all cached loads them and prices without importing torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arcsim.comm.log import CommRecord
from arcsim.run.layer_sample import groups_half_width


@dataclass
class Measurement:
    """[steps, buckets] arrays for one (compressor, density, memory) over a trace."""

    compressor: str
    density: float
    memory: str
    elements: int = 0
    hierarchy: str = "flat"  # flat: compressed across every rank; node: dense inside nodes (compressors.hierarchy)
    records: list[list[list[CommRecord]]] = field(default_factory=list)  # [step][bucket] → records
    err2: list[list[float]] = field(default_factory=list)        # ||agg − ū||² per step, bucket
    ref2: list[list[float]] = field(default_factory=list)        # ||ū||²
    upd2: list[list[float]] = field(default_factory=list)        # ||update − ḡ||²
    raw2: list[list[float]] = field(default_factory=list)        # ||ḡ||²
    gain: list[list[float]] = field(default_factory=list)        # mean over workers of ||C(u_w)|| / ||u_w||
    selected: list[list[float]] = field(default_factory=list)    # elements selected per worker
    compress_s: list[list[float]] = field(default_factory=list)  # measured local work per rank
    sample: dict[str, Any] | None = None  # measured on a sample of buckets (arcsim.run.sampling): "strata" (every
    #                                       bucket, by stratum) and "measured"; the others' columns are estimates
    layer_sample: dict[str, Any] | None = None  # measured on a sample of every layer (arcsim.run.layer_sample): its
    #                                             "stride", "sampled_fraction" and "groups"; every column an estimate
    err2_parts: list[list[list[float]]] = field(default_factory=list)  # [step][bucket][group] of a layer sample
    ref2_parts: list[list[list[float]]] = field(default_factory=list)

    def rel_error(self, buckets: Iterable[int] | None = None) -> float:
        """Σ||agg − ū||² / Σ||ū||² over steps and the given buckets (all by default)."""
        e, r = np.asarray(self.err2), np.asarray(self.ref2)
        cols = slice(None) if buckets is None else list(buckets)
        total = float(r[:, cols].sum())
        return float(e[:, cols].sum()) / total if total > 0 else 0.0

    def rel_error_interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """The ``confidence`` interval of the error, from its spread over the steps (Student's t on the
        per-step errors Σ_b err² / Σ_b ref²) and, measured on a sample of buckets or of every layer, from the sampling
        (the half-widths added in quadrature: :meth:`sampling_half_width`, :meth:`layer_sample_half_width`); None from a
        single step of every element, where there is no spread to see."""
        from scipy.special import stdtrit  # Student's t quantile (scipy.special: 0.15 s to import, so when asked)

        e, r = np.asarray(self.err2).sum(axis=1), np.asarray(self.ref2).sum(axis=1)
        per_step = e[r > 0] / r[r > 0]
        halves = []
        if per_step.size >= 2:
            halves.append(float(stdtrit(per_step.size - 1, 0.5 + confidence / 2) * per_step.std(ddof=1)
                                / np.sqrt(per_step.size)))
        for sampled in (self.sampling_half_width(confidence), self.layer_sample_half_width(confidence)):
            if sampled is not None:
                halves.append(sampled)
        if not halves:
            return None
        half = float(np.sqrt(sum(h * h for h in halves)))
        centre = self.rel_error()
        return max(0.0, centre - half), centre + half

    def sampling_half_width(self, confidence: float = 0.95) -> float | None:
        """Measured on a sample of buckets: the half-width of the error's ``confidence`` interval from the
        sampling alone — the stratified ratio estimator's linearised variance, with the finite-population
        correction (a stratum measured whole adds nothing), Σ_h N_h² (1 − n_h/N_h) s²_h / n_h / X², where
        s²_h is the spread over the stratum's measured buckets of d_i = e_i − R r_i (e, r: the bucket's
        err², ref² summed over steps; X: the estimated Σ ref²), times Student's t on Σ (n_h − 1) degrees of
        freedom. None: every bucket measured."""
        from scipy.special import stdtrit

        if self.sample is None:
            return None
        e, r = np.asarray(self.err2).sum(axis=0), np.asarray(self.ref2).sum(axis=0)
        total_r = float(r.sum())
        if total_r <= 0:
            return None
        ratio = float(e.sum()) / total_r
        measured = set(self.sample["measured"])
        variance, dof = 0.0, 0
        for stratum in self.sample["strata"]:
            got = [i for i in stratum if i in measured]
            big, n = len(stratum), len(got)
            if n >= big or n < 2:
                continue
            d = e[got] - ratio * r[got]
            variance += big * big * (1 - n / big) * float(np.var(d, ddof=1)) / n
            dof += n - 1
        if dof == 0:
            return None
        return float(stdtrit(dof, 0.5 + confidence / 2) * np.sqrt(variance) / total_r)

    def layer_sample_half_width(self, confidence: float = 0.95) -> float | None:
        """Measured on a sample of every layer: the half-width of the error's ``confidence`` interval from the sampling
        alone (random groups: arcsim.run.layer_sample.groups_half_width). None: every element measured."""
        if self.layer_sample is None or not self.err2_parts:
            return None
        return groups_half_width(self.err2_parts, self.ref2_parts, self.layer_sample["sampled_fraction"], confidence)

    def err2_bucket(self, index: int) -> float:
        return float(np.asarray(self.err2)[:, index].sum())

    def ref2_bucket(self, index: int) -> float:
        return float(np.asarray(self.ref2)[:, index].sum())

    def update_error(self) -> float:
        total = float(np.sum(self.raw2))
        return float(np.sum(self.upd2)) / total if total > 0 else 0.0

    def compression_gain(self) -> float:
        return float(np.mean(self.gain))

    def density_achieved(self) -> float:
        return float(np.mean(self.density_by_step()))

    def density_by_step(self) -> list[float]:
        """Elements selected per worker over the trace's elements, step by step (adaptive k varies)."""
        return [float(sum(row)) / self.elements for row in self.selected]

    def add(self, row: dict[str, list]) -> None:
        """Append one step's row (from BucketedCompression.step)."""
        for key, values in row.items():
            getattr(self, key).append(values)

    def bytes_per_rank(self) -> float:
        """Mean over steps of the bytes each rank contributes per iteration to collectives between nodes (the
        dense steps inside a node, node-aware, are not counted)."""
        return float(np.mean([sum(r.bytes_per_rank for recs in step for r in recs if r.group != "node")
                              for step in self.records]))
