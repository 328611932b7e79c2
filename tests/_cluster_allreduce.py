"""One rank of a gloo all-reduce across the emulated cluster (env from EmulatedCluster.env)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.full((1000,), float(dist.get_rank() + 1))
dist.all_reduce(t)
with open(sys.argv[1] + f".{dist.get_rank()}", "w") as fh:
    fh.write(str(float(t[0])))
dist.destroy_process_group()
