"""Wall time of the README's main example, `arcsim run` (the shipped trace on 8x8-ib100), on this machine: cold
(a fresh measurement cache in a temporary folder) and cached (the same command again on that cache), each
the real command in a subprocess; and, where a LLaMA-60M trace is at hand (--llama FILE, or llama_60m.npz
among the generated traces), the same for it on 4x8-eth25-a100. Goals (issue 40): main example ≤ 15 s cold;
LLaMA-60M (4 workers × 2 steps) ≤ 60 s cold, ≤ 5 s cached.

    python benchmarks/speed.py [--repeat N] [--llama FILE]

No capture is started here (a LLaMA-60M capture on a 2-core CPU takes longer than this benchmark should):
without a trace the LLaMA case is printed as skipped. ARCSIM_MEASURE_PROCESSES=1 in the environment measures
without processes side by side (to compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from run_speed import timed_run  # the same subprocess run and its JSON, beside this script

from arcsim.files import generated_traces_dir

GOALS = {"main example": (15.0, None), "LLaMA-60M": (60.0, 5.0)}  # cold, cached (s)


def verdict(seconds: float, goal: float) -> str:
    return f"goal ≤ {goal:g} s: " + ("ok" if seconds <= goal else f"MISSED by {seconds / goal - 1:.0%}")


def case(label: str, args: list[str], repeat: int) -> None:
    cold, cached = [], []
    result: dict = {}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as cache:
            wall, result = timed_run(args, cache)
            cold.append(wall)
            cached.append(timed_run(args, cache)[0])
    goal, cached_goal = GOALS[label]
    print(f"{label}: cold {min(cold):.1f} s (median {statistics.median(cold):.1f} s of {repeat}; "
          f"{verdict(min(cold), goal)}), cached {min(cached):.1f} s (median {statistics.median(cached):.1f} s"
          + (f"; {verdict(min(cached), cached_goal)})" if cached_goal else ")"))
    timings = result.get("timings_s", {})
    measured = {k: v for k, v in timings.items() if k.startswith("measure ")}
    ahead = timings.get("measured side by side (runs)")
    print(f"  last cold run: {len(measured)} measurements, {sum(measured.values()):.1f} s of work, "
          f"{timings.get('measuring, wall', sum(measured.values())):.1f} s wall"
          + (f" ({ahead:.0f} side by side on {timings['measured side by side (processes)']:.0f} processes)"
             if ahead else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (the best and the median are printed)")
    ap.add_argument("--llama", type=Path, default=None, help="a LLaMA-60M trace (default: llama_60m.npz among "
                                                              "the generated traces, if there)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; python {sys.version.split()[0]}")
    case("main example", [], args.repeat)
    llama = args.llama or generated_traces_dir() / "llama_60m.npz"
    if llama.exists():
        case("LLaMA-60M", ["--trace", str(llama), "-t", "4x8-eth25-a100"], 1)
    else:
        print(f"LLaMA-60M: skipped (no trace at {llama}; `arcsim trace capture --model llama_60m -o {llama}` "
              "takes too long to start from here)")


if __name__ == "__main__":
    main()
