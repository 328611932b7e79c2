"""LLaMA-60M on real text, end to end on this machine: capture time and peak memory, then `arcsim run` on a
fresh cache and again from it (goals, issue 27: capture of 4 workers × 2 steps < 90 s; peak resident memory
below twice one step of every worker's fp32 gradients plus the model's training state; run < 60 s cold,
< 5 s cached on another topology).

    python benchmarks/llama_speed.py [--model llama_60m] [--workers 4] [--steps 2]

Each part runs the real command in a subprocess; peak memory is the child's maximum resident set.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_speed import timed_run

from arcsim.models import MODELS

CAPTURE_GOAL, RUN_GOAL, RERUN_GOAL = 90.0, 60.0, 5.0
RERUN = ["--topology", "4x8-eth25-a100"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama_60m")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    params = MODELS[args.model].reference_params or 0
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cache:
        trace = Path(tmp) / f"{args.model}.npz"
        env = {**os.environ, "ARCSIM_CACHE_DIR": cache}
        subprocess.run([sys.executable, "-m", "arcsim", "trace", "info", "--no-capture", "--no-stats"], env=env,
                       capture_output=True)  # start-up paid once, outside the timing
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "arcsim", "trace", "capture", "--model", args.model, "-w",
                        str(args.workers), "-s", str(args.steps), "-o", str(trace)], check=True, env=env,
                       capture_output=True)
        wall = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        step = args.workers * params * 4
        state = params * 4 * 5  # parameters, gradients, their average, AdamW's two moments
        verdict = "ok" if wall < CAPTURE_GOAL else f"MISSED by {wall / CAPTURE_GOAL - 1:.0%}"
        print(f"capture {args.model} ({params:,} parameters), {args.workers} workers × {args.steps} steps on real "
              f"text: {wall:.1f} s wall (goal < {CAPTURE_GOAL:g} s: {verdict}; the first run also trains the "
              "tokenizer)")
        print(f"  peak resident {peak / 1e9:.2f} GB; one step of every worker's fp32 gradients {step / 1e9:.2f} GB, "
              f"training state {state / 1e9:.2f} GB: peak / (2 × step + state) = {peak / (2 * step + state):.2f}")
        cold, res = timed_run(["--trace", str(trace)], cache)
        again, _ = timed_run(["--trace", str(trace), *RERUN], cache)
        for label, seconds, goal in (("run, fresh cache", cold, RUN_GOAL), (f"run {' '.join(RERUN)}, cached", again,
                                                                             RERUN_GOAL)):
            verdict = "ok" if seconds < goal else f"MISSED by {seconds / goal - 1:.0%}"
            print(f"{label}: {seconds:.1f} s (goal < {goal:g} s: {verdict})")
        measured = {k: v for k, v in res["timings_s"].items() if k.startswith("measure ")}
        print(f"  running compressors on the gradients: {sum(measured.values()):.1f} s of {cold:.1f} s; slowest: "
              + ", ".join(f"{k.removeprefix('measure ')} {v:.1f} s"
                          for k, v in sorted(measured.items(), key=lambda kv: -kv[1])[:4]))


if __name__ == "__main__":
    main()
