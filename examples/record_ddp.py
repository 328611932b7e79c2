"""Record gradients from a DDP job of your own with arcsim's recording hook, then join the ranks' parts.

    torchrun --nproc_per_node 2 examples/record_ddp.py --out mlp.npz --steps 2
    torchrun --nproc_per_node 4 examples/record_ddp.py --out mlp.npz --ranks 0,2   # 2 of the 4 ranks record

Trains the zoo's MLP on MNIST-1D as `arcsim trace capture` does (the same seed, the same global batch
split into the ranks' shards, SGD with momentum), registers ``recording_hook`` on the DDP model, and
after the last step the first recording rank merges the parts into ``--out``. In your own script the three lines marked
``# arcsim`` are all it takes. gloo on CPU, NCCL on GPUs (--backend nccl). The hook keeps fp16 gradients
(``--dtype fp32`` for full precision: twice the memory), on every rank or on those ``--ranks`` names.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.hooks import RecordingState, recording_hook
from arcsim.models import MODELS, loss_fn
from arcsim.models.datasets import make_dataset
from arcsim.models.source import ModelSource
from arcsim.testbed.ddp_train import leave_process_group
from arcsim.traces.merge import merge_recordings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the trace rank 0 writes (.npz)")
    ap.add_argument("--steps", type=int, default=2, help="training steps, all recorded")
    ap.add_argument("--batch", type=int, default=8, help="per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16", help="what the recorded gradients are kept in")
    ap.add_argument("--ranks", default=None, help="the ranks that record, e.g. 0,2 (default: all)")
    args = ap.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.backend == "nccl" else None
    entry, data = MODELS["mlp"], make_dataset("mnist1d")
    torch.manual_seed(args.seed)
    model = DDP(entry.build(data.spec).to(device), device_ids=None if device is None else [device])
    opt = torch.optim.SGD(model.parameters(), lr=entry.lr, momentum=0.9)
    ranks = tuple(int(r) for r in args.ranks.split(",")) if args.ranks else None
    state = RecordingState.for_model(model, steps=tuple(range(args.steps)), optimizer=opt,  # arcsim
                                     dtype=args.dtype, ranks=ranks)
    model.register_comm_hook(state, recording_hook)                                         # arcsim
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(args.steps):
        x, y = data.draw(world * args.batch, gen)  # one global batch, this rank's shard
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        opt.zero_grad(set_to_none=True)
        loss_fn(data.spec.kind, model(x), y).backward()
        opt.step()
    parts = Path(f"{args.out}.parts")  # each rank's part beside the trace (one machine here; a shared
    parts.mkdir(exist_ok=True)           # folder on a cluster, or merge later with `arcsim trace merge`)
    state.save(parts / f"rank{rank}.pt")                                    # arcsim
    dist.barrier()
    if rank == min(ranks or (0,)):
        written = sorted(parts.glob("rank*.pt"))
        merge_recordings(written, Path(args.out), ModelSource("mlp"), "mnist1d", args.batch, args.dtype)
        print(f"wrote {args.out}: {args.steps} steps × {len(written)} workers of {world}")
    leave_process_group()


if __name__ == "__main__":
    main()
