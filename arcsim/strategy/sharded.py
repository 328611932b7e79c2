"""Sharded data parallelism (FSDP2 ``fully_shard`` / ZeRO-3, HSDP, ZeRO++) as the timeline engine's items: the
compute stream runs each unit's forward (the root first) and then each unit's backward (in reverse, the root
last); the collectives of :func:`arcsim.strategy.schedule.fsdp_schedule` run in issue order on the links of their
group. FSDP2 runs HSDP's cross-node all-reduces on a stream of their own, and they use only the NICs while the
node's all-gathers and reduce-scatters use only NVLink, so a collective of the ``inter`` group and one of the
``node`` group may run at once; a ``world`` collective holds both (on one node, ``world`` and ``node`` are the same
links and never overlap).

- a unit's forward or backward waits for its all-gather;
- a forward all-gather may start when the previous unit's forward starts (prefetch one unit ahead; the first
  ones at once), a backward all-gather when the previous unit in backward starts (the first one, and the
  root's, when forward ends);
- a reduce-scatter may start when its unit's backward ends; what follows it for the same unit (HSDP's
  all-reduce, qgZ's second step) follows it.

:func:`price_plans` is the one loop over (strategy, quantisation, reduction dtype) that `arcsim shard` and
`arcsim run --sharding` both run: each plan's memory per GPU, FSDP2's schedule and its step."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from arcsim.devices.catalog import Device
from arcsim.devices.kernels import compress_seconds
from arcsim.pricing import Pricer
from arcsim.strategy import effects
from arcsim.strategy.engine import NO_STEP_EFFECTS, Item, StepEffects, Timeline, link_lanes, run
from arcsim.strategy.memory import Memory, memory_per_gpu
from arcsim.strategy.schedule import Quantize, ShardCollective, cross_node_bytes, fsdp_schedule
from arcsim.strategy.units import ROOT, ShardUnit, assign, group_units


def sharded_items(order: Sequence[str], forward_s: dict[str, float], backward_s: dict[str, float],
                  collectives: Sequence[tuple[str, str, str]], comm_s: Sequence[float],
                  groups: Sequence[str] | None = None, compress_s: Sequence[float] | None = None,
                  decode_s: dict[tuple[str, str], float] | None = None) -> list[Item]:
    """``order``: the non-root units in forward order; ``forward_s``/``backward_s``: each unit's compute (the
    root's under ROOT); ``collectives``: (op, unit, phase) of each collective in issue order with its seconds
    (``comm_s``), group (default: all ``world``) and the compression on the compute stream before it (quantising
    a reduce-scatter's gradients: after its unit's backward); ``decode_s``: per (phase, unit), work on the compute
    stream between its all-gather and its compute (decoding quantised weights)."""
    tasks = [("forward", ROOT), *(("forward", u) for u in order), *(("backward", u) for u in reversed(order)),
             ("backward", ROOT)]
    index = {t: i for i, t in enumerate(tasks)}
    items: list[Item] = []
    at: list[int] = []                     # each task's item, once placed
    gathered: dict[tuple[str, str], int] = {}  # (phase, unit) → its all-gather's item
    last_of_unit: dict[str, int] = {}      # a unit's last gradient collective: the next one follows it

    def place_until(i: int) -> None:
        while len(at) <= i:
            phase, unit = tasks[len(at)]
            wait = gathered.get((phase, unit))
            after = () if wait is None else ((wait, "end"),)
            if decode_s and decode_s.get((phase, unit)):
                items.append(Item("compress", decode_s[(phase, unit)], after=after))
            seconds = (forward_s if phase == "forward" else backward_s).get(unit, 0.0)
            items.append(Item("compute", seconds, after=after))
            at.append(len(items) - 1)

    groups = groups if groups is not None else ["world"] * len(collectives)
    compress = compress_s if compress_s is not None else [0.0] * len(collectives)
    for (op, unit, phase), seconds, group, comp in zip(collectives, comm_s, groups, compress, strict=True):
        after: list[tuple[int, str]] = []
        if op == "allgather":
            i = index[(phase, unit)]
            if phase == "backward" and unit == ROOT:  # gathered first in backward, computed last
                place_until(len(order))
                after.append((at[len(order)], "end"))
            elif i > 0:
                place_until(i - 1)
                first_backward = phase == "backward" and tasks[i - 1][0] == "forward"
                after.append((at[i - 1], "end" if first_backward else "start"))
        else:
            place_until(index[("backward", unit)])
            after.append((at[index[("backward", unit)]], "end"))
            if unit in last_of_unit:
                after.append((last_of_unit[unit], "end"))
            if comp:
                items.append(Item("compress", comp, after=tuple(after)))
                after.append((len(items) - 1, "end"))
        items.append(Item("comm", seconds, link_lanes(group), tuple(after)))
        if op == "allgather":
            gathered[(phase, unit)] = len(items) - 1
        else:
            last_of_unit[unit] = len(items) - 1
    place_until(len(tasks) - 1)
    return items


def sharded_step(order: Sequence[str], forward_s: dict[str, float], backward_s: dict[str, float],
                 collectives: Sequence[tuple[str, str, str]], comm_s: Sequence[float],
                 groups: Sequence[str] | None = None, compress_s: Sequence[float] | None = None,
                 effects: StepEffects = NO_STEP_EFFECTS, after_s: float = 0.0,
                 decode_s: dict[tuple[str, str], float] | None = None) -> Timeline:
    """One sharded step on the timeline engine (see :func:`sharded_items`)."""
    return run(sharded_items(order, forward_s, backward_s, collectives, comm_s, groups, compress_s, decode_s), effects,
               after_s)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    quantize: str
    iteration_s: float
    compute_s: float           # one rank's forward + backward (+ after): what `arcsim device predict` gives
    comm_s: float
    exposed_comm_s: float
    cross_node_bytes_per_gpu: float
    collectives: int
    memory: Memory
    detail: list[dict] = field(default_factory=list)
    effects_s: float = 0.0     # what the cluster's effects add to compute: the slowest rank, interference
    compress_s: float = 0.0    # compression and ZeRO++'s quantisation kernels on the compute stream

    def to_dict(self, detail: bool = False) -> dict:
        out = {"strategy": self.strategy, "quantize": self.quantize, "iteration_s": self.iteration_s,
               "compute_s": self.compute_s, "effects_s": self.effects_s, "compress_s": self.compress_s,
               "comm_s": self.comm_s,
               "exposed_comm_s": self.exposed_comm_s, "cross_node_bytes_per_gpu": self.cross_node_bytes_per_gpu,
               "collectives": self.collectives, "memory": self.memory.to_dict()}
        if detail:
            out["schedule"] = self.detail
        return out


def unit_compute(ready_s: Sequence[tuple[str, float]], forward_s: float, backward_s: float,
                 units: dict[str, str]) -> tuple[dict[str, float], dict[str, float]]:
    """Each unit's forward and backward seconds from each parameter's (name, gradient-ready time): the backward
    stretch up to each gradient's ready time is the unit's of that gradient (what follows the last one, the last
    one's); forward in the same shares."""
    bwd: dict[str, float] = {}
    last, unit = 0.0, ROOT
    for name, ready in sorted(ready_s, key=lambda nr: nr[1]):
        unit = units.get(name, ROOT)
        bwd[unit] = bwd.get(unit, 0.0) + max(ready - last, 0.0)
        last = max(last, ready)
    bwd[unit] = bwd.get(unit, 0.0) + max(backward_s - last, 0.0)
    total = sum(bwd.values()) or 1.0
    fwd = {u: forward_s * s / total for u, s in bwd.items()}
    return fwd, bwd


# ZeRO++'s quantisation runs in fused CUDA kernels, each about a cast's memory traffic: priced as the measured passes
# of the rs-bf16 compressor (a cast to encode, a cast to decode, a read to sum; arcsim.devices.kernels), not as
# arcsim's own unfused torch quantisers (rs-int8, qgz: their counts when run as DDP compressors)
FUSED_QUANTISE = "rs-bf16"
QUANTISED = ("int8", "int4")


def quantisation_work(schedule: Sequence[ShardCollective], gpu: Device | None
                      ) -> tuple[list[float], dict[tuple[str, str], float]]:
    """ZeRO++'s kernels on ``gpu`` (None: not priced): the encoding before each quantised reduce-scatter (qgZ), and
    per (phase, unit) the decoding of its quantised weights (qwZ) before the unit computes."""
    before = [0.0] * len(schedule)
    decode: dict[tuple[str, str], float] = {}
    if gpu is None:
        return before, decode
    for i, c in enumerate(schedule):
        if c.dtype not in QUANTISED:
            continue
        seconds = compress_seconds(FUSED_QUANTISE, "tensor", c.numel, 1, gpu)
        if c.what == "grads":
            before[i] = seconds
        else:
            decode[(c.phase, c.unit)] = decode.get((c.phase, c.unit), 0.0) + seconds
    return before, decode


def sharded_result(strategy: str, quantize: Quantize, order: Sequence[str], fwd: dict[str, float],
                   bwd: dict[str, float], schedule: list[ShardCollective], pricer: Pricer,
                   memory: Memory, device_compute_s: float, after_s: float = 0.0,
                   comm_s: Sequence[float | None] | None = None, compress_s: Sequence[float] | None = None,
                   setting: str | None = None, gpu: Device | None = None) -> StrategyResult:
    """A sharded step on the timeline engine with the cluster's effects (the closed form adds each collective's
    expected jitter; the DES draws it); ``after_s``: the optimizer step, once every gradient is reduced.
    ``comm_s``: a collective's seconds where a compressor replaced it (None: priced as scheduled), ``compress_s``
    the compression before each; ``setting``: the row's name (default: the quantisation's); ``gpu``: where
    ZeRO++'s quantisation kernels are priced (:func:`quantisation_work`)."""
    topo = pricer.topo
    encode, decode = quantisation_work(schedule, gpu)
    compress_s = [a + b for a, b in zip(compress_s or [0.0] * len(schedule), encode, strict=True)]
    given = comm_s if comm_s is not None else [None] * len(schedule)
    seconds, algos = [], []
    for c, known in zip(schedule, given, strict=True):
        algo = "compressed"
        if known is None:
            priced = pricer.group(c.group).price(c.op, c.bytes_per_rank, tag=f"{c.unit} {c.phase}")
            jitter = effects.collective_jitter_s(c.op, c.group, topo) if pricer.engine == "analytic" else 0.0
            known, algo = priced.time_s + jitter, priced.algo
        seconds.append(known)
        algos.append(algo)
    tl = sharded_step(order, fwd, bwd, [(c.op, c.unit, c.phase) for c in schedule], seconds,
                      [c.group for c in schedule], compress_s, effects.step_effects(topo), after_s, decode)
    cross = sum(cross_node_bytes(c, topo.gpus_per_node, topo.nodes) for c in schedule)
    detail = [{**c.to_dict(), "algo": a, "time_s": t, "start_s": s, "end_s": e}
              for c, a, t, s, e in zip(schedule, algos, seconds, tl.comm_start, tl.comm_end, strict=True)]
    return StrategyResult(strategy, setting or quantize.label, tl.iteration_s, device_compute_s, tl.comm_s,
                          tl.exposed_comm_s, cross, len(schedule), memory, detail,
                          max(0.0, round(tl.compute_s - device_compute_s, 12)), tl.compress_s)


@dataclass(frozen=True)
class ShardedModel:
    """A model as the sharded strategies see it: FSDP2's units in forward order, the root, and each unit's forward
    and backward seconds (:func:`unit_compute`; the root's under ROOT)."""

    units: tuple[ShardUnit, ...]
    root: ShardUnit
    forward_s: dict[str, float]
    backward_s: dict[str, float]

    @property
    def order(self) -> list[str]:
        return [u.name for u in self.units]

    @property
    def params(self) -> int:
        return self.root.numel + sum(u.numel for u in self.units)


def sharded_model(shapes: Sequence[tuple[str, tuple[int, ...]]], ready_s: Sequence[tuple[str, float]],
                  forward_s: float, backward_s: float, wrap: str = "auto") -> ShardedModel:
    """``shapes`` (each parameter's name and shape, in forward order) wrapped as ``wrap`` says
    (:func:`arcsim.strategy.units.assign`), with the compute of one step: each gradient's (name, ready time)."""
    units, root = group_units(shapes, wrap)
    fwd, bwd = unit_compute(ready_s, forward_s, backward_s, assign(shapes, wrap))
    return ShardedModel(tuple(units), root, fwd, bwd)


class PricedPlan(NamedTuple):
    strategy: str              # full or hybrid
    quantize: Quantize
    reduce_dtype: str
    schedule: list[ShardCollective]
    result: StrategyResult


def price_plans(model: ShardedModel, plans: Iterable[tuple[str, Quantize, str]], pricer: Pricer,
                capacity_bytes: float, param_dtype: str, device_compute_s: float, after_s: float = 0.0,
                gpu: Device | None = None, activations_bytes: float = 0.0,
                reshard_after_forward: bool | int | None = None) -> list[PricedPlan]:
    """Each (strategy, quantisation, reduction dtype) of ``plans`` on ``pricer``'s topology: its memory per GPU (hpZ's
    copy only across nodes), FSDP2's schedule (parameters gathered in ``param_dtype``) and its step
    (:func:`sharded_result`), in the order given."""
    topo = pricer.topo
    units = list(model.units)
    out = []
    for strategy, q, dtype in plans:
        mem = memory_per_gpu(strategy, units, model.root, topo.ranks, topo.gpus_per_node, capacity_bytes, param_dtype,
                             dtype, activations_bytes, q.hpz and topo.nodes > 1)
        sched = fsdp_schedule(units, model.root, strategy, topo.ranks, topo.gpus_per_node, param_dtype, dtype,
                              reshard_after_forward, q)
        result = sharded_result(strategy, q, model.order, model.forward_s, model.backward_s, sched, pricer, mem,
                                device_compute_s, after_s, gpu=gpu)
        out.append(PricedPlan(strategy, q, dtype, sched, result))
    return out
