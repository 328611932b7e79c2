"""Real DDP training with an arcsim compressor as the comm hook (used by examples/train_ddp.py and tests).

Call inside an initialised process group (torchrun, or one process per rank). Every rank draws the same
global batch from a shared-seed generator and trains on its own disjoint shard of it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.catalog import DDP_BUCKET_MB
from arcsim.compressors.metrics import records_summary
from arcsim.hooks import CompressionState, MixedState, compression_hook, mixed_hook
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset


@dataclass
class TrainResult:
    losses: list[float]
    iteration_s: list[float]
    accuracy: float | None
    bytes_per_rank_per_step: float
    collectives: list[dict] = field(default_factory=list)

    @property
    def median_iteration_s(self) -> float:
        steady = self.iteration_s[len(self.iteration_s) // 5:] or self.iteration_s  # skip warm-up
        return statistics.median(steady)


def train(model: str = "mlp", dataset: str | None = None, compressor: str = "dense", density: float = 0.01,
          memory: str = "ef14", steps: int = 100, batch: int = 32, lr: float | None = None, seed: int = 0,
          bucket_mb: float = DDP_BUCKET_MB, device: str = "cpu", plan: str | None = None) -> TrainResult:
    """Train ``steps`` iterations; ``compressor='none'`` uses DDP's own all-reduce (no hook); ``plan``: a compressor
    per bucket, as the file ``arcsim run --write-plan`` wrote says (``compressor`` and its settings unused)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    entry = model_entry(model)
    ds = make_dataset(dataset or entry.default_dataset)
    torch.manual_seed(seed)
    net = entry.build(ds.spec).to(device)
    ddp = DDP(net, bucket_cap_mb=bucket_mb)
    state: CompressionState | MixedState | None = None
    if plan is not None:
        state = MixedState.load(plan)
        ddp.register_comm_hook(state, mixed_hook)
    elif compressor != "none":
        state = CompressionState(compressor, density, memory if compressor not in ("dense", "fp16", "bf16") else "none",
                                 seed=seed)
        ddp.register_comm_hook(state, compression_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr or entry.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed + 1)
    losses, times = [], []
    for _ in range(steps):
        x, y = ds.draw(world * batch, gen)
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ds.spec.kind, ddp(x), y)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        losses.append(loss.item())
    accuracy = None
    held = ds.held_out()
    if held is not None and ds.spec.kind != "tokens":
        with torch.no_grad():
            pred = net(held[0].to(device)).argmax(dim=1).cpu()
        accuracy = float((pred == held[1]).float().mean())
    sent, collectives = (0, []) if state is None else records_summary(state.comm.log.records)
    return TrainResult(losses, times, accuracy, sent / steps, collectives[:8])


def leave_process_group() -> NoReturn:
    """End a rank that has finished: wait for every rank, destroy the process group, and exit without the
    interpreter's finalisation, in which gloo's worker threads may still hold work whose tensors reference
    Python objects — freeing those then aborts the process ("terminate called without an active
    exception", SIGABRT after the work was done: seen in 2-rank test jobs on this machine)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
