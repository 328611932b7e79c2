"""Wall time of `arcsim run` with all candidates, and where it goes (goals: default trace < 15 s, ResNet-50 < 60 s).

Runs the real command in a subprocess for the shipped default trace and, if present (or with
--capture), traces/resnet50.npz, then prints wall time next to the goal and the analysis's own breakdown.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arcsim.traces.resolve import trace_dir

CASES = (("default trace (cnn-digits-small)", None, 15.0), ("resnet50.npz", "resnet50.npz", 60.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--capture", action="store_true", help="capture resnet50.npz first if it is missing")
    args = ap.parse_args()
    for label, trace, goal in CASES:
        if trace and not (trace_dir() / trace).exists() and not args.capture:
            print(f"{label}: skipped (not captured; pass --capture)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run.json"
            cmd = [sys.executable, "-m", "arcsim", "run", "--json", str(out)] + (["--trace", trace] if trace else [])
            started = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            wall = time.perf_counter() - started
            res = json.loads(out.read_text())
        verdict = "ok" if wall < goal else f"MISSED by {wall / goal - 1:.0%}"
        print(f"{label}: {wall:.1f} s wall (goal < {goal:g} s: {verdict}); "
              f"{len(res['pareto']['evaluated'])} grid points, {len(res['candidates'])} candidates")
        timings = res["timings_s"]
        measured = {k: v for k, v in timings.items() if k.startswith("measure ")}
        print(f"  running compressors on the trace: {sum(measured.values()):.1f} s over {len(measured)} runs; "
              "slowest:")
        for key, value in sorted(measured.items(), key=lambda kv: -kv[1])[:6]:
            print(f"    {key.removeprefix('measure '):<40} {value:6.1f} s")
        rest = {k: v for k, v in timings.items() if not k.startswith("measure ")}
        for key, value in rest.items():
            print(f"  {key}: {value:.1f} s")
        print(f"  start-up, trace reading and rendering: {wall - sum(timings.values()):.1f} s")


if __name__ == "__main__":
    main()
