"""`arcsim run --sharding none,full,hybrid`: the parallel strategies side by side on the run's own compute,
gradients and cluster — DDP with the compressors run measured (its dense baseline and its recommendation), and
full sharding (FSDP2 / ZeRO-3) and hybrid sharding (HSDP) with their quantised variants (ZeRO++'s qwZ, qgZ, hpZ),
each on the strategy layer's timeline engine with the cluster's effects, with its memory per GPU and the error
its reduction makes on the trace's gradients (arcsim.compressors.sharded). A row that does not fit its GPU is marked and
never the recommendation; the recommendation is picked by the run's --policy where it ranks strategy rows, and says
by which rule (the JSON's strategy_recommendation, the answer the report leads with)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arcsim.catalog import INFO, memory_for
from arcsim.comm.log import CommRecord, resized
from arcsim.compressors.grouping import group_workers
from arcsim.devices.catalog import device
from arcsim.devices.kernels import compress_seconds
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer
from arcsim.run.convergence import StepsModel, fit_steps_model
from arcsim.run.decisions import UNUSABLE_ERROR, front_pick
from arcsim.strategy import effects
from arcsim.strategy.memory import Memory, memory_per_gpu, replica_buffers
from arcsim.strategy.schedule import (
    Quantize,
    ShardCollective,
    check_fits,
    gathered_dtype,
    quantize_variant,
)
from arcsim.strategy.sharded import ShardedModel, price_plans, sharded_model, sharded_result

if TYPE_CHECKING:
    from rich.console import Console

    from arcsim.run.analysis import Analysis, RunResult
    from arcsim.run.measurement import Measurement

DEFAULT_VARIANTS = ("none", "qgz", "zeropp")
EF_BYTES = 4  # an error-feedback residual: one fp32 per parameter
FRAMEWORK_LABELS = {"ddp": "DDP", "horovod": "Horovod", "deepspeed": "DeepSpeed"}  # a replicated row's, as people say


@dataclass(frozen=True)
class StrategyRow:
    strategy: str          # none (DDP), full (FSDP2 / ZeRO-3), hybrid (HSDP)
    setting: str           # DDP: the compressor on its collective; sharded: the quantisation variant
    iteration_s: float
    compute_s: float       # one rank's forward + backward (+ after): the same on every row
    effects_s: float
    exposed_comm_s: float
    rel_error: float       # the aggregate's error on the trace's gradients
    memory: Memory
    recommended: bool = False
    time_to_target_s: float | None = None  # None: an error the steps model has no evidence for
    framework: str = "ddp"  # a replicated row's: ddp, horovod or deepspeed
    ddp_choice: bool = False  # DDP's own recommendation (the run's --policy over its compressors)
    picked_by: str | None = None  # the recommended row's: the rule that picked it (:func:`_mark_recommended`)

    @property
    def label(self) -> str:
        return {"none": FRAMEWORK_LABELS[self.framework], "full": "FSDP", "hybrid": "HSDP"}[self.strategy]

    def headline(self) -> str:
        """``HSDP (hybrid sharding) with qgZ int8``: the row as a recommendation."""
        what = {"none": self.label, "full": "FSDP (full sharding)", "hybrid": "HSDP (hybrid sharding)"}[self.strategy]
        return what if self.setting == "none" else f"{what} with {self.setting}"

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "label": self.label, "setting": self.setting,
                "iteration_s": self.iteration_s, "compute_s": self.compute_s, "effects_s": self.effects_s,
                "exposed_comm_s": self.exposed_comm_s, "rel_error": self.rel_error, "memory": self.memory.to_dict(),
                "fits": self.memory.fits, "time_to_target_s": self.time_to_target_s,
                "recommended": self.recommended, "ddp_recommendation": self.ddp_choice, "picked_by": self.picked_by}


def strategy_recommendation(rows: Sequence[StrategyRow]) -> dict[str, Any] | None:
    """The answer `arcsim run --sharding` leads with, for the JSON: the recommended row, its headline and the rule
    that picked it (None: no row fits)."""
    best = next((r for r in rows if r.recommended), None)
    return None if best is None else {**best.to_dict(), "headline": best.headline()}


def _capacity(analysis: Analysis) -> float:
    gpu = analysis.ctx.gpu
    if gpu is None and analysis.ctx.topo.gpu is not None:
        gpu = device(analysis.ctx.topo.gpu)
    return gpu.capacity_bytes if gpu is not None else math.inf


def _variants(strategy: str, topo_nodes: int, gpus_per_node: int) -> list[Quantize]:
    out = []
    for name in DEFAULT_VARIANTS:
        q = quantize_variant(name)
        try:
            check_fits(strategy, q, gpus_per_node, topo_nodes, "")
        except ArcsimError:
            continue
        if q.grads != "none" and strategy == "hybrid":
            q = Quantize(q.weights, q.grads, False)  # HSDP keeps backward's gathers in the node already
        out.append(q)
    return list(dict.fromkeys(out))


def reduction_way(q: Quantize, strategy: str, nodes: int, reduce_dtype: str = "fp32") -> str | None:
    """The way :mod:`arcsim.compressors.sharded` measures ``q``'s gradient reduction in ``reduce_dtype`` (None: exact,
    fp32)."""
    if q.grads == "none":
        return "bf16" if reduce_dtype == "bf16" else None
    if nodes < 2:
        return "int8" if q.grads == "int8" else "int4-hier"
    # across nodes both quantise twice: FSDP's qgZ in the node then across, HSDP's in-node reduce-scatter then the
    # shard's all-reduce between nodes in the same format
    return "int8-hier" if q.grads == "int8" else "int4-hier"


def _errors(analysis: Analysis, ways: set[str]) -> dict[str, float]:
    """Each way's mean aggregate error on the trace's steps (workers as the trace has them, two nodes of half)."""
    if not ways:
        return {}
    from arcsim.compressors.sharded import reduction_errors, sampled_pieces, trace_pieces
    from arcsim.traces.format import Trace

    trace = analysis.trace
    workers = trace.workers
    per_node = analysis.ctx.topo.gpus_per_node
    g = per_node if workers % per_node == 0 and workers > per_node else max(workers // 2, 1)
    # a stored trace in pieces of columns (memory O(workers × piece), LLaMA-1B's too); live gradients, a compressed
    # trace's (no random access) and a trace the analysis holds in memory as they are held
    steps: Iterable[Any] = (grads for _, grads in analysis.steps())
    if isinstance(trace, Trace) and trace.random_access and analysis.streamed():
        steps = trace_pieces(trace)
    sample = analysis.layer_sample()  # a large trace: its blocks sampled at the layer sample's share
    if sample is not None:
        steps = sampled_pieces(steps, workers, 1 / sample.stride, analysis.cfg.seed, trace.elements)
    return {e.how: e.rel_error_mean for e in reduction_errors(steps, g, tuple(sorted(ways)))}


def _ddp_rows(result: RunResult, memory: Memory, params: int) -> list[StrategyRow]:
    """The dense baseline and DDP's recommendation (a per-bucket mix, or a ratio of the grid, as the policy priced
    it), each with its framework's buffers (:func:`arcsim.strategy.memory.replica_buffers`) and its error feedback's
    residual where it keeps one; the recommendation's row marked ``ddp_choice``."""
    rec, dense, framework = result.recommendation, result.dense, result.config.framework
    buffers = replica_buffers(framework, params, result.config.bucket_cap_mb * 2**20)
    key = (rec.compressor, rec.collective, rec.hierarchy, rec.density, rec.op)
    chosen = [c for c in result.candidates if (c.compressor, c.collective, c.hierarchy, c.density, c.op) == key]
    seen = [dense, *chosen[:1]]
    seen = [c for i, c in enumerate(seen) if c not in seen[:i]]
    rows, choice = [], None
    for c in seen:
        ef = EF_BYTES * params if memory_for(c.compressor, c.memory) != "none" else 0.0
        mem = Memory("none", memory.states_bytes + ef, buffers, 0.0, memory.capacity_bytes)
        density = f"@{c.density:g}" if c.density is not None else ""
        rows.append(StrategyRow("none", f"{c.compressor}{density} {c.op} {c.collective}", c.iteration_s, c.compute_s,
                                c.effects_s, c.exposed_comm_s, c.rel_error, mem, framework=framework))
        if (c.compressor, c.collective, c.hierarchy, c.density, c.op) == key:
            choice = len(rows) - 1
    pol = result.policy
    if choice is None:  # a mix, or one setting at a ratio of the grid that --density's candidates lack
        priced_by_policy = pol is not None and (rec.is_mix or pol.name in ("auto", "paper"))
        if priced_by_policy:
            assert pol is not None
            feedback = any(memory_for(b.compressor, result.config.memory) != "none" for b in pol.choices)
            iteration_s, exposed_s, error = pol.iteration_s, pol.exposed_comm_s, pol.rel_error
        else:  # the front's pick (--policy none, gate): its grid point's time; all beyond compute counted exposed
            feedback = memory_for(rec.compressor, result.config.memory) != "none"
            iteration_s, error = rec.iteration_s, rec.rel_error
            exposed_s = max(0.0, rec.iteration_s - dense.compute_s - dense.effects_s)
        mem = Memory("none", memory.states_bytes + (EF_BYTES * params if feedback else 0.0), buffers, 0.0,
                     memory.capacity_bytes)
        density = f"@{rec.density:g}" if rec.density is not None else ""
        setting = ("per-bucket mix (the recommendation)" if rec.is_mix else
                   f"{rec.compressor}{density} {rec.op} {rec.collective}")
        rows.append(StrategyRow("none", setting, iteration_s, dense.compute_s, dense.effects_s, exposed_s, error, mem,
                                framework=framework))
        choice = len(rows) - 1
    if choice is not None:
        rows[choice] = dataclasses.replace(rows[choice], ddp_choice=True)
    return rows


