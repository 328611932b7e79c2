"""gloo on the emulated cluster against `arcsim collective --library gloo` (and `ideal`), repeated.

Builds the emulated cluster (root; namespaces + tbf) --runs times in fresh processes, measures all_reduce,
all_gather and broadcast (arcsim.testbed.microbench: barrier, collective, slowest rank, median of
--repeats), and prices the same collectives on a flat topology with the cluster's rate and the bridge's
one-way latency. Prints per (op, size) the median, min and max over runs, the predictions and their errors,
and writes the rows as CSV. Run: sudo python benchmarks/gloo_emulated.py --ranks 4 --bandwidth 100Mbit
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from arcsim.pricing import price_collective
from arcsim.testbed.calibrate import SIZE_FACTOR, run_microbench
from arcsim.topology import IntraLink, Network, Topology
from arcsim.units import parse_rate

BRIDGE_LATENCY_S = 12.5e-6  # one way: half the 0.025 ms TCP round trip measured on the bridge (emulated-cluster.md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--bandwidth", default="100Mbit")
    parser.add_argument("--sizes", default="4096,65536,1048576")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burst", type=float, default=None, help="tbf burst in bytes (default: the cluster's)")
    parser.add_argument("--out", default="benchmarks/results/emulated/gloo_collectives.csv")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    runs = [run_microbench(args.ranks, "emulated", args.bandwidth, sizes, args.repeats, burst=args.burst)["median_s"]
            for _ in range(args.runs)]
    topo = Topology(f"emulated-{args.ranks}", args.ranks, 1, IntraLink("none", 1e12, 0.0),
                    Network("ethernet", 1, parse_rate(args.bandwidth), BRIDGE_LATENCY_S))
    rows = []
    for op in ("allreduce", "allgather", "broadcast"):
        for size in sizes:
            measured = [float(r[op][str(size)] if str(size) in r[op] else r[op][size]) for r in runs]
            nbytes = size * SIZE_FACTOR[op](args.ranks)
            row = {"op": op, "bytes_per_rank": size, "bytes": nbytes, "runs": len(measured),
                   "median_ms": 1e3 * statistics.median(measured), "min_ms": 1e3 * min(measured),
                   "max_ms": 1e3 * max(measured)}
            for lib in ("gloo", "ideal"):
                res = price_collective(topo.with_overrides(library=lib), op, "auto", nbytes, ("analytic",))[0]
                row[f"{lib}_ms"] = 1e3 * res.time_s
                row[f"{lib}_algo"] = res.algo
                row[f"{lib}_error"] = res.time_s * 1e3 / row["median_ms"] - 1
            rows.append(row)
            print(f"{op:10} {size:>9,} B/rank  measured {row['median_ms']:8.3f} ms ({row['min_ms']:.3f}–"
                  f"{row['max_ms']:.3f})  gloo {row['gloo_ms']:8.3f} ({100 * row['gloo_error']:+.0f}%)  "
                  f"ideal {row['ideal_ms']:8.3f} ({100 * row['ideal_error']:+.0f}%)")
    for lib in ("gloo", "ideal"):
        mape = 100 * statistics.mean(abs(r[f"{lib}_error"]) for r in rows)
        inside = sum(r["min_ms"] <= r[f"{lib}_ms"] <= r["max_ms"] for r in rows)
        print(f"{lib}: MAPE over medians {mape:.1f} %, {inside} of {len(rows)} predictions inside the measured spread")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
