"""Run in spawned gloo processes: arcsim's DDP comm hook vs the in-process simulation, and real training."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _rank_report import report_and_leave  # a sibling script: its folder is on the path
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.layout import layout_of
from arcsim.compressors.memory import make_memory
from arcsim.compressors.registry import make_compressor
from arcsim.hooks import CompressionState, MixedState, compression_hook, mixed_hook
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.strategy.plan import BucketPlan
from arcsim.testbed.ddp_train import train

COMPRESSORS = ("dense", "topk", "arctopk", "star", "randk", "powersgd", "gaussiank")


def hook_against_in_process(name: str, rank: int, world: int, memory: str, steps: int,
                            density: float | None = None, plan: BucketPlan | None = None,
                            bucket_mb: float = 0.02) -> tuple[float, CompressionState | MixedState, list]:
    """Train ``steps`` DDP steps with ``name``'s comm hook (or ``plan``'s, a compressor per bucket) and replay every
    bucket the ranks saw through the in-process simulation: the worst relative difference, the hook's state and
    what it saw."""
    ds = make_dataset("digits")
    torch.manual_seed(0)
    ddp = DDP(model_entry("mlp").build(ds.spec), bucket_cap_mb=bucket_mb)  # several buckets
    dense = {} if density is None else {"density": density}
    state = CompressionState(name, memory=memory, seed=3, **dense) if plan is None else MixedState(plan)
    hook = compression_hook if plan is None else mixed_hook
    seen = []

    def recording_hook(st, bucket):
        step, inp = st.step, bucket.buffer().clone()
        fut = hook(st, bucket)
        seen.append((step, bucket.index(), [tuple(p.shape) for p in bucket.parameters()], inp, fut.value().clone()))
        return fut

    ddp.register_comm_hook(state, recording_hook)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
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
            state_of[key] = (make_compressor(name, seed=3 + index, **dense), make_memory(memory)) if plan is None \
                else planned_in_process(plan, index, stacked.shape[1])
        comp, mem = state_of[key]
        layers = layout_of(shapes, [f"p{j}" for j in range(len(shapes))])
        ref = mem.step(stacked, comp, InProcessComm(world), step, layers)
        worst = max(worst, float((out - ref[0]).norm() / ref.norm().clamp_min(1e-30)))
    return worst, state, seen


def planned_in_process(plan: BucketPlan, index: int, numel: int) -> tuple:
    """The in-process compressor and memory of ``plan``'s bucket ``index`` (dense where DDP's bucket is not the
    plan's: its provisional first-iteration buckets)."""
    b = plan.buckets[index] if index < len(plan.buckets) else None
    if b is None or b.elements != numel:
        return make_compressor("dense", 1.0, seed=index), make_memory("none")
    ratio = 1.0 if b.density is None else b.density
    return make_compressor(b.compressor, ratio, seed=plan.seed + index), make_memory(b.memory)


def hook_equals_in_process(name: str, rank: int, world: int) -> float:
    """Worst relative difference between the hook's output and the in-process result, over two steps."""
    return hook_against_in_process(name, rank, world, "none" if name == "dense" else "ef14", 2, density=0.05)[0]


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    report = {"equality": {name: hook_equals_in_process(name, rank, world) for name in COMPRESSORS}}
    for name in ("none", "topk"):
        res = train("mlp", "digits", name, density=0.05, steps=120, batch=32, lr=0.1, seed=0)
        report[f"train/{name}"] = {"first": sum(res.losses[:10]) / 10, "last": sum(res.losses[-10:]) / 10,
                                   "accuracy": res.accuracy, "bytes": res.bytes_per_rank_per_step}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
