"""The `arcsim run` analysis: candidates, the switching policy, the AG/AR crossover and the ratio trade-off."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from arcsim.catalog import (
    AG_FAMILY,
    AR_TOPK_FAMILY,
    COMPRESSORS,
    DEFAULT_RATIOS,
    INFO,
    POLICIES,
    check_compression,
    check_options,
)
from arcsim.errors import ArcsimError
from arcsim.netsim import ENGINES
from arcsim.pricing import Pricer, algorithms_for
from arcsim.run import compress_cost
from arcsim.run.buckets import Bucket, make_buckets
from arcsim.run.compute import ComputeTimes, from_profile, from_trace
from arcsim.run.measure import Measurement, measure
from arcsim.run.pareto import choose, pareto_front
from arcsim.run.timeline import iteration
from arcsim.topology import Topology, load_topology
from arcsim.traces.format import Trace, open_trace
from arcsim.traces.resolve import resolve_trace

GRID_ALL_STEPS_ELEMENTS = 2e8  # steps × workers × elements above which the grid uses the first step only
CACHE_BYTES = 4 * 2**30  # traces up to this size (as stored) are read once and kept in memory
BANDWIDTH_SCALES = tuple(float(s) for s in np.logspace(-2, 2, 25))


class RunError(ArcsimError):
    """A bad `arcsim run` request."""


@dataclass
class RunConfig:
    topology: str = "8x8-ib100"
    trace: str | None = None
    compressors: tuple[str, ...] = COMPRESSORS
    density: float = 0.01
    memory: str | None = None           # None: ef14 for compressors, none for dense/fp16
    engine: str = "analytic"
    bucket_mb: float = 25.0
    policy: str = "auto"
    ratios: tuple[float, ...] = DEFAULT_RATIOS
    weights: tuple[float, float] | None = None
    compute_profile: str | None = None
    slack: float = 0.25                 # policy: error allowed above Top-K's, relative
    seed: int = 0
    allow_capture: bool = True
    grid_steps: int | None = None       # trace steps for ratio-grid points (None: all, or 1 for large traces)
    compress_scale: float = 1.0         # measured compression × this: > 1 where ranks share cores (emulation)
    options: dict[str, Any] = field(default_factory=lambda: {"scope": "tensor"})  # each compressor takes its own

    @property
    def scope(self) -> str:
        return str(self.options.get("scope", "tensor"))

    def check(self) -> None:
        check_compression(self.compressors, self.memory, RunError)
        check_options(self.compressors, self.options, RunError)
        if self.policy not in POLICIES:
            raise RunError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.engine not in ENGINES:
            raise RunError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        bad = [r for r in (self.density, *self.ratios) if not 0 < r <= 1]
        if bad or not self.ratios:
            raise RunError(f"ratios and --density must lie in (0, 1]; got {bad[0] if bad else 'an empty grid'}")
        if not self.bucket_mb > 0:
            raise RunError(f"--bucket-mb must be positive, got {self.bucket_mb}")
        if self.weights is not None and (len(self.weights) != 2 or min(self.weights) < 0 or sum(self.weights) <= 0):
            raise RunError("--weights takes two non-negative numbers TIME,ERROR, not both zero (e.g. 1,1)")
        if not self.compress_scale > 0:
            raise RunError(f"compress_scale must be positive, got {self.compress_scale}")
        if not self.slack >= 0:
            raise RunError(f"--slack must be ≥ 0, got {self.slack}")


@dataclass
class Candidate:
    compressor: str
    collective: str
    density: float | None
    memory: str
    op: str                    # the main data collective: allreduce or allgather
    iteration_s: float
    compute_s: float
    compress_s: float
    comm_s: float
    exposed_comm_s: float
    rel_error: float
    update_error: float
    compression_gain: float
    density_achieved: float
    bytes_per_rank: float
    speedup_vs_dense: float = 1.0
    density_by_step: list[float] = field(default_factory=list)  # achieved density at each trace step
    bucket_s: list[float] = field(default_factory=list)   # mean compress + comm per bucket

    def to_dict(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row.pop("bucket_s")
        return row


@dataclass
class Context:
    """What every candidate is priced against."""

    trace: Trace | None        # None when the gradients come from live training (arcsim train)
    topo: Topology
    compute: ComputeTimes
    buckets: list[Bucket]
    engine: str
    compress_source: str       # "measured" or "modelled"
    compress_scale: float = 1.0  # measured compression × this (ranks sharing cores in an emulated cluster)

    @property
    def trace_file(self) -> Trace:
        """The trace an `arcsim run` read (reports and charts describe it; live training has none)."""
        if self.trace is None:
            raise ArcsimError("this result came from live training, not a trace; it has no trace to describe")
        return self.trace


def main_op(meas: Measurement) -> str:
    """The collective that carries the data: the all-reduce or all-gather with the most bytes."""
    sizes = {"allreduce": 0, "allgather": 0}
    for recs in meas.records[0]:
        for r in recs:
            if r.op in sizes:
                sizes[r.op] += r.bytes_per_rank
    return max(sizes, key=sizes.__getitem__)


def step_timelines(meas: Measurement, collective: str, ctx: Context, pricer: Pricer) -> tuple[list, np.ndarray]:
    """Each step's iteration timeline with ``collective`` for the main op, and the per-bucket sums of
    compression + communication over the steps."""
    algos = {main_op(meas): collective}
    timelines, per_bucket = [], np.zeros(len(ctx.buckets))
    ready = [b.ready_s for b in ctx.buckets]
    for s, step_records in enumerate(meas.records):
        comm = [sum(p.time_s for p in pricer.records(recs, algos)) for recs in step_records]
        if ctx.compress_source == "measured":
            comp = [c * ctx.compress_scale for c in meas.compress_s[s]]
        else:
            comp = [compress_cost.modelled(meas.compressor, b.numel, len(recs), ctx.compute.device)
                    for b, recs in zip(ctx.buckets, step_records, strict=True)]
        timelines.append(iteration(ctx.compute.forward_s, ctx.compute.backward_s, ready, comp, comm))
        per_bucket += np.asarray(comp) + np.asarray(comm)
    return timelines, per_bucket


def evaluate(meas: Measurement, collective: str, ctx: Context, pricer: Pricer) -> Candidate:
    """Price one measured compressor with one collective algorithm for its main op, step by step."""
    op = main_op(meas)
    timelines, per_bucket = step_timelines(meas, collective, ctx, pricer)
    mean = {f: float(np.mean([getattr(t, f) for t in timelines]))
            for f in ("iteration_s", "compute_s", "compress_s", "comm_s", "exposed_comm_s")}
    uses_density = not INFO[meas.compressor].density_free
    return Candidate(meas.compressor, collective, meas.density if uses_density else None, meas.memory, op, **mean,
                     rel_error=meas.rel_error(), update_error=meas.update_error(),
                     compression_gain=meas.compression_gain(),
                     density_achieved=meas.density_achieved(),
                     bytes_per_rank=meas.bytes_per_rank(), density_by_step=meas.density_by_step(),
                     bucket_s=list(per_bucket / len(meas.records)))


def candidates_for(meas: Measurement, ctx: Context, pricer: Pricer) -> list[Candidate]:
    """One candidate per algorithm of the main collective — one only ("measured") when it was calibrated."""
    op = main_op(meas)
    algos = ("measured",) if op in ctx.topo.calibration else algorithms_for(op)
    return [evaluate(meas, algo, ctx, pricer) for algo in algos]


@dataclass
class RunResult:
    config: RunConfig
    ctx: Context
    candidates: list[Candidate]
    dense: Candidate
    policy: dict[str, Any] | None
    pareto: dict[str, Any]
    crossover: dict[str, Any]
    assumptions: list[str]
    timings: dict[str, float] = field(default_factory=dict)


class Analysis:
    """Measures compressors on the trace once per (compressor, density) and prices them on demand."""

    def __init__(self, cfg: RunConfig, progress: Callable[[str], None] | None = None,
                 announce: Callable[[str], None] = print,
                 capture_progress: Callable[[int, int], None] | None = None) -> None:
        cfg.check()
        self.cfg = cfg
        self.progress = progress or (lambda _: None)
        self.topo = load_topology(cfg.topology)
        path = resolve_trace(cfg.trace, allow_capture=cfg.allow_capture, announce=announce, progress=capture_progress)
        self.trace = open_trace(path)
        compute = from_profile(cfg.compute_profile, self.trace) if cfg.compute_profile else from_trace(self.trace)
        buckets = make_buckets(self.trace.layers, compute.ready_s.tolist(), cfg.bucket_mb * 2**20)
        source = "measured" if compute.device == "cpu" else "modelled"
        self.ctx = Context(self.trace, self.topo, compute, buckets, cfg.engine, source, cfg.compress_scale)
        self.pricer = Pricer(self.topo, cfg.engine)
        self._measured: dict[tuple[str, float, int], Measurement] = {}
        self._cached: list[tuple[int, torch.Tensor]] | None = None
        self.timings: dict[str, float] = {}

    def steps(self) -> Iterator[tuple[int, torch.Tensor]]:
        """The trace's steps as float32; held in memory (as stored) when they fit CACHE_BYTES, else streamed."""
        t = self.trace
        if t.steps * t.workers * t.elements * t.dtype.itemsize > CACHE_BYTES:
            yield from t.steps_iter()
            return
        if self._cached is None:
            self._cached = list(t.steps_iter(stored_dtype=True))
        for step, raw in self._cached:
            yield step, raw.float()

    def grid_steps(self) -> int:
        """Trace steps the ratio grid is measured on: all, unless the trace is large (then the first only)."""
        if self.cfg.grid_steps is not None:
            return max(1, min(self.cfg.grid_steps, self.trace.steps))
        t = self.trace
        return t.steps if t.steps * t.workers * t.elements <= GRID_ALL_STEPS_ELEMENTS else 1

    def _key(self, compressor: str, density: float, grid: bool) -> tuple[str, float, int]:
        uses = not INFO[compressor].density_free
        dens = density if uses else 1.0
        full = not grid or not uses or (dens == self.cfg.density and compressor in self.cfg.compressors)
        return compressor, dens, self.trace.steps if full else self.grid_steps()

    def measurement(self, compressor: str, density: float, grid: bool = False) -> Measurement:
        """The compressor measured on the trace (cached); grid points may use fewer steps (``grid_steps``)."""
        key = self._key(compressor, density, grid)
        if key not in self._measured:
            started = time.perf_counter()
            self.progress(f"{compressor} @ {key[1]:g}")
            steps = self.steps() if key[2] == self.trace.steps else itertools.islice(self.steps(), key[2])
            self._measured[key] = measure(steps, self.ctx.buckets, compressor, key[1],
                                          self.cfg.memory if not INFO[compressor].density_free else None,
                                          self.cfg.seed, self.cfg.options)
            self.timings[f"measure {compressor} @ {key[1]:g} ({key[2]} steps)"] = time.perf_counter() - started
        return self._measured[key]

    def planned_measurements(self) -> int:
        keys = {self._key(c, self.cfg.density, False) for c in self.cfg.compressors}
        keys |= {self._key(c, r, True) for c in self.cfg.compressors for r in self.cfg.ratios}
        keys.add(self._key("dense", 1.0, False))
        return len(keys)

    def run(self) -> RunResult:
        started = time.perf_counter()
        result = self._run()
        measured = sum(v for k, v in self.timings.items() if k.startswith("measure "))
        self.timings["pricing, policy, front and crossover"] = time.perf_counter() - started - measured
        result.timings = dict(self.timings)
        return result

    def _run(self) -> RunResult:
        cfg = self.cfg
        dense = evaluate(self.measurement("dense", 1.0), self._dense_algo(), self.ctx, self.pricer)
        cands = [c for name in cfg.compressors
                 for c in candidates_for(self.measurement(name, cfg.density), self.ctx, self.pricer)]
        for c in cands:
            c.speedup_vs_dense = dense.iteration_s / c.iteration_s
        dense.speedup_vs_dense = 1.0
        grid = self._grid(dense)
        policy = self._policy(cands) if cfg.policy == "auto" else None
        return RunResult(cfg, self.ctx, cands, dense, policy, self._pareto(grid), self._crossover(cands, grid),
                         self._assumptions())

    # -- the policy ------------------------------------------------------------------------------------
    def _eligible(self, cands: list[Candidate]) -> tuple[list[Candidate], float | None]:
        sparse = [c for c in cands if c.density is not None]
        ref = next((c.rel_error for c in sparse if c.compressor == "topk"), None)
        if ref is None and sparse:
            ref = min(c.rel_error for c in sparse)
        limit = None if ref is None else ref * (1 + self.cfg.slack) + 1e-12
        return [c for c in cands if c.density is None or (limit is not None and c.rel_error <= limit)], limit

    def _policy(self, cands: list[Candidate]) -> dict[str, Any]:
        eligible, limit = self._eligible(cands)
        choices, chosen = [], []
        for b in self.ctx.buckets:
            ranked = sorted(eligible, key=_time_in_bucket(b.index))
            best = ranked[0]
            chosen.append(best)
            choices.append({"bucket": b.index, "elements": b.numel, "layers": len(b.layers),
                            "compressor": best.compressor, "collective": best.collective,
                            "op": best.op, "time_s": best.bucket_s[b.index],
                            "runners_up": [{"compressor": c.compressor, "collective": c.collective, "op": c.op,
                                            "time_s": c.bucket_s[b.index]} for c in ranked[1:4]]})
        timeline = self._policy_timeline(chosen)
        err = sum(self.measurement(c.compressor, c.density or 1.0).err2_bucket(b.index)
                  for c, b in zip(chosen, self.ctx.buckets, strict=True))
        ref = sum(self.measurement(c.compressor, c.density or 1.0).ref2_bucket(b.index)
                  for c, b in zip(chosen, self.ctx.buckets, strict=True))
        return {"rule": f"per bucket, the fastest (compression + communication) among candidates whose relative "
                        f"aggregate error is at most Top-K's × (1 + {self.cfg.slack:g}) (dense and fp16 always "
                        f"qualify)", "error_limit": limit,
                "eligible": sorted({c.compressor for c in eligible}),
                "iteration_s": timeline.iteration_s, "exposed_comm_s": timeline.exposed_comm_s,
                "rel_error": err / ref if ref > 0 else 0.0, "choices": choices}

    def _policy_timeline(self, chosen: list[Candidate]):
        # per-bucket means of compression and communication for the chosen candidates
        comp, comm = [], []
        for c, b in zip(chosen, self.ctx.buckets, strict=True):
            meas = self.measurement(c.compressor, c.density or 1.0)
            algos = {c.op: c.collective}
            comm.append(float(np.mean([sum(p.time_s for p in self.pricer.records(step[b.index], algos))
                                       for step in meas.records])))
            comp.append(c.bucket_s[b.index] - comm[-1])
        ready = [b.ready_s for b in self.ctx.buckets]
        return iteration(self.ctx.compute.forward_s, self.ctx.compute.backward_s, ready, comp, comm)

    # -- the ratio trade-off -------------------------------------------------------------------------
    def _grid(self, dense: Candidate) -> list[Candidate]:
        points = [dense]
        for name in self.cfg.compressors:
            ratios = self.cfg.ratios if not INFO[name].density_free else (1.0,)
            for r in ratios:
                for c in candidates_for(self.measurement(name, r, grid=True), self.ctx, self.pricer):
                    c.speedup_vs_dense = dense.iteration_s / c.iteration_s
                    points.append(c)
        return points

    def _pareto(self, grid: list[Candidate]) -> dict[str, Any]:
        objectives = np.array([[c.iteration_s, c.rel_error] for c in grid])
        front = pareto_front(objectives)
        pick, rule = choose(objectives[front], self.cfg.weights)
        keys = ("compressor", "collective", "density", "iteration_s", "rel_error", "compression_gain",
                "speedup_vs_dense", "comm_s", "bytes_per_rank")

        def point(c: Candidate) -> dict[str, Any]:
            return {k: getattr(c, k) for k in keys}

        return {"objectives": ["iteration_s", "rel_error"], "rule": rule, "ratios": list(self.cfg.ratios),
                "evaluated": [point(c) for c in grid],
                "points": [point(grid[i]) for i in front], "chosen": point(grid[front[pick]])}

    # -- where All-Gather and All-Reduce trade places -------------------------------------------------
    def _crossover(self, cands: list[Candidate], grid: list[Candidate]) -> dict[str, Any]:
        ag = [n for n in self.cfg.compressors if n in AG_FAMILY]
        ar = [n for n in self.cfg.compressors if n in AR_TOPK_FAMILY]
        if not ag or not ar:
            return {"note": "needs an all-gather compressor (topk, gaussiank) and an all-reduce top-k variant "
                            "(arctopk, star, var) among --compressors"}
        base = self.topo.network.bandwidth_per_nic
        rows = []
        for s in BANDWIDTH_SCALES:
            topo = dataclasses.replace(
                self.topo, network=dataclasses.replace(self.topo.network, bandwidth_per_nic=base * s),
                calibration={op: dataclasses.replace(c, bandwidth=c.bandwidth * s)
                             for op, c in self.topo.calibration.items()})
            ctx = dataclasses.replace(self.ctx, topo=topo, engine="analytic")
            pricer = Pricer(topo, "analytic")
            best = {}
            for family, names in (("allgather", ag), ("allreduce", ar), ("dense", ["dense"])):
                options = [c for n in names for c in candidates_for(self.measurement(n, self.cfg.density), ctx,
                                                                        pricer)]
                if family == "dense":
                    options = [evaluate(self.measurement("dense", 1.0), self._dense_algo(), ctx, pricer)]
                fastest = min(options, key=lambda c: c.iteration_s)
                best[family] = (fastest.iteration_s, f"{fastest.compressor}/{fastest.collective}")
            rows.append({"nic_gbps": base * s * 8 / 1e9, "allgather_s": best["allgather"][0],
                         "allgather_best": best["allgather"][1], "allreduce_s": best["allreduce"][0],
                         "allreduce_best": best["allreduce"][1], "dense_s": best["dense"][0]})
        by_ratio = []
        for r in self.cfg.ratios:
            at = [c for c in grid if c.density == r]
            g = [c for c in at if c.compressor in ag]
            a = [c for c in at if c.compressor in ar]
            if g and a:
                fg, fa = min(g, key=lambda c: c.iteration_s), min(a, key=lambda c: c.iteration_s)
                by_ratio.append({"density": r, "allgather_s": fg.iteration_s,
                                 "allgather_best": f"{fg.compressor}/{fg.collective}", "allreduce_s": fa.iteration_s,
                                 "allreduce_best": f"{fa.compressor}/{fa.collective}"})
        return {"bandwidth": rows, "bandwidth_flips_gbps": _flips(rows, "nic_gbps"),
                "ratio": by_ratio, "ratio_flips": _flips(by_ratio, "density"),
                "density": self.cfg.density, "nic_gbps": base * 8 / 1e9,
                "note": "best all-gather top-k (topk, gaussiank) vs best all-reduce top-k (arctopk, star, var), "
                        "any collective; bandwidth curve by the closed form, inter-node NIC bandwidth scaled"}

    def _dense_algo(self) -> str:
        return "measured" if "allreduce" in self.topo.calibration else "ring"

    def _assumptions(self) -> list[str]:
        t, topo, ctx = self.trace, self.topo, self.ctx
        notes = [f"compute: {ctx.compute.source}",
                 f"compression time: {ctx.compress_source}"
                 + (" on this CPU: one rank's slice through the real compressor and memory"
                    if ctx.compress_source == "measured"
                    else " for the GPU from per-element pass counts (arcsim/run/compress_cost.py)"),
                 f"selection scope {self.cfg.scope}: "
                 + ("k = max(1, ⌊ρ·n⌋) in every layer of n elements (topk, randk, gaussiank, star, var; "
                    "arctopk: rows per layer), as the reference implementations"
                    if self.cfg.scope == "tensor" else "one k over each whole bucket") + " (--scope)",
                 f"{len(ctx.buckets)} bucket(s) of ≤ {self.cfg.bucket_mb:g} MiB fp32; collectives priced by the "
                 f"{self.cfg.engine} engine, one at a time in bucket order"
                 + (f"; measured fits for {', '.join(topo.calibration)} (arcsim calibrate) replace the step model"
                    if topo.calibration else "")]
        if topo.ranks != t.workers:
            notes.append(f"the topology has {topo.ranks} ranks, the trace {t.workers} workers: bytes are per rank "
                         f"(all-gather outputs scale with {topo.ranks} ranks), and fidelity is measured over the "
                         f"{t.workers} captured workers, each standing for {topo.ranks / t.workers:g} ranks at the "
                         f"captured batch of {t.meta['batch_per_worker']} (more ranks average more noise: the "
                         f"measured error is an upper estimate)")
        if self.grid_steps() < t.steps:
            notes.append(f"ratio-grid points other than --density were measured on the first {self.grid_steps()} "
                         f"of the trace's {t.steps} steps (large trace; --grid-steps to change)")
        if t.meta.get("synthetic_data"):
            notes.append("the trace's data is SYNTHETIC: its gradients have the model's structure, not real "
                         "training statistics")
        return notes


def _time_in_bucket(index: int) -> Callable[[Candidate], float]:
    return lambda c: c.bucket_s[index]


def _flips(rows: list[dict[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Where the faster of all-gather and all-reduce changes along ``axis`` (geometric interpolation)."""
    flips = []
    for a, b in itertools.pairwise(rows):
        da, db = a["allgather_s"] - a["allreduce_s"], b["allgather_s"] - b["allreduce_s"]
        if da == 0 or db == 0 or (da > 0) == (db > 0):
            continue
        f = da / (da - db)
        at = math.exp(math.log(a[axis]) + f * (math.log(b[axis]) - math.log(a[axis])))
        flips.append({axis: at, "below": "allgather" if da < 0 else "allreduce",
                      "above": "allreduce" if da < 0 else "allgather"})
    return flips
