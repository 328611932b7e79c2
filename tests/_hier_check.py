"""Run in spawned gloo processes (4 ranks as 2 nodes × 2): the node-aware DDP hook path against the in-process
simulation (arcsim.compressors.hierarchy) on the same gradients, for every compressor."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _rank_report import report_and_leave  # a sibling script: its folder is on the path

from arcsim.compressors.grouping import Grouping, slice_seed
from arcsim.compressors.hierarchy import NodeAware
from arcsim.compressors.layout import Layer
from arcsim.compressors.memory import make_memory
from arcsim.compressors.registry import NAMES, make_compressor
from arcsim.hooks import CompressionState, compress_bucket, node_groups
from arcsim.run.measure import default_memory
from arcsim.traces.synthetic import synthetic_steps

GPUS, D, STEPS, DENSITY, BUCKET = 2, 1001, 3, 0.05, 3
LAYOUT = (Layer("w", (20, 30), 0), Layer("b", (20,), 600), Layer("v", (381,), 620))


def compare(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = node_groups(GPUS)
    report = {"local_rank": groups.local_rank, "nodes": groups.nodes}
    for name in NAMES:
        memory = default_memory(name)
        state = CompressionState(name, DENSITY, memory, seed=5, nodes=groups)
        sim = NodeAware(Grouping(world // GPUS, GPUS, GPUS), D, LAYOUT,
                        lambda g, name=name, memory=memory: (
                            make_compressor(name, DENSITY, seed=slice_seed(5, BUCKET, g)), make_memory(memory)))
        worst, same_log = 0.0, True
        for step, g in synthetic_steps("correlated", world, D, STEPS, seed=3):
            mark = len(state.comm.log.records)
            mine = compress_bucket(state, BUCKET, g[rank].clone(), LAYOUT)
            state.step += 1
            ref, records, _ = sim.step(g.clone(), step)
            worst = max(worst, float((mine - ref[0]).norm() / ref.norm().clamp_min(1e-30)))
            logged = state.comm.log.records[mark:]
            # the simulation logs the first rail's exchange (slice 0), which local rank 0 runs
            same_log &= [(r.op, r.group, r.tag, r.elements, r.dtype) for r in logged] == \
                        [(r.op, r.group, r.tag, r.elements, r.dtype) for r in records]
        report[name] = {"rel_diff": worst, "same_log": same_log}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    torch.set_num_threads(1)
    compare(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
