"""FSDP2 on the emulated cluster (arcsim.testbed.cluster), measured against the sharded timeline.

``python -m arcsim.sharding.emulated CONFIG.json OUT.json`` is one rank (spawned by :func:`measure` in a
namespace of the emulated cluster, gloo over its shaped links): an MLP of ``layers`` × Linear(dim, dim),
``fully_shard`` per Linear and on the root, trained ``steps`` steps after a warm-up; rank 0 writes the
median iteration, the compute of one step of the same model unsharded (forward and backward, timed while
the other rank does the same, as they share this machine's cores), each collective FSDP2 issued inside the
step (start and end; on CPU FSDP2 calls them synchronously), and one all-gather, one reduce-scatter and
one all-reduce of a unit's size, each alone.

:func:`compare` prices the same step with arcsim: the FSDP2 schedule, the two-stream timeline, compute as
measured, collectives (a) as arcsim's gloo model prices them on the emulated links, (b) as measured alone —
so that an error in the timeline is told apart from an error in pricing one collective."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

WORKER = "arcsim.sharding.emulated"


def _model(layers: int, dim: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(dim, dim), nn.ReLU()]
    return nn.Sequential(*mods)


def time_unsharded(local: Any, x: Any, steps: int, barrier: Any = None) -> tuple[list[float], list[float]]:
    """Forward and backward of ``local`` unsharded on ``x``, ``steps`` + 2 times (``barrier()`` first each time, where
    the ranks share this machine's cores and must time together): the step's compute, as FSDP2 cannot show it."""
    import time as _time

    fwd, bwd = [], []
    for _ in range(steps + 2):
        if barrier is not None:
            barrier()
        t0 = _time.perf_counter()
        loss = local(x).pow(2).mean()
        t1 = _time.perf_counter()
        loss.backward()
        fwd.append(t1 - t0)
        bwd.append(_time.perf_counter() - t1)
    return fwd, bwd


def step_times(times: list[float], fwd: list[float], bwd: list[float]) -> dict[str, Any]:
    """A worker's report of its timed steps: their median and each, and the median forward and backward of
    :func:`time_unsharded` (its two warm-up passes dropped)."""
    return {"iteration_s": statistics.median(times), "iterations_s": times,
            "forward_s": statistics.median(fwd[2:]), "backward_s": statistics.median(bwd[2:])}


def alone_s(call: Any) -> float:
    """Seconds ``call()`` takes on this rank once every rank is at the barrier: a collective timed alone."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def run_on_cluster(worker: str, cfg: dict[str, Any], ranks: int, bandwidth: str, work: Path, prefix: str,
                   name: str, ranks_per_node: int = 1) -> Path:
    """``python -m worker CONFIG OUT`` on each rank of an emulated cluster (needs root); the path of OUT."""
    from arcsim.testbed.cluster import EmulatedCluster

    conf, out = work / f"{name}.json", work / f"{name}-out.json"
    conf.write_text(json.dumps(cfg))
    with EmulatedCluster(ranks, bandwidth, prefix=prefix, ranks_per_node=ranks_per_node) as cluster:
        cluster.run(worker, [str(conf), str(out)], 900)
    return out


def measured_step(cfg: dict[str, Any], measured: dict[str, Any], topology: str, strategy: str,
                  quantize: Any = None) -> tuple[Any, list[Any], list[str], dict[str, float], dict[str, float]]:
    """The step arcsim prices for a measured run: ``topology`` under gloo, the MLP's FSDP2 schedule for ``strategy``
    (``quantize``: a strategy.schedule.Quantize), its units' names and the measured compute shared evenly."""
    from arcsim.strategy.schedule import Quantize, fsdp_schedule
    from arcsim.strategy.units import ROOT, group_units, model_shapes
    from arcsim.topology import load_topology

    topo = load_topology(topology).with_overrides(library="gloo")
    units, root = group_units(model_shapes(_model(cfg["layers"], cfg["dim"])))
    sched = fsdp_schedule(units, root, strategy, topo.ranks, topo.gpus_per_node, quantize=quantize or Quantize())
    names = [u.name for u in units]
    fwd = {u: measured["forward_s"] / len(units) for u in names}
    bwd = {u: measured["backward_s"] / len(units) for u in names}
    fwd[ROOT] = bwd[ROOT] = 0.0
    return topo, sched, names, fwd, bwd


