"""One rank of the collective microbenchmark (run by `arcsim calibrate`, one process per rank).

    python -m arcsim.testbed.microbench OUT.json SIZES REPEATS    # env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT

For every collective and size (bytes each rank contributes): a barrier, then the collective timed on
every rank; the slowest rank's time (an all-reduce MAX) is the collective's. Rank 0 writes the medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from arcsim.comm.distributed import gather_into, run_gloo_job

OPS = ("allreduce", "allgather", "broadcast")
WARMUP = 2


def _run(op: str, t: torch.Tensor, out: torch.Tensor) -> None:
    if op == "allreduce":
        dist.all_reduce(t)
    elif op == "allgather":
        gather_into(out, t)
    else:
        dist.broadcast(t, src=0)


def measure(sizes: list[int], repeats: int) -> dict[str, dict[str, list[float]]]:
    world = dist.get_world_size()
    result: dict[str, dict[str, list[float]]] = {}
    for op in OPS:
        result[op] = {}
        for size in sizes:
            t = torch.ones(max(1, size // 4))
            out = torch.empty(t.numel() * world)
            times = []
            for i in range(WARMUP + repeats):
                dist.barrier()
                started = time.perf_counter()
                _run(op, t, out)
                took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if i >= WARMUP:
                    times.append(float(took))
            result[op][str(t.numel() * 4)] = times
    return result


def main() -> None:
    out, sizes, repeats = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])

    def work() -> None:
        result = measure(sizes, repeats)
        if dist.get_rank() == 0:
            with open(out, "w") as fh:
                json.dump({"world": dist.get_world_size(), "median_s": {
                    op: {size: statistics.median(ts) for size, ts in by.items()} for op, by in result.items()},
                    "samples_s": result}, fh)

    run_gloo_job(work)


if __name__ == "__main__":
    main()
