"""FSDP2 with a quantised reduce-scatter on the emulated cluster, measured against arcsim and the in-process math.

``python -m arcsim.sharding.emulated_compressed CONFIG.json OUT.json`` is one rank (spawned by :func:`measure` in a
namespace of the emulated cluster, gloo over its shaped links): the MLP of :mod:`arcsim.sharding.emulated`,
``fully_shard`` per Linear and on the root, each unit's gradient reduce-scatter replaced through
``FSDPModule.set_custom_reduce_scatter`` by arcsim's ``rs-int8`` (:class:`arcsim.compressors.sharded.RsInt8`):
each rank's chunks blockwise int8 (:class:`arcsim.compressors.sharded.Codec`), one all-to-all of the payloads
(:meth:`arcsim.comm.distributed.DistributedComm.reduce_scatter` with ``decode``), decoded and summed in fp32 by
the chunk's owner. Each rank draws its own batch, so that the ranks' gradients differ. Rank 0 writes what
:mod:`arcsim.sharding.emulated` writes (the iteration, the unsharded compute, each collective in the step and
alone), plus the quantised reduce-scatter alone and its encode/decode work alone; every rank saves its last
step's reduce-scatter inputs and outputs, which :func:`measure` checks against the in-process compressor on the
same per-rank gradients.

:func:`compare` prices the step with arcsim: ``fsdp_schedule`` with ``Quantize(grads="int8")`` (on nodes of one
rank: one int8 reduce-scatter per unit between the nodes), the two-stream timeline, compute and the codec's work as
measured, the collectives (a) by arcsim's gloo model — the quantised reduce-scatter as what runs, an all-to-all of
its payload — and (b) as measured alone.

HSDP with a compressor between nodes (``cfg["mode"] == "hsdp"``, :func:`measure_hsdp`, :func:`compare_hsdp`): nodes
of several ranks, ``fully_shard`` over the node's ranks and ``set_all_reduce_hook`` running arcsim's compressor over
the rail on each reduce-scatter output; the ranks' gradients are checked against the in-process node-aware
compressor (:class:`arcsim.compressors.hierarchy.NodeAware`). Figures and what they miss: docs/sharding.md."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from arcsim.errors import ArcsimError
from arcsim.sharding.emulated import _model, alone_s, measured_step, run_on_cluster, step_times, time_unsharded

WORKER = "arcsim.sharding.emulated_compressed"


class QuantisedReduceScatter:
    """FSDP2's ``ReduceScatter`` comm (torch.distributed.fsdp._fully_shard._fsdp_api): rs-int8's reduce-scatter of
    FSDP's flat input (chunk r for rank r), each chunk padded to whole blocks; ``record``: keep copies of each
    call's input and output (the gradient check), ``seconds``: each call's wall time (on CPU it is synchronous)."""

    def __init__(self) -> None:
        from arcsim.compressors.sharded import RsInt8

        self.codec = RsInt8.codec
        self.record = False
        self.calls: list[tuple[Any, Any, str]] = []
        self.seconds: list[float] = []
        self.spans: list[tuple[float, float]] = []
        self._comms: dict[Any, Any] = {}

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        import torch

        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> None:
        import torch
        import torch.distributed as dist

        from arcsim.comm.distributed import DistributedComm

        t0 = time.perf_counter()
        if op == dist.ReduceOp.AVG:
            how = "mean"
        elif op == dist.ReduceOp.SUM:
            how = "sum"
        else:
            raise ValueError(f"the quantised reduce-scatter takes AVG or SUM, not {op}")
        comm = self._comms.get(group)
        if comm is None:
            comm = self._comms[group] = DistributedComm(group, "world")
        p, c = comm.world_size, output_tensor.numel()
        block = self.codec.block
        chunks = torch.nn.functional.pad(input_tensor.float().view(1, p, c), (0, (-c) % block))
        got = comm.reduce_scatter(self.codec.encode(chunks), how, "rs-int8", decode=self.codec.decode)
        output_tensor.copy_(got[0, :c].to(output_tensor.dtype))
        t1 = time.perf_counter()
        self.seconds.append(t1 - t0)
        self.spans.append((t0, t1))
        if self.record:
            self.calls.append((input_tensor.detach().clone(), output_tensor.detach().clone(), how))
        return None


def _worker(cfg: dict[str, Any], out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    layers, dim, batch, steps = cfg["layers"], cfg["dim"], cfg["batch"], cfg["steps"]
    local = _model(layers, dim)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)  # each rank its own batch: the ranks' gradients differ
    x = torch.randn(batch, dim)
    fwd, bwd = time_unsharded(local, x, steps, dist.barrier)
    model = _model(layers, dim)
    rs = QuantisedReduceScatter()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
            m.set_custom_reduce_scatter(rs)  # type: ignore[operator]
    fully_shard(model)
    times: list[float] = []
    ag_calls: list[tuple[float, float]] = []
    ag_inside: list[float] = []
    original = dist.all_gather_single

    def timed_gather(*args: Any, **kwargs: Any) -> Any:  # FSDP2 on CPU calls it synchronously
        t0 = time.perf_counter()
        done = original(*args, **kwargs)
        ag_inside.append(time.perf_counter() - t0)
        ag_calls.append((t0, time.perf_counter()))
        return done

    last: list[tuple[str, float, float]] = []
    for step in range(steps + 2):
        if step == 2:
            setattr(dist, "all_gather_single", timed_gather)  # noqa: B010
            rs.seconds.clear()
        rs.record = step == steps + 1
        ag_calls.clear()
        rs.spans.clear()
        dist.barrier()
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        if step >= 2:
            times.append(time.perf_counter() - t0)
        last = sorted([("allgather", a - t0, b - t0) for a, b in ag_calls]
                      + [("reducescatter-int8", a - t0, b - t0) for a, b in rs.spans], key=lambda r: r[1])
    setattr(dist, "all_gather_single", original)  # noqa: B010
    rs_in_step = list(rs.seconds)
    rs.record = False
    unit = (dim + (-dim) % world) * dim + dim + (-dim) % world  # padded weight rows and bias
    ag_out, ag_in = torch.empty(unit), torch.empty(unit // world)
    rs_in, rs_out = torch.randn(unit), torch.empty(unit // world)
    payload = rs.codec.encode(torch.nn.functional.pad(rs_in.view(1, world, -1), (0, (-(unit // world)) % 256)))
    a2a_out = torch.empty_like(payload[0])
    ag, qrs, a2a, codec = [], [], [], []
    for _ in range(cfg.get("alone", 8)):  # each alone: gloo's all-to-all here is bimodal (one time or twice it)
        ag.append(alone_s(lambda: dist.all_gather_single(ag_out, ag_in)))
        qrs.append(alone_s(lambda: rs(rs_out, rs_in, dist.group.WORLD, dist.ReduceOp.AVG)))
        a2a.append(alone_s(lambda: dist.all_to_all_single(a2a_out, payload[0].contiguous())))
        t0 = time.perf_counter()  # the codec's work alone: encode every chunk, decode the P received and sum
        enc = rs.codec.encode(torch.nn.functional.pad(rs_in.view(1, world, -1), (0, (-(unit // world)) % 256)))
        rs.codec.decode(enc[0]).sum(0)
        codec.append(time.perf_counter() - t0)
    torch.save([(i, o, how) for i, o, how in rs.calls], out.with_name(f"{out.stem}-grads-{rank}.pt"))
    if rank == 0:
        out.write_text(json.dumps({
            **step_times(times, fwd, bwd),
            "allgather_s": statistics.median(ag), "reducescatter_int8_s": statistics.median(qrs),
            "alltoall_payload_s": statistics.median(a2a), "codec_s": statistics.median(codec),
            "alone_samples_s": {"allgather": ag, "reducescatter_int8": qrs, "alltoall_payload": a2a},
            "payload_bytes": payload[0].numel(), "allgather_in_step_s": statistics.median(ag_inside),
            "reducescatter_in_step_s": statistics.median(rs_in_step),
            "collectives_in_step_s": (sum(ag_inside) + sum(rs_in_step)) / steps, "last_step_calls": last,
            "unit_numel": unit, "world": world}))
    dist.barrier()
    dist.destroy_process_group()


def gradient_check(ranks: int, out: Path) -> dict[str, Any]:
    """The ranks' reduce-scatter outputs (their last step), joined, against rs-int8 in process on the ranks' own
    inputs (``RsInt8().aggregate`` on the stacked per-rank gradients) and against the exact fp32 mean."""
    import torch

    from arcsim.comm.inprocess import InProcessComm
    from arcsim.compressors.sharded import RsInt8

    per_rank = [torch.load(out.with_name(f"{out.stem}-grads-{r}.pt")) for r in range(ranks)]
    units = len(per_rank[0])
    worst_vs_compressor, worst_vs_exact, numel = 0.0, 0.0, 0
    for u in range(units):
        grads = torch.stack([per_rank[r][u][0].float() for r in range(ranks)])  # [P, n]: each rank's input
        got = torch.cat([per_rank[r][u][1].float() for r in range(ranks)])
        if per_rank[0][u][2] == "sum":
            got = got / ranks
        ref = RsInt8().aggregate(grads, InProcessComm(ranks))[0]
        exact = grads.mean(0)
        scale = float(exact.norm()) or 1.0
        worst_vs_compressor = max(worst_vs_compressor, float((got - ref).norm()) / scale)
        worst_vs_exact = max(worst_vs_exact, float((got - exact).norm()) / scale)
        numel += got.numel()
    return {"units_checked": units, "numel": numel, "rel_error_vs_compressor": worst_vs_compressor,
            "rel_error_vs_exact": worst_vs_exact}


def measure(cfg: dict[str, Any], ranks: int, bandwidth: str, work: Path, prefix: str = "arcshq") -> dict[str, Any]:
    """Run the worker on an emulated cluster of ``ranks`` single-rank nodes at ``bandwidth`` (needs root), and
    check the gradients the ranks reduced (``gradients``)."""
    out = run_on_cluster(WORKER, cfg, ranks, bandwidth, work, prefix, "fsdp-int8")
    measured: dict[str, Any] = json.loads(out.read_text())
    measured["gradients"] = gradient_check(ranks, out)
    return measured


def compare(cfg: dict[str, Any], measured: dict[str, Any], topology: str) -> dict[str, Any]:
    """arcsim's iteration for the measured run: ``fsdp_schedule`` with int8 gradients, the quantised reduce-scatters
    priced on ``topology`` (gloo) as the all-to-all that runs them, and as measured alone."""
    from arcsim.pricing import Pricer
    from arcsim.strategy.schedule import Quantize
    from arcsim.strategy.sharded import sharded_step

    topo, sched, names, fwd, bwd = measured_step(cfg, measured, topology, "full", Quantize(grads="int8"))
    ops = [(c.op, c.unit, c.phase) for c in sched]
    groups = [c.group for c in sched]
    grads = [c.what == "grads" for c in sched]
    compress = [measured["codec_s"] if g else 0.0 for g in grads]  # the codec runs where the collective is issued
    pricer = Pricer(topo)

    def priced(c: Any) -> float:
        op = "alltoall" if c.what == "grads" else c.op  # rs-int8: one all-to-all of the int8 payloads
        return pricer.group(c.group).price(op, c.bytes_per_rank).time_s

    model = sharded_step(names, fwd, bwd, ops, [priced(c) for c in sched], groups, compress)
    alone = sharded_step(names, fwd, bwd, ops, [measured["reducescatter_int8_s"] if g else measured["allgather_s"]
                                                for g in grads], groups)  # the whole call alone, its codec inside
    m = measured["iteration_s"]
    first = next(c for c in sched if c.what == "grads")
    return {"measured_s": m, "predicted_s": model.iteration_s, "ratio": model.iteration_s / m,
            "predicted_with_measured_collectives_s": alone.iteration_s, "ratio_timeline": alone.iteration_s / m,
            "collectives": len(sched), "grad_dtypes": sorted({c.dtype for c in sched if c.what == "grads"}),
            "priced_allgather_s": pricer.price("allgather", sched[0].bytes_per_rank).time_s,
            "measured_allgather_s": measured["allgather_s"], "priced_reducescatter_int8_s": priced(first),
            "measured_alltoall_payload_s": measured["alltoall_payload_s"],
            "measured_reducescatter_int8_s": measured["reducescatter_int8_s"], "codec_s": measured["codec_s"],
            "scheduled_payload_bytes": first.nbytes, "payload_bytes": measured["payload_bytes"],
            "compute_s": measured["forward_s"] + measured["backward_s"]}




# -- HSDP with a compressor between nodes --------------------------------------------------------------------------
def shard_layout(dim: int, parts: int, chunks: int = 1) -> tuple[Any, ...]:
    """The layers of ``chunks`` consecutive FSDP shards of a Linear(dim, dim) sharded ``parts`` ways (each shard: its
    weight rows, then its bias), as :class:`arcsim.compressors.layout.Layer` s — what a compressor's per-tensor scope
    sees on one rank's shard (chunks=1) or on the unit's reduce-scatter input (chunks=parts)."""
    from arcsim.compressors.layout import Layer

    rows = dim // parts
    size = rows * dim + rows
    return tuple(layer for r in range(chunks) for layer in (Layer(f"weight{r}", (rows, dim), r * size),
                                                            Layer(f"bias{r}", (rows,), r * size + rows * dim)))


def _hsdp_worker(cfg: dict[str, Any], out: Path) -> None:
    """One rank of HSDP on nodes of ``gpus`` ranks: ``fully_shard`` over the node's ranks (the ``shard`` dim of a
    (nodes, gpus) DeviceMesh), and ``set_all_reduce_hook`` running arcsim's compressor (``compressor``, with
    memory ``memory``) on each reduce-scatter output among the ranks of the same local rank on every node (the rail,
    the mesh's ``rail`` dim) through :class:`arcsim.comm.distributed.DistributedComm`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from arcsim.comm.distributed import DistributedComm
    from arcsim.comm.inprocess import InProcessComm
    from arcsim.compressors.memory import make_memory
    from arcsim.compressors.registry import make_compressor

    torch.set_num_threads(1)
    layers, dim, batch, steps, g = cfg["layers"], cfg["dim"], cfg["batch"], cfg["steps"], cfg["gpus"]
    if dim % g:
        raise ValueError(f"dim {dim} must split evenly over the node's {g} ranks (no FSDP padding)")
    layout = shard_layout(dim, g)
    local = _model(layers, dim)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)
    x = torch.randn(batch, dim)
    fwd, bwd = time_unsharded(local, x, steps, dist.barrier)
    # fp16 training's loss scale (its dynamic scaler's first, 2^16): this MLP's gradients are ~1e-6, subnormal in fp16
    scale = float(cfg.get("loss_scale", 1.0))
    mesh = init_device_mesh("cpu", (world // g, g), mesh_dim_names=("rail", "shard"))
    rail = DistributedComm(mesh["rail"].get_group(), "inter")
    hooks: dict[int, tuple[Any, Any]] = {}  # per unit: its compressor and memory (error feedback per shard)
    hook_s: list[float] = []
    spans: list[tuple[str, float, float]] = []
    records: list[Any] = []
    outputs: list[Any] = []

    def make_hook(unit: int) -> Any:
        comp = make_compressor(cfg["compressor"], cfg.get("density", 0.01), seed=unit)
        mem = make_memory(cfg.get("memory", "none"))
        hooks[unit] = (comp, mem)
        state = {"step": 0}

        def hook(reduce_output: Any) -> None:
            t0 = time.perf_counter()
            mark = rail.log.mark()
            agg = mem.step(reduce_output.detach().float().view(1, -1), comp, rail, state["step"], layout)
            reduce_output.copy_(agg[0].to(reduce_output.dtype))
            state["step"] += 1
            t1 = time.perf_counter()
            hook_s.append(t1 - t0)
            spans.append(("hook", t0, t1))
            records[:] = rail.log.since(mark)
        return hook

    model = _model(layers, dim)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    for i, m in enumerate(linears):
        fully_shard(m, mesh=mesh["shard"])
        m.set_all_reduce_hook(make_hook(i))  # type: ignore[operator]
    fully_shard(model, mesh=mesh["shard"])
    originals: dict[str, Any] = {"allgather": dist.all_gather_single, "reducescatter": dist.reduce_scatter_single}
    inside: dict[str, list[float]] = {"allgather": [], "reducescatter": []}
    rs_inputs: list[Any] = []
    record = {"on": False}

    def timed(op: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if op == "reducescatter" and record["on"]:
                rs_inputs.append((args[1] if len(args) > 1 else kwargs["input"]).detach().clone())
            t0 = time.perf_counter()
            done = originals[op](*args, **kwargs)
            t1 = time.perf_counter()
            inside[op].append(t1 - t0)
            spans.append((op, t0, t1))
            return done
        return call

    times: list[float] = []
    last: list[tuple[str, float, float]] = []
    for step in range(steps + 2):
        if step == 2:
            setattr(dist, "all_gather_single", timed("allgather"))  # noqa: B010
            setattr(dist, "reduce_scatter_single", timed("reducescatter"))  # noqa: B010
            hook_s.clear()
        record["on"] = step == steps + 1
        spans.clear()
        for m in linears:
            for p in m.parameters():
                p.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        (model(x).pow(2).mean() * scale).backward()
        if step >= 2:
            times.append(time.perf_counter() - t0)
        last = [(op, a - t0, b - t0) for op, a, b in spans]
    setattr(dist, "all_gather_single", originals["allgather"])  # noqa: B010
    setattr(dist, "reduce_scatter_single", originals["reducescatter"])  # noqa: B010
    for m in linears:  # this rank's shard of each unit's gradient, in FSDP's flat order (weight rows, bias)
        w, b = m.weight.grad, m.bias.grad
        assert w is not None and b is not None
        outputs.append(torch.cat([w.to_local().reshape(-1), b.to_local().reshape(-1)]))  # type: ignore[attr-defined]
    hook_in_step = list(hook_s)
    unit = (dim + (-dim) % g) * dim + dim + (-dim) % g
    node = mesh["shard"].get_group()
    ag_out, ag_in = torch.empty(unit), torch.empty(unit // g)
    rs_in, rs_out = torch.randn(unit), torch.empty(unit // g)
    shard = torch.randn(unit // g)
    comp, mem = make_compressor(cfg["compressor"], cfg.get("density", 0.01)), make_memory("none")
    ag, rs, hk, ar, codec = [], [], [], [], []
    for _ in range(steps):
        ag.append(alone_s(lambda: dist.all_gather_single(ag_out, ag_in, group=node)))
        rs.append(alone_s(lambda: dist.reduce_scatter_single(rs_out, rs_in, group=node)))
        # the compressed all-reduce of one shard, every rail at once (as in the step)
        hk.append(alone_s(lambda: mem.step(shard.view(1, -1), comp, rail, 0, layout)))
        ar.append(alone_s(lambda: dist.all_reduce(shard.clone(), group=rail.group)))
        nodes = world // g  # the compressor's arithmetic alone: the rail's workers stacked in one process, per worker
        stacked = shard.view(1, -1).expand(nodes, -1).contiguous()
        t0 = time.perf_counter()
        mem.step(stacked, comp, InProcessComm(nodes, group="inter"), 0, layout)
        codec.append((time.perf_counter() - t0) / nodes)
    torch.save({"inputs": rs_inputs[::-1], "outputs": outputs},  # backward reduces the last unit first
               out.with_name(f"{out.stem}-grads-{rank}.pt"))
    if rank == 0:
        out.write_text(json.dumps({
            **step_times(times, fwd, bwd),
            "node_allgather_s": statistics.median(ag), "node_reducescatter_s": statistics.median(rs),
            "rail_compressed_s": statistics.median(hk), "rail_allreduce_fp32_s": statistics.median(ar),
            "codec_s": statistics.median(codec),
            "allgather_in_step_s": statistics.median(inside["allgather"]),
            "reducescatter_in_step_s": statistics.median(inside["reducescatter"]),
            "hook_in_step_s": statistics.median(hook_in_step),
            "collectives_in_step_s": (sum(inside["allgather"]) + sum(inside["reducescatter"]) + sum(hook_in_step))
            / steps, "last_step_calls": last, "unit_numel": unit, "world": world, "gpus": g,
            "rail_records": [dataclasses.asdict(r) for r in records]}, default=str))
    dist.barrier()
    dist.destroy_process_group()


def hsdp_gradient_check(cfg: dict[str, Any], ranks: int, out: Path) -> dict[str, Any]:
    """Each rank's final gradient shard against arcsim's in-process node-aware compressor
    (:class:`arcsim.compressors.hierarchy.NodeAware`) on the ranks' own reduce-scatter inputs, run as many steps
    (its memory sees the same history; the model takes no optimizer step, so every step's gradients are these)."""
    import torch

    from arcsim.compressors.grouping import group_workers
    from arcsim.compressors.hierarchy import NodeAware
    from arcsim.compressors.memory import make_memory
    from arcsim.compressors.registry import make_compressor

    g = cfg["gpus"]
    per_rank = [torch.load(out.with_name(f"{out.stem}-grads-{r}.pt")) for r in range(ranks)]
    units = len(per_rank[0]["outputs"])
    worst, worst_exact, worst_nodes = 0.0, 0.0, 0.0
    for u in range(units):
        grads = torch.stack([per_rank[r]["inputs"][u].float() for r in range(ranks)])  # [P, n] FSDP's flat order
        def make(part: int, u: int = u) -> tuple[Any, Any]:  # every slice of unit u: the rank's hook's compressor
            return (make_compressor(cfg["compressor"], cfg.get("density", 0.01), seed=u),
                    make_memory(cfg.get("memory", "none")))

        aware = NodeAware(group_workers(ranks, g), grads.shape[1], shard_layout(cfg["dim"], g, g), make)
        for step in range(cfg["steps"] + 2):
            ref = aware.step(grads, step)[0][0]
        exact = grads.mean(0)
        scale = float(exact.norm()) or 1.0
        nodes = [torch.cat([per_rank[j * g + local]["outputs"][u].float() for local in range(g)])
                 for j in range(ranks // g)]
        for got in nodes:
            worst = max(worst, float((got - ref).norm()) / scale)
            worst_exact = max(worst_exact, float((got - exact).norm()) / scale)
        worst_nodes = max(worst_nodes, max(float((n - nodes[0]).norm()) / scale for n in nodes))
    return {"units_checked": units, "rel_error_vs_node_aware": worst, "rel_error_vs_exact": worst_exact,
            "rel_difference_between_nodes": worst_nodes}


def measure_hsdp(cfg: dict[str, Any], ranks: int, bandwidth: str, work: Path, prefix: str = "arcshh"
                 ) -> dict[str, Any]:
    """Run the HSDP worker on an emulated cluster of ``ranks`` ranks in nodes of ``cfg['gpus']`` (needs root)."""
    out = run_on_cluster(WORKER, {**cfg, "mode": "hsdp"}, ranks, bandwidth, work, prefix, "hsdp-emulated",
                         cfg["gpus"])
    measured: dict[str, Any] = json.loads(out.read_text())
    measured["gradients"] = hsdp_gradient_check(cfg, ranks, out)
    return measured


def compare_hsdp(cfg: dict[str, Any], measured: dict[str, Any], topology: str, node: str | None = None
                 ) -> dict[str, Any]:
    """arcsim's iteration for the measured HSDP run: ``fsdp_schedule(..., "hybrid")`` with each unit's cross-node
    all-reduce replaced by the compressor's collectives on the rail (the records the ranks logged, priced by arcsim's
    gloo model on ``topology``'s ``inter`` group, its NIC shared by the node's rails) and its arithmetic as measured
    before it, as arcsim.run.strategies' HSDP rows do; the node's collectives priced and as measured alone.
    ``node``: a topology calibrated with nodes of ``cfg['gpus']`` ranks (arcsim calibrate --ranks-per-node) whose
    fits inside a node price the node's collectives — the emulated node's ranks talk over loopback, which the
    named topology describes as NVLink. ``serial``: every collective on one lane, as FSDP2 on CPU issues them
    (synchronously, the hook too); ``overlapped``: the strategy layer's GPU timeline (cross-node all-reduces beside
    the node's)."""
    from arcsim.comm.log import CommRecord
    from arcsim.pricing import Pricer
    from arcsim.strategy.sharded import sharded_step
    from arcsim.topology import load_topology

    topo, sched, names, fwd, bwd = measured_step(cfg, measured, topology, "hybrid")
    if node is not None:
        calibrated = load_topology(node)
        if calibrated.gpus_per_node != topo.gpus_per_node or "node" not in calibrated.group_calibration:
            raise ArcsimError(f"{node} holds no fits inside nodes of {topo.gpus_per_node} ranks: calibrate with "
                             f"--ranks-per-node {topo.gpus_per_node}")
        topo = dataclasses.replace(topo, intra=calibrated.intra, group_calibration={
            **topo.group_calibration, "node": calibrated.group_calibration["node"]})
    ops = [(c.op, c.unit, c.phase) for c in sched]
    groups = [c.group for c in sched]
    cross = [c.op == "allreduce" and c.group == "inter" for c in sched]
    pricer = Pricer(topo)
    rail = [CommRecord(**r) for r in measured["rail_records"]]
    rail_priced = sum(p.time_s for p in pricer.records(rail))
    compress = [measured["codec_s"] if x else 0.0 for x in cross]
    priced = [rail_priced if x else pricer.group(c.group).price(c.op, c.bytes_per_rank).time_s
              for c, x in zip(sched, cross, strict=True)]
    alone = [measured["rail_compressed_s"] if x else measured["node_allgather_s" if c.op == "allgather"
                                                             else "node_reducescatter_s"]
             for c, x in zip(sched, cross, strict=True)]
    serial = sharded_step(names, fwd, bwd, ops, priced, None, compress)
    overlapped = sharded_step(names, fwd, bwd, ops, priced, groups, compress)
    serial_alone = sharded_step(names, fwd, bwd, ops, alone, None)  # the hook alone has its arithmetic inside
    m = measured["iteration_s"]
    first = next(c for c in sched if c.group == "node" and c.op == "allgather")
    return {"measured_s": m, "predicted_s": serial.iteration_s, "ratio": serial.iteration_s / m,
            "predicted_overlapped_s": overlapped.iteration_s, "ratio_overlapped": overlapped.iteration_s / m,
            "predicted_with_measured_collectives_s": serial_alone.iteration_s,
            "ratio_timeline": serial_alone.iteration_s / m, "collectives": len(sched),
            "cross_node": sum(cross), "priced_rail_s": rail_priced, "measured_rail_compressed_s":
            measured["rail_compressed_s"], "measured_rail_fp32_allreduce_s": measured["rail_allreduce_fp32_s"],
            "priced_rail_fp32_allreduce_s": pricer.group("inter").price(
                "allreduce", next(c for c in sched if c.op == "allreduce").bytes_per_rank).time_s,
            "priced_node_allgather_s": pricer.group("node").price("allgather", first.bytes_per_rank).time_s,
            "measured_node_allgather_s": measured["node_allgather_s"],
            "measured_node_reducescatter_s": measured["node_reducescatter_s"], "codec_s": measured["codec_s"],
            "compute_s": measured["forward_s"] + measured["backward_s"]}


if __name__ == "__main__":
    _cfg = json.loads(Path(sys.argv[1]).read_text())
    (_hsdp_worker if _cfg.get("mode") == "hsdp" else _worker)(_cfg, Path(sys.argv[2]))