def _worker(cfg: dict[str, Any], out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    layers, dim, batch, steps = cfg["layers"], cfg["dim"], cfg["batch"], cfg["steps"]
    x = torch.randn(batch, dim)
    fwd, bwd = time_unsharded(_model(layers, dim), x, steps)
    dist.init_process_group("gloo")
    model = _model(layers, dim)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    times = []
    calls: list[tuple[str, float, float]] = []
    inside: dict[str, list[float]] = {"allgather": [], "reducescatter": []}
    originals: dict[str, Any] = {"allgather": dist.all_gather_single, "reducescatter": dist.reduce_scatter_single}

    def timed(op: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:  # FSDP2 on CPU calls both synchronously
            t0 = time.perf_counter()
            done = originals[op](*args, **kwargs)
            inside[op].append(time.perf_counter() - t0)
            calls.append((op, t0, time.perf_counter()))
            return done
        return call

    for step in range(steps + 2):
        calls.clear()
        if step == 2:
            setattr(dist, "all_gather_single", timed("allgather"))  # noqa: B010
            setattr(dist, "reduce_scatter_single", timed("reducescatter"))  # noqa: B010
        dist.barrier()
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        if step >= 2:
            times.append(time.perf_counter() - t0)
        last = [(op, a - t0, b - t0) for op, a, b in calls]
    setattr(dist, "all_gather_single", originals["allgather"])  # noqa: B010
    setattr(dist, "reduce_scatter_single", originals["reducescatter"])  # noqa: B010
    world = dist.get_world_size()
    unit = (dim + (-dim) % world) * dim + dim + (-dim) % world  # padded weight rows and bias
    ag_out, ag_in = torch.empty(unit), torch.empty(unit // world)
    rs_in, rs_out = torch.empty(unit), torch.empty(unit // world)
    ag, rs, ar = [], [], []
    for _ in range(steps):
        ar.append(alone_s(lambda: dist.all_reduce(rs_in)))
        ag.append(alone_s(lambda: dist.all_gather_single(ag_out, ag_in)))
        rs.append(alone_s(lambda: dist.reduce_scatter_single(rs_out, rs_in)))
    if dist.get_rank() == 0:
        out.write_text(json.dumps({**step_times(times, fwd, bwd),
                                   "allgather_s": statistics.median(ag), "reducescatter_s": statistics.median(rs),
                                   "allreduce_s": statistics.median(ar),
                                   "allgather_in_step_s": statistics.median(inside["allgather"]),
                                   "reducescatter_in_step_s": statistics.median(inside["reducescatter"]),
                                   "collectives_in_step_s": sum(inside["allgather"] + inside["reducescatter"]) / steps,
                                   "last_step_calls": last, "unit_numel": unit, "world": world}))
    dist.destroy_process_group()


def measure(cfg: dict[str, Any], ranks: int, bandwidth: str, work: Path, prefix: str = "arcshard") -> dict[str, Any]:
    """Run the worker on an emulated cluster of ``ranks`` single-rank nodes at ``bandwidth`` (needs root)."""
    out = run_on_cluster(WORKER, cfg, ranks, bandwidth, work, prefix, "fsdp-emulated")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def compare(cfg: dict[str, Any], measured: dict[str, Any], topology: str) -> dict[str, Any]:
    """arcsim's iteration for the measured run: collectives priced on ``topology`` (gloo) and as measured."""
    from arcsim.pricing import Pricer
    from arcsim.strategy.sharded import sharded_step

    topo, sched, names, fwd, bwd = measured_step(cfg, measured, topology, "full")
    ops = [(c.op, c.unit, c.phase) for c in sched]
    pricer = Pricer(topo)
    priced = sharded_step(names, fwd, bwd, ops, [pricer.group(c.group).price(c.op, c.bytes_per_rank).time_s
                                                for c in sched])
    alone = sharded_step(names, fwd, bwd, ops, [measured["allgather_s" if c.op == "allgather" else "reducescatter_s"]
                                              for c in sched])
    m = measured["iteration_s"]
    return {"measured_s": m, "predicted_s": priced.iteration_s, "error": priced.iteration_s / m - 1,
            "predicted_with_measured_collectives_s": alone.iteration_s, "error_timeline": alone.iteration_s / m - 1,
            "collectives": len(sched), "priced_allgather_s": pricer.price("allgather", sched[0].bytes_per_rank).time_s,
            "measured_allgather_s": measured["allgather_s"],
            "priced_reducescatter_s": pricer.price("reducescatter", sched[-1].bytes_per_rank).time_s,
            "measured_reducescatter_s": measured["reducescatter_s"], "compute_s": measured["forward_s"]
            + measured["backward_s"]}


if __name__ == "__main__":
    _worker(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