def strategy_rows(analysis: Analysis, result: RunResult, strategies: Sequence[str]) -> list[StrategyRow]:
    """Every strategy asked for on ``analysis``'s trace, compute and topology (see the module's docstring), one row
    that fits marked recommended by the run's --policy (:func:`_mark_recommended`)."""
    ctx, topo = analysis.ctx, analysis.ctx.topo
    layers = list(reversed(analysis.trace.layers))  # the trace keeps backward order; units follow forward order
    c = ctx.compute
    sharded = sharded_model([(la.name, tuple(la.shape)) for la in layers],
                            [(la.name, float(r)) for la, r in zip(analysis.trace.layers, c.ready_s, strict=True)],
                            c.forward_s, c.backward_s)
    units, root = list(sharded.units), sharded.root
    param_dtype = gathered_dtype((result.compute_basis or {}).get("precision", "fp32"))
    capacity = _capacity(analysis)
    dense_memory = memory_per_gpu("none", units, root, topo.ranks, topo.gpus_per_node, capacity)
    rows = _ddp_rows(result, dense_memory, sharded.params) if "none" in strategies else []
    plans = [(s, q, dtype) for s in strategies if s != "none" for q in _variants(s, topo.nodes, topo.gpus_per_node)
             for dtype in (("fp32", "bf16") if not q.active else ("fp32",))]
    errors = _errors(analysis, {w for s, q, d in plans if (w := reduction_way(q, s, topo.nodes, d)) is not None})
    pricer = Pricer(topo, ctx.engine)
    device_compute = c.forward_s + c.backward_s + c.after_s
    for s, q, dtype, sched, r in price_plans(sharded, plans, pricer, capacity, param_dtype, device_compute, c.after_s,
                                             ctx.gpu):
        way = reduction_way(q, s, topo.nodes, dtype)
        setting = "bf16 reduction" if dtype == "bf16" else q.label
        rows.append(StrategyRow(s, setting, r.iteration_s, device_compute, r.effects_s, r.exposed_comm_s,
                                0.0 if way is None else errors[way], r.memory))
        if s == "hybrid" and not q.active and dtype == "fp32" and topo.nodes > 1:
            rows.extend(_hsdp_compressed(analysis, sched, sharded, pricer, r.memory, device_compute))
    gate = result.policy.error_limit if result.policy is not None and result.policy.name == "gate" else None
    return _mark_recommended(rows, fit_steps_model(analysis.cfg.dense_steps), result.config.policy, gate,
                             result.config.weights)


