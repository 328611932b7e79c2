"""Train a model data-parallel under torchrun with an arcsim compressor as DDP's comm hook.

    torchrun --nproc_per_node 2 examples/train_ddp.py --compressor arctopk --density 0.05 --steps 200
    torchrun --nproc_per_node 2 examples/train_ddp.py --plan plan.json   # from arcsim run --write-plan

Every rank trains on its own shard of a shared-seed global batch; rank 0 prints the loss curve, the
held-out accuracy, the median iteration time and the bytes each rank sent per step.
"""

from __future__ import annotations

import argparse
import json

import torch.distributed as dist

from arcsim.catalog import DDP_BUCKET_MB
from arcsim.testbed.ddp_train import leave_process_group, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--compressor", default="arctopk", help="an arcsim compressor, or 'none' for DDP's all-reduce")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--memory", default="ef14")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--plan", default=None, help="a compressor per DDP bucket: the file arcsim run --write-plan wrote "
                                                 "(instead of --compressor)")
    ap.add_argument("--bucket-mb", type=float, default=DDP_BUCKET_MB, help="DDP's bucket_cap_mb (a plan's: its run's)")
    ap.add_argument("--json", default=None, help="rank 0 writes its result here")
    args = ap.parse_args()
    dist.init_process_group(args.backend)
    try:
        res = train(args.model, args.dataset, args.compressor, args.density, args.memory, args.steps, args.batch,
                    args.lr, args.seed, args.bucket_mb, plan=args.plan)
        if dist.get_rank() == 0:
            every = max(1, args.steps // 10)
            for i in range(0, args.steps, every):
                print(f"step {i:5d}  loss {res.losses[i]:.4f}")
            acc = "n/a" if res.accuracy is None else f"{res.accuracy:.3f}"
            print(f"final loss {res.losses[-1]:.4f}, held-out accuracy {acc}, "
                  f"median iteration {res.median_iteration_s * 1e3:.2f} ms, "
                  f"{res.bytes_per_rank_per_step:,.0f} bytes sent per rank per step")
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"losses": res.losses, "iteration_s": res.iteration_s, "accuracy": res.accuracy,
                               "bytes_per_rank_per_step": res.bytes_per_rank_per_step}, fh)
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()  # barrier, destroy, exit (gloo can abort in the interpreter's finalisation)


if __name__ == "__main__":
    main()
