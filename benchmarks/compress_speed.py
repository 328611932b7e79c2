"""Local work of each compressor (no network), next to torch.topk and one read pass, as ratios.

Goals (issue #3, on an H100): arctopk ≤ 0.5× torch.topk, gaussiank ≤ 0.6×, each within 4× of one read
pass. Also measures scratch memory: peak extra bytes over the input, in units of one worker's bucket
(d × 4 B), for one worker (W = 1) and for P = 4 workers stacked in one process.

Usage: python benchmarks/compress_speed.py [--device cpu|cuda] [--sizes 25.6e6,110e6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.solo import SoloComm
from arcsim.compressors.registry import make_compressor

NAMES = ("topk", "gaussiank", "arctopk", "randk", "star", "var", "powersgd", "fp16", "dense")
DENSITY = 0.01


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> float:
    fn()  # warm-up
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def speed_table(device: str, sizes: list[int], repeats: int) -> Table:
    table = Table(title=f"Compressor local work on {device} ({torch.__version__}), density {DENSITY}, "
                        f"median of {repeats}")
    for col in ("elements", "method", "ms", "÷ torch.topk", "÷ read pass"):
        table.add_column(col, justify="right")
    for d in sizes:
        x = torch.randn(1, d, device=device)
        comm = SoloComm(8)
        base_topk = timed(lambda x=x, d=d: x.abs().topk(max(1, int(DENSITY * d)), dim=1, sorted=False), device,
                          repeats)
        read = timed(lambda x=x: x.abs().amax(), device, repeats)
        table.add_row(f"{d:,}", "torch.topk(|x|)", f"{base_topk * 1e3:.2f}", "1.00", f"{base_topk / read:.2f}")
        table.add_row(f"{d:,}", "read pass |x|.amax()", f"{read * 1e3:.2f}", f"{read / base_topk:.2f}", "1.00")
        cases = [(name, name, comm) for name in NAMES if name != "star"]
        cases[3:3] = [("star", "star (leader)", SoloComm(8, leader=True)),
                      ("star", "star (other ranks)", comm)]
        for name, label, where in cases:
            comp = make_compressor(name, DENSITY, seed=0)
            step = [1]  # steps 1..7 of every 8: rank 0 is not round-robin leader then

            def run(comp=comp, x=x, step=step, where=where):
                comp.compress(x, where, step[0])
                step[0] = step[0] % 7 + 1

            t = timed(run, device, repeats)
            table.add_row(f"{d:,}", label, f"{t * 1e3:.2f}", f"{t / base_topk:.2f}", f"{t / read:.2f}")
        del x
    return table


def _high_water_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _peak_child(name: str, workers: int, d: int, queue) -> None:
    x = torch.randn(workers, d)
    comp = make_compressor(name, DENSITY, seed=0)
    comm = SoloComm(8) if workers == 1 else InProcessComm(workers)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
    before = _high_water_bytes()
    comp.compress(x, comm, 0)
    queue.put(_high_water_bytes() - before)


def memory_table(d: int) -> Table:
    table = Table(title=f"Scratch memory: peak RSS during compress() over the input, CPU, d = {d:,} per worker, "
                        "in units of one worker's bucket (d × 4 B)")
    for col in ("method", "W = 1 (one rank)", "W = 4 stacked in-process"):
        table.add_column(col, justify="right")
    ctx = mp.get_context("spawn")  # fork after torch starts its thread pool can hang
    for name in NAMES:
        cells = []
        for workers in (1, 4):
            queue = ctx.Queue()
            proc = ctx.Process(target=_peak_child, args=(name, workers, d, queue))
            proc.start()
            proc.join(timeout=600)
            cells.append(f"{queue.get() / (4 * d):.2f}" if proc.exitcode == 0 else f"failed ({proc.exitcode})")
        table.add_row(name, *cells)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="25.6e6,110e6")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--memory-elements", type=float, default=25.6e6)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    console = Console(width=120, force_terminal=False)
    if not args.no_speed:
        console.print(speed_table(args.device, [int(float(s)) for s in args.sizes.split(",")], args.repeats))
    if not args.no_memory:
        console.print(memory_table(int(args.memory_elements)))


if __name__ == "__main__":
    main()
