"""A 1,000-point `arcsim sweep` on a Dask LocalCluster of 1 worker and of 2 (one per core here), through the
same `--scheduler` path a real cluster uses; prints wall time and points/s of each and their ratio.

1,000 points: 5 compressors × 5 densities × 8 bandwidths × 5 rank counts over the shipped trace.
Run: python benchmarks/sweep_dask.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from dask.distributed import LocalCluster

SWEEP = ["-c", "topk,arctopk,randk,star,powersgd", "-d", "0.001,0.003,0.01,0.03,0.1",
         "-b", "1Gbit,5Gbit,10Gbit,25Gbit,50Gbit,100Gbit,200Gbit,400Gbit", "--ranks", "16,32,64,128,256",
         "--no-plots"]
POINTS = 5 * 5 * 8 * 5


def main() -> None:
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster:
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "arcsim", "-q", "sweep", *SWEEP, "--scheduler",
                                cluster.scheduler_address, "-o", f"{tmp}/sweep-{workers}"], check=True)
                took = time.perf_counter() - started
            rates[workers] = POINTS / took
            print(f"{POINTS} points on {workers} Dask worker(s): {took:6.1f} s, {rates[workers]:5.1f} points/s")
    print(f"2 workers / 1 worker: {rates[2] / rates[1]:.2f}× the points per second")


if __name__ == "__main__":
    main()
