"""One rank of a validation case (run by `arcsim validate` inside the emulated cluster).

    python -m arcsim.testbed.validate_worker CONFIG.json OUT_PREFIX       # env: RANK, WORLD_SIZE, MASTER_ADDR, …

1. Compute as run: forward + backward + optimizer step with DDP's gradient sync switched off
   (``no_sync``), all ranks at once — on 2 cores the ranks compete, so a solo profile would be wrong.
   Measured before and after the compressors, and the faster of the two kept (a transient slowdown of
   the machine must not become the model's compute).
2. DDP's own per-iteration work: real DDP steps with a hook that communicates nothing but returns a copy
   (bucket copies both ways, hook dispatch, reducer bookkeeping); its median minus the compute is the
   framework overhead.
3. Compression as run (``compression_as_run``): how much longer each compressor's local work takes with
   all ranks compressing at once after a backward than arcsim's one-rank timing says.
4. For each compressor: real DDP training steps with arcsim's comm hook (``none``: DDP's all-reduce);
   every rank times each iteration and its phases (before the hook, the hook's local work, node-aware its
   collectives inside the node, its collectives between nodes or over every rank, after the hook); rank 0
   writes the per-iteration maxima over ranks and every rank's phases.

Rank 0 writes the compute profile: the optimizer step and DDP's overhead as ``extra["after_backward_s"]``,
which arcsim's timeline places after the last communication (they need the reduced gradients).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from arcsim.comm.distributed import DistributedComm, InNodeComm, run_gloo_job
from arcsim.compressors.grouping import slice_bounds, slice_layout
from arcsim.hooks import CompressionState, NodeGroups, compress_bucket, compression_hook, node_groups
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.traces.profile import ComputeProfile, LayerTiming
from arcsim.traces.timing import ComputeTimer, device_name


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
    return ComputeProfile(cfg["model"], cfg["batch"], "cpu", device_name(torch.device("cpu")), med[0], med[1],
                          [LayerTiming(n, params[n].numel(), med[3 + j]) for j, n in enumerate(order)], "profile",
                          cfg["steps"], extra={"note": "measured in the emulated cluster with all ranks running, "
                                                         "slowest rank per step; after_backward_s is the optimizer "
                                                         "step and DDP's own overhead (ddp_overhead_s)",
                                               "ranks": world, "optimizer_s": med[2], "after_backward_s": med[2],
                                               "machine": machine()})


def machine() -> str:
    """This machine, for the report: its CPU model where Linux names it (/proc/cpuinfo; else what traces call
    the CPU) and its core count."""
    model = device_name(torch.device("cpu"))
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def _memory(cfg: dict, compressor: str) -> str:
    """The error feedback a compressor runs with here: none for the uncompressed ones."""
    return "none" if compressor in ("dense", "fp16", "bf16") else cfg["memory"]


def _no_communication(state, bucket):  # unannotated: DDP checks annotations, and this module defers them
    """A hook that communicates nothing but returns a new tensor, as arcsim's hooks do: DDP then copies it
    back into the bucket, so the framework's own cost includes that copy."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer().clone())
    return fut


class TimedComm(DistributedComm):
    """DistributedComm that records the seconds each collective takes (waiting for peers included). Node-aware
    (over a rail): the compressor's collectives between nodes (those inside the node: :class:`TimedInNodeComm`)."""

    def __init__(self, group: dist.ProcessGroup | None = None, name: str = "world") -> None:
        super().__init__(group, name)
        self.calls: list[float] = []  # this iteration's collectives, in order

    def _timed(self, call, *args, **kwargs):  # unannotated: the three collectives return different things
        started = time.perf_counter()
        out = call(*args, **kwargs)
        self.calls.append(time.perf_counter() - started)
        return out

    def all_reduce(self, t: torch.Tensor, op: str = "mean", tag: str = "") -> torch.Tensor:
        return self._timed(super().all_reduce, t, op, tag)

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        return self._timed(super().all_gather, t, tag)

    def all_to_all(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        return self._timed(super().all_to_all, t, tag)

    def broadcast(self, t: torch.Tensor, src: int, tag: str = "") -> torch.Tensor:
        return self._timed(super().broadcast, t, src, tag)


class TimedInNodeComm(InNodeComm):
    """InNodeComm that records the seconds each collective inside the node takes (waiting for peers included)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__(group)
        self.calls: list[float] = []  # this iteration's, in order: reduce-scatter, all-gather per bucket

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        started = time.perf_counter()
        super().reduce_scatter(out, t)
        self.calls.append(time.perf_counter() - started)

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        started = time.perf_counter()
        super().all_gather(out, t)
        self.calls.append(time.perf_counter() - started)


class LocalInNodeComm(InNodeComm):
    """The collectives inside the node as one rank's local work (compression as run): the reduce-scatter
    leaves this rank's own slice in the output, the all-gather leaves the output as it is (the other slices
    are the peers')."""

    def __init__(self, nodes: NodeGroups) -> None:
        super().__init__(nodes.node)
        self.local_rank = nodes.local_rank

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor) -> None:
        out.copy_(t.view(-1, out.numel())[self.local_rank])

    def all_gather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        """Nothing: this rank's slice is its own already, and the rest are the peers' work."""


