"""Peak RSS of processing a ≥ 1 GB trace, which the loader streams one step at a time (goal: < 1.5 GB).

Writes a trace of random fp32 gradients (default 4 steps × 8 workers × 8.4 M elements = 1.07 GB) with
the streaming writer, then runs `arcsim trace info` and `arcsim compress --trace` on it under
/usr/bin/time -v and prints each command's peak RSS next to the file size. ``--trace FILE`` measures an
existing trace instead (e.g. traces/resnet50.npz).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from arcsim.compressors.layout import Layer
from arcsim.traces.format import SCHEMA_VERSION, TraceWriter

GOAL = 1.5e9


def write_synthetic(path: Path, steps: int, workers: int, elements: int) -> None:
    meta = {"schema_version": SCHEMA_VERSION, "model": "random", "dataset": "gaussian noise",
            "synthetic_data": True, "params": elements, "batch_per_worker": 0, "workers": workers, "steps": steps,
            "recorded_steps": list(range(steps)), "dtype": "fp32", "device": "cpu", "torch_version": torch.__version__,
            "seed": 0, "command": "benchmarks/trace_memory.py"}
    half = elements // 2
    gen = torch.Generator().manual_seed(0)
    with TraceWriter(path, meta, (Layer("a", (half,), 0), Layer("b", (elements - half,), half)), "fp32") as w:
        for _ in range(steps):
            w.write_step(torch.randn(workers, elements, generator=gen), [0.0] * workers, 0.0, 0.0, [0.0, 0.0])


def peak_rss(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in bytes, wall seconds) of one command."""
    out = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, check=True)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1)) * 1024
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", out.stderr).group(1)
    return rss, sum(float(part) * 60**i for i, part in enumerate(reversed(wall.split(":"))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=None, help="measure this trace instead of a synthetic one")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--elements", type=float, default=8.4e6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace
        if path is None:
            path = Path(tmp) / "big.npz"
            write_synthetic(path, args.steps, args.workers, int(args.elements))
        size = path.stat().st_size
        print(f"trace {path.name}: {size / 1e9:.2f} GB on disk; goal: peak RSS < {GOAL / 1e9:.1f} GB")
        print(f"{'command':<48} {'peak RSS':>10} {'RSS / file':>11} {'wall':>8}")
        arcsim = [sys.executable, "-m", "arcsim"]
        for label, argv in (("import arcsim.cli.main (baseline)", [sys.executable, "-c", "import arcsim.cli.main"]),
                            ("arcsim trace info --json", [*arcsim, "trace", "info", str(path), "--json", os.devnull]),
                            ("arcsim compress -c topk --trace", [*arcsim, "compress", "-c", "topk", "--trace",
                                                                 str(path), "--json", os.devnull])):
            rss, wall = peak_rss(argv)
            verdict = "ok" if rss < GOAL else f"MISSED by {rss / GOAL - 1:.0%}"
            print(f"{label:<48} {rss / 1e9:>8.2f} GB {rss / size:>11.2f} {wall:>7.1f}s  {verdict}")

if __name__ == "__main__":
    main()
