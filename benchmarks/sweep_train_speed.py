"""Wall time of a 100-point `arcsim sweep` over the default trace and of the default `arcsim train`
(goals: each under 5 minutes on the 2-core machine), measured by running the real commands.

The sweep is 5 compressors × 4 densities × 5 bandwidths = 100 points, run once with one process and
once with one per core, side by side; it prints points/s for each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

SWEEP = ["-c", "topk,arctopk,randk,star,powersgd", "-d", "0.001,0.003,0.01,0.1",
         "-b", "1Gbit,10Gbit,25Gbit,100Gbit,400Gbit", "--no-plots"]
GOAL_S = 300.0


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "arcsim", *args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for workers in ("1", str(os.cpu_count() or 1)):
            took = timed(["sweep", *SWEEP, "-j", workers, "-o", f"{tmp}/sweep-{workers}"])
            print(f"sweep, 100 points, {workers} process(es): {took:6.1f} s  {100 / took:5.2f} points/s  "
                  f"(goal < {GOAL_S:.0f} s: {'met' if took < GOAL_S else 'MISSED'})")
        took = timed(["train", "-o", f"{tmp}/train"])
        print(f"train, default (cnn on digits, 8 workers, 5 compressors, 300 steps): {took:6.1f} s  "
              f"(goal < {GOAL_S:.0f} s: {'met' if took < GOAL_S else 'MISSED'})")
        took = timed(["train", "--topology", "8x1-eth1", "--seeds", "0,1,2", "--target", "0.95", "-o",
                      f"{tmp}/train3"])
        print(f"train, 3 seeds priced on 8x1-eth1: {took:6.1f} s")


if __name__ == "__main__":
    main()
