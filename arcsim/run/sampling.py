"""Measure a compressor on a stratified sample of a large trace's buckets, and state the error it adds.

Buckets are grouped into strata of the same layout (the same layer shapes at the same offsets, so the same
size and, for compressors whose k depends on the layer shapes, the same messages). A stratum of one bucket —
the first and last buckets, odd-sized ones — is always measured whole; from a stratum of N equal buckets
``max(MIN_PER_STRATUM, ⌈SAMPLE_FRACTION·N⌉)`` are measured, a systematic sample in bucket order (every
N/n-th: bucket order follows layer depth, so the sample spreads over the depth). Each bucket has its own
compressor and error-feedback memory, so a measured bucket's numbers are exactly what an exact run gets
for it. An unmeasured bucket gets, step by step, the mean over its stratum's measured buckets of every
column (err², ref², gains, elements selected, compression time), so Σ err² / Σ ref² over every bucket is
the stratified ratio estimator Σ_h N_h ē_h / Σ_h N_h r̄_h; and records whose sizes are the mean of the
measured buckets' (identical for fixed-k compressors — Top-K, Rand-K, PowerSGD, … —; for ones whose k
follows the data — Gaussian-K, adaptive, thresholds — the sampled mean). The error's interval adds the
sampling's (Measurement.sampling_half_width) to the spread over steps.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.comm.log import CommRecord, resized
from arcsim.strategy.buckets import Bucket

if TYPE_CHECKING:
    from arcsim.run.measurement import Measurement

SAMPLE_WORK_ELEMENTS = 5e7  # workers × elements × steps of one measurement above which buckets are sampled
SAMPLE_FRACTION = 0.125     # of each stratum of equal buckets, at least … (PowerSGD on LLaMA-1B against every bucket:
#                             1/8 and 1/4 each inside at all 8 densities, 1/12 outside at 3; 1/8 measures 21 % of
#                             the elements, 1/4 32 %: benchmarks/results/powersgd_bucket_sample_llama1b.txt)
MIN_PER_STRATUM = 3         # … and at least this many (a spread on 2 degrees of freedom: 2 of 16 missed; fewer: whole)
MIN_SAMPLE_SAVING = 0.25    # a sample is taken only where it leaves out at least this share of the elements
FLOAT_COLUMNS = ("err2", "ref2", "upd2", "raw2", "gain", "selected", "compress_s")


def sample_threshold() -> float:
    """Measurement work (workers × elements × steps) above which buckets are sampled:
    $ARCSIM_SAMPLE_ELEMENTS, else SAMPLE_WORK_ELEMENTS."""
    try:
        return float(os.environ.get("ARCSIM_SAMPLE_ELEMENTS", SAMPLE_WORK_ELEMENTS))
    except ValueError:
        return SAMPLE_WORK_ELEMENTS


def layout_key(b: Bucket) -> tuple[Any, ...]:
    """What makes two buckets the same stratum: the same layer shapes at the same offsets."""
    return b.numel, tuple((la.shape, la.offset - b.lo) for la in b.layers)


@dataclass(frozen=True)
class BucketSample:
    """Which buckets a measurement compresses (``measured``), and every bucket by stratum (``strata``)."""

    strata: tuple[tuple[int, ...], ...]
    measured: tuple[int, ...]

    @classmethod
    def plan(cls, buckets: Sequence[Bucket], fraction: float = SAMPLE_FRACTION,
             minimum: int = MIN_PER_STRATUM) -> BucketSample:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for b in buckets:
            groups.setdefault(layout_key(b), []).append(b.index)
        measured: set[int] = set()
        for members in groups.values():
            big = len(members)
            n = min(big, max(minimum, math.ceil(fraction * big)))
            measured.update(members[int((i + 0.5) * big / n)] for i in range(n))
        return cls(tuple(tuple(m) for m in groups.values()), tuple(sorted(measured)))

    @property
    def buckets(self) -> int:
        return sum(len(s) for s in self.strata)

    @property
    def whole(self) -> bool:
        """Whether every bucket is measured (then it is no sample)."""
        return len(self.measured) == self.buckets

    def to_dict(self) -> dict[str, Any]:
        return {"strata": [list(s) for s in self.strata], "measured": list(self.measured)}

    def expand(self, meas: Measurement) -> Measurement:
        """``meas``, whose columns are the measured buckets' (in index order), with every bucket's column: an
        unmeasured bucket's are its stratum's measured mean (records: :func:`mean_records`)."""
        column = {b: j for j, b in enumerate(self.measured)}
        stratum_of = {b: s for s in self.strata for b in s}
        donors = {b: [column[i] for i in stratum_of[b] if i in column] for b in range(self.buckets)}
        for name in FLOAT_COLUMNS:
            rows = getattr(meas, name)
            setattr(meas, name, [[row[column[b]] if b in column else float(np.mean([row[j] for j in donors[b]]))
                                  for b in range(self.buckets)] for row in rows])
        meas.records = [[recs[column[b]] if b in column else mean_records([recs[j] for j in donors[b]])
                         for b in range(self.buckets)] for recs in meas.records]
        meas.sample = self.to_dict()
        return meas


def mean_records(donors: list[list[CommRecord]]) -> list[CommRecord]:
    """An unmeasured bucket's records from its stratum's measured buckets' (the same step): where they send
    the same collectives (op, tag, dtype, group) in the same order, each of the mean size (for fixed-k
    compressors, the size they all send); otherwise the first's."""
    first = donors[0]
    shape = [(r.op, r.tag, r.dtype, r.group) for r in first]
    if any([(r.op, r.tag, r.dtype, r.group) for r in d] != shape for d in donors[1:]):
        return list(first)
    return [r if all(d[j].elements == r.elements for d in donors) else
            resized(r, max(1, round(float(np.mean([d[j].elements for d in donors])))))
            for j, r in enumerate(first)]


def describe(sample: BucketSample, buckets: Sequence[Bucket]) -> str:
    """A sentence on what was sampled, for the run's assumptions."""
    total = sum(b.numel for b in buckets)
    got = sum(buckets[i].numel for i in sample.measured)
    partial = [s for s in sample.strata if not set(s) <= set(sample.measured)]
    strata = "; ".join(f"{sum(1 for i in s if i in sample.measured)} of {len(s)} buckets of "
                       f"{buckets[s[0]].numel:,} elements ({', '.join(str(i) for i in s if i in sample.measured)})"
                       for s in partial)
    return (f"SAMPLED: large measurements compressed {len(sample.measured)} of {len(buckets)} buckets "
            f"({got / total:.0%} of the elements: strata of up to {MIN_PER_STRATUM} alike buckets whole, "
            f"{strata}); an unmeasured "
            "bucket's error terms, gains and compression time are its stratum's measured mean, its messages the "
            "same (their mean size where a compressor's k follows the data, e.g. gaussiank, adaptive); errors "
            "are ratio estimates and their ± includes the bucket sampling (docs/run.md; --exact measures every "
            "bucket)")
