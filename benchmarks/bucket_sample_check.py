"""The bucket sample (arcsim.run.sampling) against every bucket measured: one compressor measured on every bucket of a
large trace at the grid's densities (--exact), then, from those same per-bucket numbers (a bucket's measurement does
not depend on the others'), the stratified estimate and its interval at several sampling fractions.

    python benchmarks/bucket_sample_check.py /tmp/l1b/llama1b.npz --batch 4 --precision bf16   # PowerSGD, LLaMA-1B

Prints per fraction the share of elements measured and, per density, the exact error, the sampled one ± the
upper half of the interval a run reports (rel_error_interval: the steps' spread and the sampling's), and whether
the exact one lies inside that interval.
"""

from __future__ import annotations

import argparse
import copy
import time

from arcsim.run.analysis import Analysis
from arcsim.run.config import RunConfig
from arcsim.run.measurement import Measurement
from arcsim.run.sampling import FLOAT_COLUMNS, BucketSample


def sampled(exact: Measurement, plan: BucketSample) -> Measurement:
    """``exact``'s measured buckets only, expanded as a sampled run expands them."""
    s = copy.deepcopy(exact)
    for name in FLOAT_COLUMNS:
        setattr(s, name, [[row[i] for i in plan.measured] for row in getattr(exact, name)])
    s.records = [[recs[i] for i in plan.measured] for recs in exact.records]
    return plan.expand(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--compressor", default="powersgd")
    ap.add_argument("--fractions", default="0.25,0.125,0.0833")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--precision", default=None)
    args = ap.parse_args()
    cfg = RunConfig(trace=args.trace, compressors=(args.compressor,), policy="none", exact=True, batch=args.batch,
                    precision=args.precision)
    a = Analysis(cfg, announce=lambda _: None)
    started = time.perf_counter()
    exact = {d: a.measurement(args.compressor, d, grid=True) for d in cfg.ratios}
    print(f"every bucket measured ({len(a.ctx.buckets)}): {time.perf_counter() - started:.1f} s", flush=True)
    buckets = a.ctx.buckets
    for fraction in (float(f) for f in args.fractions.split(",")):
        plan = BucketSample.plan(buckets, fraction=fraction)
        share = sum(buckets[i].numel for i in plan.measured) / sum(b.numel for b in buckets)
        for d, m in exact.items():
            s = sampled(m, plan)
            lo, hi = s.rel_error_interval() or (s.rel_error(), s.rel_error())  # as the run reports it
            inside = lo <= m.rel_error() <= hi
            print(f"f={fraction:.3f} ({share:.0%} of elements) d={d:g}: exact {m.rel_error():.4f} sampled "
                  f"{s.rel_error():.4f} ± {hi - s.rel_error():.4f} {'inside' if inside else 'OUTSIDE'}", flush=True)


if __name__ == "__main__":
    main()
