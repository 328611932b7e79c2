"""One rank of a validation case (run by `arcsim validate` inside the emulated cluster).

    python -m arcsim.testbed.validate_worker CONFIG.json OUT_PREFIX       # env: RANK, WORLD_SIZE, MASTER_ADDR, …

1. Compute as run: forward + backward + optimizer step with DDP's gradient sync switched off
   (``no_sync``), all ranks at once — on 2 cores the ranks compete, so a solo profile would be wrong.
   Measured before and after the compressors, and the faster of the two kept (a transient slowdown of
   the machine must not become the model's compute).
2. DDP's own per-iteration work: real DDP steps with a hook that communicates nothing (bucket copies,
   hook dispatch, reducer bookkeeping); its median minus the compute is the framework overhead.
3. For each compressor: real DDP training steps with arcsim's comm hook (``none``: DDP's all-reduce);
   every rank times each iteration; rank 0 writes the per-iteration maxima over ranks.

Rank 0 writes the compute profile with the optimizer step and DDP's overhead folded into ``forward_s``
(both are serial work on the critical path; ``extra`` keeps them apart).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.comm.distributed import run_gloo_job
from arcsim.hooks import CompressionState, compression_hook
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.traces.profile import ComputeProfile, LayerTiming, device_name
from arcsim.traces.timing import ComputeTimer


def _setup(cfg: dict):
    entry = model_entry(cfg["model"])
    ds = make_dataset(cfg["dataset"] or entry.default_dataset, cfg.get("input_size"))
    torch.manual_seed(cfg["seed"])
    net = entry.build(ds.spec)
    return entry, ds, net


def _batches(ds, cfg: dict, rank: int, world: int):
    gen = torch.Generator().manual_seed(cfg["seed"] + 1)
    while True:
        x, y = ds.draw(world * cfg["batch"], gen)
        yield x.chunk(world)[rank], y.chunk(world)[rank]


def _max_over_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def compute_profile(cfg: dict, rank: int, world: int) -> ComputeProfile:
    entry, ds, net = _setup(cfg)
    ddp = DDP(net, bucket_cap_mb=cfg["bucket_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=entry.lr, momentum=0.9)
    timer = ComputeTimer(net, torch.device("cpu"))
    batches = _batches(ds, cfg, rank, world)
    order = [n for n, _ in net.named_parameters()]
    rows = []  # per step: forward, backward, optimizer step, then each parameter's ready time
    for i in range(cfg["warmup"] + cfg["steps"]):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        def forward(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            return loss_fn(ds.spec.kind, ddp(x), y)

        with ddp.no_sync():
            _, timing = timer.run(forward)
        started = time.perf_counter()
        opt.step()
        if i >= cfg["warmup"]:
            rows.append([timing.forward_s, timing.backward_s, time.perf_counter() - started,
                         *(timing.ready_s.get(n, timing.backward_s) for n in order)])
    # the slowest rank sets the pace of a synchronous step: ranks sharing cores wait for each other
    table = torch.tensor(rows, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    med = table.median(dim=0).values.tolist()
    timer.close()
    params = dict(net.named_parameters())
    return ComputeProfile(cfg["model"], cfg["batch"], "cpu", device_name(torch.device("cpu")),
                          med[0] + med[2], med[1],
                          [LayerTiming(n, params[n].numel(), med[3 + j]) for j, n in enumerate(order)], "profile",
                          cfg["steps"], extra={"note": "measured in the emulated cluster with all ranks running, "
                                                         "slowest rank per step; forward_s includes the optimizer "
                                                         "step and DDP's own overhead (ddp_overhead_s)",
                                               "ranks": world, "optimizer_s": med[2]})


def _no_communication(state, bucket):  # unannotated: DDP checks annotations, and this module defers them
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def train_times(cfg: dict, compressor: str, rank: int, world: int) -> tuple[list[float], list[float]]:
    """Per-iteration times (slowest rank) and, for diagnosis, the time spent inside the hook (this rank).

    ``compressor`` "noop" runs DDP with a hook that communicates nothing (the framework's own cost)."""
    entry, ds, net = _setup(cfg)
    ddp = DDP(net, bucket_cap_mb=cfg["bucket_mb"])
    in_hook = [0.0]
    if compressor == "noop":
        ddp.register_comm_hook(None, _no_communication)
    elif compressor != "none":
        memory = "none" if compressor in ("dense", "fp16") else cfg["memory"]

        def timed_hook(state, bucket):  # unannotated: DDP checks annotations, and this module defers them
            started = time.perf_counter()
            fut = compression_hook(state, bucket)
            in_hook[0] += time.perf_counter() - started
            return fut

        ddp.register_comm_hook(CompressionState(compressor, cfg["density"], memory, seed=cfg["seed"]), timed_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=entry.lr, momentum=0.9)
    batches = _batches(ds, cfg, rank, world)
    times, hooks = [], []
    for i in range(cfg["warmup"] + cfg["steps"]):
        x, y = next(batches)
        dist.barrier()
        in_hook[0] = 0.0
        started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(ds.spec.kind, ddp(x), y).backward()
        opt.step()
        if i >= cfg["warmup"]:
            times.append(time.perf_counter() - started)
            hooks.append(in_hook[0])
    return _max_over_ranks(times), hooks


def run(cfg: dict, prefix: str) -> None:
    """This rank's part: compute before, DDP's own overhead, every compressor, compute after; rank 0 writes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    before = compute_profile(cfg, rank, world)
    noop, _ = train_times(cfg, "noop", rank, world)
    results = {}
    for c in cfg["compressors"]:
        times, hooks = train_times(cfg, c, rank, world)
        results[c] = {"iteration_s": times, "hook_s": hooks}
    after = compute_profile(cfg, rank, world)
    profile = min(before, after, key=lambda p: p.forward_s + p.backward_s)
    overhead = max(0.0, float(torch.tensor(noop).median()) - profile.forward_s - profile.backward_s)
    profile.forward_s += overhead
    profile.extra.update(ddp_overhead_s=overhead, compute_before_s=before.forward_s + before.backward_s,
                         compute_after_s=after.forward_s + after.backward_s)
    if rank == 0:
        with open(prefix + "profile.json", "w") as fh:
            json.dump(profile.to_json(), fh)
        with open(prefix + "times.json", "w") as fh:
            json.dump(results, fh)


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    run_gloo_job(lambda: run(cfg, sys.argv[2]))

if __name__ == "__main__":
    main()
