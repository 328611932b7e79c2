"""Run in spawned gloo processes: the quantisers and the sign family as DDP comm hooks against the in-process
simulation of the same buckets, and the bytes the real run's CommLog holds."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _ddp_check import hook_against_in_process  # a sibling script: its folder is on the path
from _rank_report import report_and_leave  # a sibling script: its folder is on the path

from arcsim.catalog import INFO

NAMES = ("qsgd", "terngrad", "natural", "signsgd", "signum", "efsignsgd")
STEPS = 3  # signum's momentum and efsignsgd's error feedback carry over steps


def check(name: str, rank: int, world: int) -> dict:
    worst, state, seen = hook_against_in_process(name, rank, world, INFO[name].default_memory, STEPS)
    records = [(r.op, r.tag, r.dtype, r.bytes_per_rank, r.total_bytes) for r in state.comm.log.records]
    sizes = [inp.numel() for _, _, _, inp, _ in seen]
    return {"rel_diff": worst, "records": records, "sizes": sizes, "steps": state.step}


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = {name: check(name, rank, world) for name in NAMES}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
