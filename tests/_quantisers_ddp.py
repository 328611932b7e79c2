"""Run in spawned gloo processes: the quantisers and the sign family as DDP comm hooks against the in-process
simulation of the same buckets, and the bytes the real run's CommLog holds."""

from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.catalog import INFO
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors import make_compressor
from arcsim.compressors.base import Layer
from arcsim.compressors.memory import make_memory
from arcsim.hooks import CompressionState, compression_hook
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.testbed.ddp_train import leave_process_group

NAMES = ("qsgd", "terngrad", "natural", "signsgd", "signum", "efsignsgd")
STEPS = 3  # signum's momentum and efsignsgd's error feedback carry over steps


def check(name: str, rank: int, world: int) -> dict:
    ds = make_dataset("digits")
    torch.manual_seed(0)
    ddp = DDP(model_entry("mlp").build(ds.spec), bucket_cap_mb=0.02)  # several buckets
    memory = INFO[name].default_memory
    state = CompressionState(name, memory=memory, seed=3)
    seen = []

    def recording_hook(st, bucket):
        step, inp = st.step, bucket.buffer().clone()
        fut = compression_hook(st, bucket)
        seen.append((step, bucket.index(), [tuple(p.shape) for p in bucket.parameters()], inp, fut.value().clone()))
        return fut

    ddp.register_comm_hook(state, recording_hook)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x, y = ds.draw(world * 16, gen)
        loss_fn("image", ddp(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
        ddp.zero_grad()
    everyone = [None] * world
    dist.all_gather_object(everyone, seen)
    worst, state_of = 0.0, {}
    for i, (step, index, shapes, _, out) in enumerate(seen):
        stacked = torch.stack([everyone[r][i][3] for r in range(world)])
        key = (index, stacked.shape[1])
        if key not in state_of:
            state_of[key] = (make_compressor(name, seed=3 + index), make_memory(memory))
        layers, offset = [], 0
        for j, shape in enumerate(shapes):
            layers.append(Layer(f"p{j}", shape, offset))
            offset += math.prod(shape)
        comp, mem = state_of[key]
        ref = mem.step(stacked, comp, InProcessComm(world), step, tuple(layers))
        worst = max(worst, float((out - ref[0]).norm() / ref.norm().clamp_min(1e-30)))
    records = [(r.op, r.tag, r.dtype, r.bytes_per_rank, r.total_bytes) for r in state.comm.log.records]
    sizes = [inp.numel() for _, _, _, inp, _ in seen]
    return {"rel_diff": worst, "records": records, "sizes": sizes, "steps": state.step}


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = {name: check(name, rank, world) for name in NAMES}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    leave_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
