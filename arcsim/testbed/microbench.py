"""One rank of the collective microbenchmark (run by `arcsim calibrate`, one process per rank).

    python -m arcsim.testbed.microbench OUT.json SIZES REPEATS [GPUS_PER_NODE [GAP_S]]   # env: RANK, WORLD_SIZE, …

For every collective and size (bytes each rank contributes): a barrier, then (after GAP_S seconds of busy
CPU and idle network, as training computes between collectives) the collective timed on every rank; the slowest rank's
time (an all-reduce MAX) is the collective's. Rank 0 writes the medians.
With ranks numbered node by node, GPUS_PER_NODE > 1 also measures the groups node-aware compression uses,
each as it runs in training — every group at once: inside each node (``node``: the dense reduce-scatter and
all-gather) and along each rail of one rank per node (``inter``: the compressors' collectives).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from arcsim.comm.distributed import gather_into, run_gloo_job, scatter_from

OPS = ("allreduce", "allgather", "broadcast")
GROUP_OPS = {"node": ("reducescatter", "allgather"), "inter": OPS}  # what node-aware compression runs in each
WARMUP = 2


def _run(op: str, t: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None, root: int) -> None:
    if op == "allreduce":
        dist.all_reduce(t, group=group)
    elif op == "allgather":
        gather_into(out, t, group=group)
    elif op == "reducescatter":
        scatter_from(out, t, group=group)
    else:
        dist.broadcast(t, src=root, group=group)


def measure(sizes: list[int], repeats: int, ops: tuple[str, ...] = OPS, group: dist.ProcessGroup | None = None,
            root: int = 0, gap_s: float = 0.0) -> dict[str, dict[str, list[float]]]:
    """Seconds per repeat of each op and size (bytes each rank puts in) in ``group`` (every rank's world
    when None; ``root``: the broadcast's source, a global rank in the group), the slowest rank's; ``gap_s``
    busy between the barrier and the collective (the network idle)."""
    ranks = dist.get_world_size(group)
    result: dict[str, dict[str, list[float]]] = {}
    for op in ops:
        result[op] = {}
        for size in sizes:
            t = torch.ones(max(1, size // 4 // ranks) * ranks if op == "reducescatter" else max(1, size // 4))
            out = torch.empty(t.numel() // ranks if op == "reducescatter" else t.numel() * ranks)
            times = []
            for i in range(WARMUP + repeats):
                dist.barrier()
                busy_until = time.perf_counter() + gap_s
                while time.perf_counter() < busy_until:  # busy, as a rank computing between collectives is
                    pass
                started = time.perf_counter()
                _run(op, t, out, group, root)
                took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if i >= WARMUP:
                    times.append(float(took))
            result[op][str(t.numel() * 4)] = times
    return result


def measure_groups(sizes: list[int], repeats: int, gpus_per_node: int) -> dict[str, dict]:
    """The node and rail groups' collectives (ranks numbered node by node), every group of a kind at once."""
    rank, world, g = dist.get_rank(), dist.get_world_size(), gpus_per_node
    nodes = [dist.new_group(list(range(j * g, (j + 1) * g))) for j in range(world // g)]
    rails = [dist.new_group(list(range(r, world, g))) for r in range(g)]
    mine = {"node": (nodes[rank // g], rank // g * g, g), "inter": (rails[rank % g], rank % g, world // g)}
    return {name: {"ranks": size, "median_s": _medians(measure(sizes, repeats, GROUP_OPS[name], group, root))}
            for name, (group, root, size) in mine.items()}


def _medians(result: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {op: {size: statistics.median(ts) for size, ts in by.items()} for op, by in result.items()}


def results(sizes: list[int], repeats: int, gpus_per_node: int = 1, gap_s: float = 0.0) -> dict:
    """Every rank measures; what rank 0 writes: the world's medians and samples, and the groups' medians."""
    result = measure(sizes, repeats, gap_s=gap_s)
    groups = measure_groups(sizes, repeats, gpus_per_node) if gpus_per_node > 1 else {}
    return {"world": dist.get_world_size(), "median_s": _medians(result), "samples_s": result,
            **({"groups": groups} if groups else {})}


def main() -> None:
    out, sizes, repeats = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    gpus_per_node = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    gap_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0

    def work() -> None:
        measured = results(sizes, repeats, gpus_per_node, gap_s)
        if dist.get_rank() == 0:
            with open(out, "w") as fh:
                json.dump(measured, fh)

    run_gloo_job(work)


if __name__ == "__main__":
    main()