# an iteration's phases, in order; hook_node_s: node-aware, the hook's collectives inside the node (0 flat)
PHASES = ("before_hook_s", "hook_local_s", "hook_node_s", "hook_comm_s", "after_hook_s")


def node_groups_for(cfg: dict) -> NodeGroups | None:
    """Node-aware runs (``hierarchy`` node): this rank's node and rail groups (every rank makes them all)."""
    return node_groups(cfg["gpus_per_node"]) if cfg.get("hierarchy", "flat") == "node" else None


def train_times(cfg: dict, compressor: str, rank: int, world: int,
                nodes: NodeGroups | None = None) -> tuple[list[float], list[float], dict]:
    """Per-iteration times (slowest rank), the time spent inside the hook (this rank), and every rank's
    per-iteration phases: before the first hook call (forward, backward up to the bucket), the hook's local
    work, node-aware its reduce-scatter and all-gather inside the node, its other collectives (waiting for the
    other ranks included) and what follows the hook (rest of backward, DDP's copies, the optimizer step).

    ``compressor`` "noop" runs DDP with a hook that communicates nothing (the framework's own cost); ``nodes``:
    node-aware compression over those groups."""
    entry, ds, net = _setup(cfg)
    ddp = DDP(net, bucket_cap_mb=cfg["bucket_mb"])
    in_hook, first_call = [0.0], [0.0]
    comm = TimedComm() if nodes is None else TimedComm(nodes.rail, "inter")
    node_comm = None if nodes is None else TimedInNodeComm(nodes.node)
    if compressor == "noop":
        ddp.register_comm_hook(None, _no_communication)
    elif compressor != "none":
        state = CompressionState(compressor, cfg["density"], _memory(cfg, compressor), seed=cfg["seed"], nodes=nodes)
        state._comm, state._node_comm = comm, node_comm  # the hook's collectives, timed

        def timed_hook(state, bucket):  # unannotated: DDP checks annotations, and this module defers them
            started = time.perf_counter()
            first_call[0] = first_call[0] or started
            fut = compression_hook(state, bucket)
            in_hook[0] += time.perf_counter() - started
            return fut

        ddp.register_comm_hook(state, timed_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=entry.lr, momentum=0.9)
    batches = _batches(ds, cfg, rank, world)
    times, hooks, phases, calls, node_calls = [], [], [], [], []
    for i in range(cfg["warmup"] + cfg["steps"]):
        x, y = next(batches)
        dist.barrier()
        in_hook[0], first_call[0], comm.calls = 0.0, 0.0, []
        if node_comm is not None:
            node_comm.calls = []
        started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(ds.spec.kind, ddp(x), y).backward()
        opt.step()
        if i >= cfg["warmup"]:
            took = time.perf_counter() - started
            before = (first_call[0] - started) if first_call[0] else took
            times.append(took)
            hooks.append(in_hook[0])
            spent, inside = sum(comm.calls), 0.0 if node_comm is None else sum(node_comm.calls)
            phases.append([before, in_hook[0] - inside - spent, inside, spent, took - before - in_hook[0]])
            calls.append(list(comm.calls))
            node_calls.append([] if node_comm is None else list(node_comm.calls))
    table = torch.tensor(phases, dtype=torch.float64)
    every = [torch.empty_like(table) for _ in range(world)]
    dist.all_gather(every, table)
    by_rank = {name: [t[:, j].tolist() for t in every] for j, name in enumerate(PHASES)}  # [rank][iteration]
    by_rank["collectives_s"] = calls  # this rank's, per iteration
    by_rank["node_collectives_s"] = node_calls  # this rank's inside its node, per iteration (flat: none)
    return _max_over_ranks(times), hooks, by_rank


COMPRESS_REPEATS = 11  # timed compressions per compressor, after one untimed


