"""The packed compressors' (quantisers, signs, 1-bit Adam, ZeRO++'s quantised reductions) compress() on one rank of
P = 8 (SoloComm: every peer's payload decoded), median of --repeats after a warm-up: CUDA events on a GPU, the
host clock on a CPU; --profile NAME adds torch.profiler's op table for that compressor. Run it from two checkouts
to compare code (benchmarks/results/h200/2026-11-27-measure/README.md).

Usage: python benchmarks/packed_speed.py [--device cpu|cuda] [--numel 25557032] [--repeats 10] [--json FILE]
                                         [--profile signsgd]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from arcsim.comm.solo import SoloComm
from arcsim.compressors.registry import make_compressor

NAMES = ("qsgd", "terngrad", "natural", "signsgd", "signum", "efsignsgd", "onebit", "rs-bf16", "rs-int8", "qgz",
         "rs-int8-ring", "qgz4")


def median_ms(fn, device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--numel", type=int, default=25_557_032)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    x = torch.randn(1, args.numel, device=device, generator=torch.Generator(device=device).manual_seed(0))
    rows = {}
    for name in NAMES:
        comp, comm, step = make_compressor(name, 0.01, seed=0), SoloComm(8, leader=True), [1]

        def run(comp=comp, comm=comm, step=step):
            step[0] += 1
            return comp.compress(x, comm, step[0], None)

        rows[name] = median_ms(run, device, args.repeats)
        print(f"{name:13s} {rows[name]:9.3f} ms", flush=True)
        if name == args.profile:
            with torch.profiler.profile() as prof:
                run()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=12), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": str(device), "numel": args.numel, "peers": 8,
                                         "torch": torch.__version__, "ms": rows}, indent=1))


if __name__ == "__main__":
    main()