def _hsdp_compressed(analysis: Analysis, sched: list[ShardCollective], sharded: ShardedModel, pricer: Pricer,
                     mem: Memory, device_compute: float) -> list[StrategyRow]:
    """HSDP with each compressor the run measured on the cross-node all-reduce of every unit's shard: its
    node-aware measurement (dense reduce-scatter inside the node, the node's sum compressed over the rails) is
    that very computation, so its error is the row's and its collectives between nodes, resized to each shard,
    replace the all-reduce; its compression runs on the compute stream after the unit's backward."""
    cfg, ctx = analysis.cfg, analysis.ctx
    sizes = {u.name: u.numel for u in [*sharded.units, sharded.root]}
    layers = {u.name: max(1, len(u.shapes)) for u in [*sharded.units, sharded.root]}
    whole = sum(sizes.values())
    rows: list[StrategyRow] = []
    try:
        group_workers(analysis.trace.workers, ctx.topo.gpus_per_node)
    except ArcsimError as exc:  # the trace's workers cannot stand for this cluster's nodes
        analysis.announce(f"HSDP with a compressor between nodes not priced: {exc}")
        return rows
    for name in [n for n in cfg.compressors if n != "dense"]:
        meas = analysis.measurement(name, cfg.density, hierarchy="node")
        between = one_collective_set([r for bucket in meas.records[0] for r in bucket if r.group != "node"])
        slice_elements = max(1, sum(b.numel for b in ctx.buckets) // ctx.topo.gpus_per_node)
        comm: list[float | None] = []
        compress: list[float] = []
        for col in sched:
            if col.op != "allreduce" or col.group != "inter":
                comm.append(None)
                compress.append(0.0)
                continue
            share = col.numel / slice_elements
            resized_records = [resized(r, max(1, round(r.elements * share))) for r in between]
            comm.append(sum(p.time_s for p in pricer.records(resized_records))
                        + (effects.records_jitter_s(resized_records, ctx.topo) if ctx.engine == "analytic" else 0.0))
            compress.append(_compress_s(analysis, meas, col.numel, sizes[col.unit] / whole, layers[col.unit]))
        density = f"@{meas.density:g}" if not INFO[name].density_free else ""
        r = sharded_result("hybrid", Quantize(), sharded.order, sharded.forward_s, sharded.backward_s, sched, pricer,
                           mem, device_compute, ctx.compute.after_s, comm, compress)
        ef = EF_BYTES * whole / ctx.topo.gpus_per_node if memory_for(name, meas.memory) != "none" else 0.0
        rows.append(StrategyRow("hybrid", f"{name}{density} between nodes", r.iteration_s, device_compute,
                                r.effects_s, r.exposed_comm_s, meas.rel_error(),
                                dataclasses.replace(mem, states_bytes=mem.states_bytes + ef)))
    return rows


def one_collective_set(records: list[CommRecord]) -> list[CommRecord]:
    """A compressor's collectives over every bucket as one set over the whole gradient: records of the same op, group,
    tag and dtype merged (their elements summed), so a unit's shard is one set of collectives, not one per bucket."""
    merged: dict[tuple[str, str, str, str], CommRecord] = {}
    for r in records:
        key = (r.op, r.group, r.tag, r.dtype)
        merged[key] = resized(merged[key], merged[key].elements + r.elements) if key in merged else r
    return list(merged.values())


def _compress_s(analysis: Analysis, meas: Measurement, shard_elements: int, share: float, layers: int) -> float:
    """One shard's compression (``layers`` tensors): modelled on the run's GPU, else the measurement's (one step's,
    all buckets) × the unit's share of the model."""
    ctx = analysis.ctx
    if ctx.gpu is not None:
        return compress_seconds(meas.compressor, ctx.scope, shard_elements, layers, ctx.gpu, meas.density,
                                ctx.topo.nodes)
    return float(sum(meas.compress_s[0])) * share * ctx.scale_for(meas.compressor)


def not_under_full_sharding(compressors: Sequence[str]) -> dict[str, str]:
    """Each of ``compressors`` that full sharding does not take, and why (HSDP takes them between nodes)."""
    out = {}
    for name in compressors:
        info = INFO[name]
        if name in ("dense", "fp16", "bf16") or info.family == "reduce-scatter":
            continue  # a reduce-scatter's own dtype (the bf16 reduction row) or quantised format
        if info.selection == "low-rank":
            out[name] = "needs each gradient matrix whole on every rank, which FSDP never assembles"
        elif info.family == "all-reduce":
            out[name] = ("agrees on indices for one all-reduce of the whole bucket; agreeing per shard of FSDP's "
                         "reduce-scatters is not built")
        else:
            out[name] = ("each rank's values sit at its own indices or scale, so a reduce-scatter cannot sum them; "
                         "an all-to-all to each shard's owner sends what all-gather DDP sends")
    return out


@dataclass
class _Point:
    """A row as the front's pick reads it (arcsim.run.decisions.Scored)."""

    compressor: str
    iteration_s: float
    rel_error: float


def _mark_recommended(rows: list[StrategyRow], model: StepsModel, policy: str = "auto",
                      gate_limit: float | None = None, weights: tuple[float, float] | None = None) -> list[StrategyRow]:
    """Each row's time to the target (iteration × the steps its error needs, auto's steps model), and one row that
    fits and is usable marked recommended by the run's ``policy`` where it ranks strategy rows: auto the soonest to
    the target (of the rows the steps model covers); gate the fastest whose error is within ``gate_limit`` (Top-K's
    × (1 + --slack)); none the front's pick of iteration against error (the knee, or ASF by ``weights``), as DDP's
    recommendation is picked without a policy. Paper ranks each bucket's compressors by compression gain, which no
    strategy row has: auto's rule, said so. The recommended row carries the rule that picked it (``picked_by``)."""
    timed = [dataclasses.replace(r, time_to_target_s=r.iteration_s * model.dense_steps * model.factor(r.rel_error)
                                 if model.covers(r.rel_error) else None) for r in rows]
    fitting = [r for r in timed if r.memory.fits and r.rel_error < UNUSABLE_ERROR]
    best: StrategyRow | None
    if policy == "gate":
        eligible = [r for r in fitting if gate_limit is None or r.rel_error <= gate_limit]
        best = min(eligible, key=lambda r: (r.iteration_s, r.rel_error), default=None)
        limit = "every usable error: no sparsifier measured" if gate_limit is None else f"≤ {gate_limit:.3g}"
        rule = f"--policy gate's: the fastest that fits with its error within the gate ({limit}; Top-K's × (1 + slack))"
    elif policy == "none":
        best, how = None, "the knee"
        if fitting:
            pick, how = front_pick([_Point(r.label, r.iteration_s, r.rel_error) for r in fitting], weights)
            best = fitting[pick]
        rule = (f"--policy none's, as DDP's recommendation without a policy: on the front of iteration against error "
                f"of the rows that fit, {how}")
    else:
        covered = [r for r in fitting if r.time_to_target_s is not None]
        best = min(covered, key=lambda r: (r.time_to_target_s, r.iteration_s), default=None)
        rule = "auto's: the soonest to the target (iteration × the steps its error needs) that fits"
        if policy == "paper":
            rule += (" (--policy paper ranks each bucket's compressors by compression gain, which no strategy row has: "
                     "auto's rule picks the row)")
    return [dataclasses.replace(r, recommended=r is best, picked_by=rule if r is best else None) for r in timed]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g}"


