"""Run in spawned gloo processes: a compressor per DDP bucket (arcsim.hooks.MixedState) against the in-process
simulation of each bucket's own compressor, DDP's real buckets against arcsim's, and training with the plan."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from _ddp_check import hook_against_in_process  # a sibling script: its folder is on the path
from _rank_report import report_and_leave  # a sibling script: its folder is on the path

from arcsim.compressors.layout import layout_of
from arcsim.hooks import MixedState
from arcsim.models import model_entry
from arcsim.models.datasets import make_dataset
from arcsim.strategy.buckets import make_buckets
from arcsim.strategy.plan import BucketPlan, PlannedBucket
from arcsim.testbed.ddp_train import train

BUCKET_MB = 1e-5  # a bucket per parameter, in DDP and in arcsim alike
# (compressor, density, memory, op) by bucket, in turn: both top-k families, fp16 and dense in one job
SETTINGS = (("topk", 0.05, "ef14", "allgather"), ("arctopk", 0.05, "ef14", "allreduce"),
            ("fp16", None, "none", "allreduce"), ("dense", None, "none", "allreduce"))
STEPS = 3


def digits_mlp_plan() -> BucketPlan:
    """arcsim's DDP buckets of the digits MLP (its parameters in backward order), a setting of SETTINGS each."""
    net = model_entry("mlp").build(make_dataset("digits").spec)
    params = list(net.parameters())[::-1]
    layers = layout_of([tuple(p.shape) for p in params], [f"p{i}" for i in range(len(params))])
    buckets = make_buckets(layers, [0.0] * len(layers), BUCKET_MB * 2**20)
    return BucketPlan(tuple(PlannedBucket(b.index, b.numel, name, density, memory, op)
                            for b, (name, density, memory, op) in
                            zip(buckets, SETTINGS * len(buckets), strict=False)), seed=3)


def bucket_sizes_at(cap_mb: float) -> tuple[list[int], list[int]]:
    """DDP's buckets of the digits MLP after its rebuild (step 2's hook calls) and arcsim's, at ``cap_mb``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = model_entry("mlp").build(make_dataset("digits").spec)
    params = list(net.parameters())[::-1]
    layers = layout_of([tuple(p.shape) for p in params], [f"p{i}" for i in range(len(params))])
    ours = [b.numel for b in make_buckets(layers, [0.0] * len(layers), cap_mb * 2**20)]
    ddp = DDP(net, bucket_cap_mb=cap_mb)
    seen: list[tuple[int, int]] = []
    step = [0]

    def record(_state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations, not strings
        seen.append((step[0], bucket.buffer().numel()))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, record)
    for step[0] in range(3):
        ddp(torch.randn(4, 64)).sum().backward()
    return [n for s, n in seen if s == 2], ours


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    plan = digits_mlp_plan()
    worst, state, seen = hook_against_in_process("mixed", rank, world, "", STEPS, plan=plan, bucket_mb=BUCKET_MB)
    assert isinstance(state, MixedState)
    path = os.path.join(out_dir, f"plan{rank}.json")
    plan.save(path)  # as arcsim run --write-plan writes it
    res = train("mlp", "digits", steps=120, batch=32, lr=0.1, seed=0, bucket_mb=BUCKET_MB, plan=path)
    report = {"rel_diff": worst, "planned": [b.elements for b in plan.buckets],
              "ddp": {str(step): [n.numel() for s, _, _, n, _ in seen if s == step] for step in range(STEPS)},
              "ran": {str(i): [st.compressor, len(st.per_bucket)] for i, st in state.states.items()},
              "ops": sorted({r.op for r in state.comm.log.records}), "steps": state.step,
              "train": {"first": sum(res.losses[:10]) / 10, "last": sum(res.losses[-10:]) / 10,
                        "accuracy": res.accuracy},
              "at_0.02_MiB": bucket_sizes_at(0.02)}
    report_and_leave(out_dir, rank, report)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
