"""Run in spawned gloo processes: every compressor × memory through DistributedComm vs InProcessComm."""

from __future__ import annotations

import sys

import torch.distributed as dist
from _rank_report import report_and_leave  # a sibling script: its folder is on the path

from arcsim.comm.distributed import DistributedComm
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.memory import MEMORIES, make_memory
from arcsim.compressors.registry import NAMES, make_compressor
from arcsim.traces.synthetic import synthetic_steps

D, STEPS, DENSITY = 3000, 3, 0.05


def compare(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = {}
    for name in NAMES:
        for memory in MEMORIES:
            comp_d, comp_r = (make_compressor(name, DENSITY, seed=7) for _ in range(2))
            mem_d, mem_r = make_memory(memory), make_memory(memory)
            comm_d, comm_r = DistributedComm(), InProcessComm(world)
            worst = 0.0
            for step, g in synthetic_steps("correlated", world, D, STEPS, seed=3):
                mine = mem_d.step(g[rank:rank + 1].clone(), comp_d, comm_d, step)
                ref = mem_r.step(g.clone(), comp_r, comm_r, step)
                worst = max(worst, float((mine - ref).norm() / ref.norm().clamp_min(1e-30)))
            same_log = [(r.op, r.tag, r.elements, r.dtype) for r in comm_d.log.records] == \
                       [(r.op, r.tag, r.elements, r.dtype) for r in comm_r.log.records]
            report[f"{name}/{memory}"] = {"rel_diff": worst, "same_log": same_log}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    compare(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