def render_strategies(rows: Sequence[StrategyRow], topology: str, console: Console,
                      refused: dict[str, str] | None = None) -> None:
    """The strategies side by side: one table, memory per GPU on every row; ``refused``: compressors full sharding
    does not take, with why."""
    from rich.table import Table

    capacity = rows[0].memory.capacity_bytes if rows else math.inf
    best = next((r for r in rows if r.recommended), None)
    picked = "none: no row fits" if best is None else f"the row picked by {best.picked_by}"
    fits_note = f"of {_gb(capacity)} GB" if math.isfinite(capacity) else "(no GPU named: nothing checked)"
    table = Table(title=f"Parallel strategies on {topology}: one step each, memory per GPU {fits_note}",
                  caption="DDP: its dense baseline and its own recommendation; FSDP: full sharding (ZeRO-3), "
                          "HSDP: hybrid (sharded in the node, replicated across), each FSDP2's schedule, "
                          "quantised as ZeRO++ (qwZ weights, qgZ gradients, hpZ); error: the reduction's on the "
                          "trace's gradients; memory: parameters, gradients, Adam's states and working copies "
                          "(DDP: its buckets' copy of the gradients; activations apart); to target: the iteration × "
                          "the steps its error needs (run's auto "
                          f"rule; –: no evidence it gets there); ★ {picked}")
    for col in ("strategy", "setting", "ms", "exposed ms", "error", "to target s", "GB/GPU", "fits"):
        table.add_column(col, justify="left" if col in ("strategy", "setting") else "right")
    for r in rows:
        table.add_row(("★ " if r.recommended else "") + r.label, r.setting, f"{r.iteration_s * 1e3:.1f}",
                      f"{r.exposed_comm_s * 1e3:.1f}",
                      f"{r.rel_error:.3g}", "–" if r.time_to_target_s is None else f"{r.time_to_target_s:.1f}",
                      _gb(r.memory.total_bytes),
                      "yes" if r.memory.fits else "[red]does not fit[/red]")
    console.print(table)
    for name, why in (refused or {}).items():
        console.print(f"  not under FSDP: {name} — {why} (HSDP takes it between nodes)")
