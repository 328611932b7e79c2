"""Local work of each compressor (no network), next to torch.topk and one read pass, as ratios.

Goals (issue #3, on an H100): arctopk ≤ 0.5× torch.topk, gaussiank ≤ 0.6×, each within 4× of one read
pass. Also measures scratch memory: peak extra bytes over the input, in units of one worker's bucket
(d × 4 B), for one worker (W = 1) and for P = 4 workers stacked in one process.

Usage: python benchmarks/compress_speed.py [--device cpu|cuda] [--sizes 25.6e6,110e6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from arcsim.compressors import make_compressor

NAMES = ("topk", "gaussiank", "arctopk", "randk", "star", "var", "powersgd", "fp16", "dense")
DENSITY = 0.01


class LocalComm:
    """Collectives without a network: a reduction returns the local row, a gather repeats it P times."""

    def __init__(self, world: int, local: int) -> None:
        self.world_size, self.local_workers = world, local

    def all_reduce(self, t, op="mean", tag=""):
        return t[0:1]

    def all_gather(self, t, tag=""):
        return t[0:1].unsqueeze(1).expand(1, self.world_size, *t.shape[1:])

    def broadcast(self, t, src, tag=""):
        return t[0:1]

    def local_index(self, rank):
        return rank if rank < self.local_workers else None

    def global_ranks(self):
        return torch.arange(self.local_workers)


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
        comm = LocalComm(8, 1)
        base_topk = timed(lambda x=x, d=d: x.abs().topk(max(1, int(DENSITY * d)), dim=1, sorted=False), device,
                          repeats)
        read = timed(lambda x=x: x.abs().amax(), device, repeats)
        table.add_row(f"{d:,}", "torch.topk(|x|)", f"{base_topk * 1e3:.2f}", "1.00", f"{base_topk / read:.2f}")
        table.add_row(f"{d:,}", "read pass |x|.amax()", f"{read * 1e3:.2f}", f"{read / base_topk:.2f}", "1.00")
        for name in NAMES:
            comp = make_compressor(name, DENSITY, seed=0)
            step = [0]

            def run(comp=comp, x=x, step=step, comm=comm):
                comp.compress(x, comm, step[0])
                step[0] += 1

            t = timed(run, device, repeats)
            table.add_row(f"{d:,}", name, f"{t * 1e3:.2f}", f"{t / base_topk:.2f}", f"{t / read:.2f}")
        del x
    return table


def _peak_child(name: str, workers: int, d: int, queue) -> None:
    x = torch.randn(workers, d)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    comp = make_compressor(name, DENSITY, seed=0)
    comp.compress(x, LocalComm(workers, workers), 0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put((after - before) * 1024)


def memory_table(d: int) -> Table:
    table = Table(title=f"Scratch memory (peak RSS over the input, CPU), d = {d:,}, in units of d × 4 B")
    for col in ("method", "W = 1", "W = 4 stacked"):
        table.add_column(col, justify="right")
    ctx = mp.get_context("fork")
    for name in NAMES:
        cells = []
        for workers in (1, 4):
            queue = ctx.Queue()
            proc = ctx.Process(target=_peak_child, args=(name, workers, d, queue))
            proc.start()
            extra = queue.get()
            proc.join()
            cells.append(f"{extra / (4 * d):.2f}")
        table.add_row(name, *cells)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="25.6e6,110e6")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--memory-elements", type=float, default=4e6)
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    console = Console(width=120)
    console.print(speed_table(args.device, [int(float(s)) for s in args.sizes.split(",")], args.repeats))
    if not args.no_memory:
        console.print(memory_table(int(args.memory_elements)))


if __name__ == "__main__":
    main()
