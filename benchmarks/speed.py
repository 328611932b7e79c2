"""Wall time of the README's main example, `arcsim run` (the shipped trace on 8x8-ib100), on this machine: cold
(a fresh measurement cache in a temporary folder) and cached (the same command again on that cache), each
the real command in a subprocess; and, where a LLaMA-60M trace is at hand (--llama FILE, or llama_60m.npz
among the generated traces), the same for it on 4x8-eth25-a100. Goals: main example ≤ 15 s cold (issue 40);
LLaMA-60M (4 workers × 2 steps) ≤ 20 s cold, ≤ 2 s cached (issue 51; issue 40's were 60 s and 5 s). Then every
bad argument of tests/test_bad_input.py through the real entry point (best of two each; goal, issue 51: ≤ 0.5 s).

    python benchmarks/speed.py [--repeat N] [--llama FILE] [--no-bad-arguments]

No capture is started here (a LLaMA-60M capture on a 2-core CPU takes longer than this benchmark should):
without a trace the LLaMA case is printed as skipped. ARCSIM_MEASURE_PROCESSES=1 in the environment measures
without processes side by side (to compare).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_speed import timed_run  # the same subprocess run and its JSON, beside this script

from arcsim.files import generated_traces_dir

GOALS = {"main example": (15.0, None), "LLaMA-60M": (20.0, 2.0)}  # cold, cached (s)
BAD_ARGUMENT_GOAL = 0.5  # s, issue 51


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


def bad_arguments() -> None:
    """Every bad argument of tests/test_bad_input.py through `arcsim`, best of two: the median, the slowest, and
    each one over BAD_ARGUMENT_GOAL."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import test_bad_input as cases

    beside = Path(sys.executable).with_name("arcsim")  # this interpreter's entry point, else the PATH's
    arcsim = str(beside) if beside.exists() else shutil.which("arcsim") or "arcsim"
    with tempfile.TemporaryDirectory() as tmp:
        inputs = cases._inputs(Path(tmp))
        timed = []
        for args, _ in cases.CASES + cases.BEFORE_TORCH:
            argv = [arcsim, *(a.format(**inputs) for a in args)]
            best = math.inf
            for _ in range(2):
                started = time.perf_counter()
                done = subprocess.run(argv, capture_output=True, cwd=tmp, timeout=120)
                best = min(best, time.perf_counter() - started)
                if done.returncode != 2:  # a case no longer refused ran real work: its time means nothing here
                    raise SystemExit(f"arcsim {' '.join(args)} exited {done.returncode}, not 2")
            timed.append((best, " ".join(args)))
    slow = sorted((t for t in timed if t[0] > BAD_ARGUMENT_GOAL), reverse=True)
    print(f"bad arguments: {len(timed)} answered, median {statistics.median(t for t, _ in timed):.2f} s, slowest "
          f"{max(t for t, _ in timed):.2f} s; {len(timed) - len(slow)} of {len(timed)} within the goal "
          f"(≤ {BAD_ARGUMENT_GOAL:g} s)")
    for seconds, args in slow:
        print(f"  {seconds:.2f} s  arcsim {args}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (the best and the median are printed)")
    ap.add_argument("--llama", type=Path, default=None, help="a LLaMA-60M trace (default: llama_60m.npz among "
                                                              "the generated traces, if there)")
    ap.add_argument("--no-bad-arguments", action="store_true", help="skip timing the bad arguments")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores; python {sys.version.split()[0]}")
    case("main example", [], args.repeat)
    llama = args.llama or generated_traces_dir() / "llama_60m.npz"
    if llama.exists():
        case("LLaMA-60M", ["--trace", str(llama), "-t", "4x8-eth25-a100"], 1)
    else:
        print(f"LLaMA-60M: skipped (no trace at {llama}; `arcsim trace capture --model llama_60m -o {llama}` "
              "takes too long to start from here)")
    if not args.no_bad_arguments:
        bad_arguments()


if __name__ == "__main__":
    main()