def compression_as_run(cfg: dict, rank: int, world: int, nodes: NodeGroups | None = None) -> dict[str, float]:
    """How much longer each compressor's local work takes in training than arcsim times it alone, per compressor.

    After a backward, from a barrier until the LAST rank has done the hook's local work on the gradient (a
    second barrier), with all ranks at once in their own roles (as in the hook; collectives become local
    copies), less what the two barriers cost on idle ranks; over rank 0's one-rank timing
    (``arcsim.run.measure``'s hot loop, the other ranks waiting). A property of the machine, like compute as run:
    ranks sharing cores, the work a backward leaves behind, caches the backward filled with other data; near 1
    where each rank has its own cores. (Subtracting the same bracket after a backward with nothing in it instead
    drops what the backward leaves behind, which the hook does pay: measured, it under-predicts the 4-rank
    cases by 12–43 %.) Node-aware (``nodes``): the hook's whole local work — the bucket cut into padded slices,
    this rank's slice compressed over its rail, the node's slices joined again (the collectives inside the node
    are priced on their own) — over the one-rank timing of slice 0 (as ``arcsim run`` times a node-aware
    bucket)."""
    from arcsim.comm.solo import SoloComm
    from arcsim.compressors.layout import layout_of
    from arcsim.run.measure import one_rank_seconds

    _, ds, net = _setup(cfg)
    ddp = DDP(net, bucket_cap_mb=cfg["bucket_mb"])
    params = list(net.parameters())
    layout = layout_of([tuple(p.shape) for p in params])
    batches = _batches(ds, cfg, rank, world)

    def bracketed(work, after_backward: bool = True) -> tuple[float, torch.Tensor]:  # work(step, gradient)
        """Median over repeats of the slowest rank's barrier-to-barrier time around ``work``, and a gradient."""
        times = []
        g = torch.zeros(1, sum(p.numel() for p in params))
        for k in range(1 + COMPRESS_REPEATS):
            if after_backward:
                x, y = next(batches)
                net.zero_grad(set_to_none=True)
                with ddp.no_sync():
                    loss_fn(ds.spec.kind, ddp(x), y).backward()
                g = torch.cat([p.grad.reshape(-1) for p in params]).view(1, -1)
            dist.barrier()
            started = time.perf_counter()
            work(k, g)
            dist.barrier()  # until the LAST rank is done, as the hook's next collective waits for it
            times.append(time.perf_counter() - started)
        return float(torch.tensor(_max_over_ranks(times[1:])).median()), g

    parts = 1 if nodes is None else nodes.gpus_per_node
    lo, hi = slice_bounds(sum(p.numel() for p in params), parts, layout)[0]
    peers = world if nodes is None else nodes.nodes
    empty, _ = bracketed(lambda k, g: None, after_backward=False)
    scales = {}
    for name in cfg["compressors"]:
        if name == "none":
            continue
        state = CompressionState(name, cfg["density"], _memory(cfg, name), seed=cfg["seed"], nodes=nodes)
        state._comm = SoloComm(peers, rank // parts)
        if nodes is not None:
            state._node_comm = LocalInNodeComm(nodes)

        def hook_work(k: int, g: torch.Tensor, state: CompressionState = state) -> None:
            state.step = k
            compress_bucket(state, 0, g.view(-1), layout)

        took, g = bracketed(hook_work)
        if rank == 0:
            alone = one_rank_seconds((g[:, lo:hi] / parts).expand(peers, -1), name, cfg["density"], state.memory,
                                     cfg["seed"], state.options_for_compressor(), slice_layout(layout, lo, hi))
            scales[name] = max(took - empty, alone) / alone
        dist.barrier()
    return scales


def run(cfg: dict, prefix: str) -> None:
    """This rank's part: compute before, DDP's own overhead, every compressor (node-aware with ``hierarchy``
    node), compute after; rank 0 writes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = node_groups_for(cfg)
    before = compute_profile(cfg, rank, world)
    noop, _, _ = train_times(cfg, "noop", rank, world)
    compress_scale = compression_as_run(cfg, rank, world, nodes)
    results = {}
    for c in cfg["compressors"]:
        times, hooks, phases = train_times(cfg, c, rank, world, nodes)
        results[c] = {"iteration_s": times, "hook_s": hooks, "phases": phases}
    after = compute_profile(cfg, rank, world)
    profile = min(before, after, key=lambda p: p.compute_s)
    overhead = max(0.0, float(torch.tensor(noop).median()) - profile.compute_s)
    profile.extra.update(ddp_overhead_s=overhead, after_backward_s=profile.after_backward_s + overhead,
                         compute_before_s=before.compute_s, compute_after_s=after.compute_s,
                         compress_scale=compress_scale)
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
