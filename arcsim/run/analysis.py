"""The `arcsim run` analysis: measure each compressor on the trace (cached), price candidates
(run/candidates.py), decide (run/decisions.py: policy, Pareto front, crossover), state the assumptions."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.catalog import INFO, options_for
from arcsim.collectives.libraries import get_library
from arcsim.compressors.grouping import Grouping, group_workers
from arcsim.devices.catalog import PRECISIONS, Device
from arcsim.devices.kernels import kernel_source
from arcsim.devices.predict import DEFAULT_GPU_BATCH, ComputePrediction
from arcsim.errors import ArcsimError
from arcsim.files import cache_dir, generated_traces_dir
from arcsim.models.source import input_of_trace, source_of_trace
from arcsim.pricing import Pricer
from arcsim.processes import release_freed_memory, usable_cores
from arcsim.run import cache, decisions, doubt
from arcsim.run.candidates import Candidate, Context, candidates_for, evaluate
from arcsim.run.compute import ComputeTimes, from_profile, from_trace, mapped
from arcsim.run.config import RunConfig, RunError
from arcsim.run.kernel_check import KernelCheck, kernel_check
from arcsim.run.layer_sample import (
    BucketNorms,
    LayerSample,
    describe_layer_sample,
    needs_whole_norms,
    takes_layer_sample,
)
from arcsim.run.measurement import Measurement
from arcsim.run.sampling import MIN_SAMPLE_SAVING, BucketSample, describe, sample_threshold
from arcsim.strategy.buckets import Bucket
from arcsim.strategy.frameworks import Framework, get_framework
from arcsim.topology import Topology, load_topology
from arcsim.traces.estimates import LIVE_STATE_BYTES_PER_ELEMENT, Load, MeasuringWork
from arcsim.traces.format import GradientSource, Trace, open_trace
from arcsim.traces.resolve import resolve_trace
from arcsim.units import format_bits, format_duration

if TYPE_CHECKING:  # torch and what measures with it load only when something is measured: a cached run prices without
    import torch

    from arcsim.run.measure import GradientStats

MeasurementKey = tuple[str, float, int, "Grouping | None"]  # compressor, density, steps, node grouping (None: flat)
TraceStep = tuple[int, "torch.Tensor"]  # a trace's step: its training step, and every worker's gradient [W, d]
GRID_ALL_STEPS_ELEMENTS = 2e8  # steps × workers × elements above which the grid uses the first step only
CACHE_BYTES = 4 * 2**30  # traces up to this size (as stored) are read once and kept in memory
PARALLEL_PROCESSES = 2  # measure_ahead: processes at most (the machines this was measured on have 2 cores)
PARALLEL_MIN_MEASUREMENTS = 4  # … and only from this many measurements to run (a fork costs ~0.1 s)
MEASURING_WALL = "measuring, wall"  # timings: the wall time of all measuring (below the sum where side by side)
MEASURING_ESTIMATE = "measuring, estimated"  # timings: what the estimate said measuring would take (measuring_work)
MEASURED_AHEAD = "measured side by side (runs)"  # timings: how many measure_ahead ran, and on how many processes
MEASURED_AHEAD_PROCESSES = "measured side by side (processes)"
LIVE_MEMORY_BYTES = 4 * 2**30  # live training: the compressors measured in one pass hold about this much state


def measure_processes() -> int:
    """Processes measure_ahead may use: $ARCSIM_MEASURE_PROCESSES (1: none side by side), else PARALLEL_PROCESSES."""
    try:
        return int(os.environ.get("ARCSIM_MEASURE_PROCESSES", PARALLEL_PROCESSES))
    except ValueError:
        return PARALLEL_PROCESSES


_AHEAD: Analysis | None = None  # the analysis measure_ahead's forked processes measure for


def cuda_name() -> str:
    """The GPU torch measures on (torch loaded here: only a run that measures on a GPU asks)."""
    import torch

    return torch.cuda.get_device_name()


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _measure_ahead_key(key: MeasurementKey) -> tuple[Measurement, float]:
    assert _AHEAD is not None, "measure_ahead's processes are forked from the analysis they measure for"
    _AHEAD.detail = lambda _: None  # the parent's bar is the parent's to draw
    started = time.perf_counter()
    meas = _AHEAD._measure_key(key)
    return meas, time.perf_counter() - started


@dataclass
class RunResult:
    config: RunConfig
    ctx: Context
    candidates: list[Candidate]
    dense: Candidate
    policy: decisions.Policy | None
    pareto: decisions.ParetoFront
    crossover: decisions.Crossover
    recommendation: decisions.Recommendation
    assumptions: list[str]
    timings: dict[str, float] = field(default_factory=dict)
    compute_basis: dict[str, Any] | None = None  # a modelled compute's batch and precision, and whence each
    speedup_errors: dict[str, Any] | None = None  # the errors the speed-up intervals come from (run/doubt.py)
    strategies: list[Any] = field(default_factory=list)  # --sharding: run.strategies.StrategyRow, side by side
    kernel_check: KernelCheck | None = None  # compression timed on a GPU beside the kernel model (run/kernel_check.py)


def _set_speedups(c: Candidate, dense: Candidate, ring: Candidate) -> None:
    """Speed-up against dense on its fastest collective, and against dense over a flat ring (an extra)."""
    c.speedup_vs_dense = dense.iteration_s / c.iteration_s
    c.speedup_vs_dense_ring = ring.iteration_s / c.iteration_s


def density_notes(cands: list[Candidate], tolerance: float = 0.2) -> list[str]:
    """One line per compressor whose achieved density is off the requested one by more than ``tolerance``."""
    notes, seen = [], set()
    for c in cands:
        if c.density is None or c.compressor in seen or abs(c.density_achieved / c.density - 1) <= tolerance:
            continue
        seen.add(c.compressor)
        why = {"arctopk": "whole rows, at least one per layer", "gaussiank": "a threshold, not an exact k",
               "adaptive": "k varies per step around the budget"}.get(c.compressor, "at least one element per layer")
        notes.append(f"{c.compressor} reached density {c.density_achieved:.3g} where {c.density:g} was asked "
                     f"({why}); its bytes and error are at what it reached")
    return notes


def compute_basis(cfg: RunConfig, meta: dict[str, Any], gpu: Device) -> dict[str, Any]:
    """The batch per GPU and the precision ``gpu``'s compute is modelled at, and whence each: as asked, else the
    trace's own (a recorded job's batch — a capture's is the one it ran on the CPU —, and the precision it
    trained in, where ``gpu`` has it), else DEFAULT_GPU_BATCH and fp32."""
    trace_batch, trace_precision = int(meta.get("batch_per_worker") or 0), meta.get("precision")
    if cfg.batch:
        batch, batch_from = cfg.batch, "--batch"
    elif trace_batch and meta.get("device") == "recorded":
        batch, batch_from = trace_batch, "the recorded job's"
    else:
        batch, batch_from = DEFAULT_GPU_BATCH, (f"the default; a capture's batch ({trace_batch}) is not the training's"
                                                if trace_batch else "the default; the trace records none")
    if cfg.precision is not None:
        precision, precision_from = cfg.precision, "--precision"
    elif trace_precision in gpu.peak_tflops and trace_precision in PRECISIONS:
        precision, precision_from = trace_precision, "the trace's"
    else:
        precision, precision_from = "fp32", ("the default: the trace records none" if trace_precision is None else
                                             f"the trace's {trace_precision} is not modelled on {gpu.name}")
    return {"batch": batch, "batch_from": batch_from, "precision": precision, "precision_from": precision_from,
            "text": f"batch {batch} per GPU ({batch_from}), {precision} ({precision_from})"}


class Analysis:
    """Measures compressors on the trace once per (compressor, density) and prices them on demand."""

    def __init__(self, cfg: RunConfig, progress: Callable[[str], None] | None = None,
                 announce: Callable[[str], None] = print,
                 capture_progress: Callable[[int, int], None] | None = None,
                 source: GradientSource | None = None) -> None:
        """``source``: the gradients of an earlier Analysis of the same trace or live training (not re-read)."""
        cfg.check()
        self.cfg = cfg
        self.progress = progress or (lambda _: None)
        self.detail: Callable[[str], None] = lambda _: None  # where a measurement is, step by step (the bar's note)
        self.announce = announce
        self.compute_basis: dict[str, Any] | None = None  # a modelled compute's batch and precision, and whence
        self.topo = load_topology(cfg.topology).with_overrides(cfg.bandwidth, cfg.latency, cfg.library)
        changed = [f"{format_bits(cfg.bandwidth)} per NIC" if cfg.bandwidth else "",
                   f"{format_duration(cfg.latency)} latency" if cfg.latency is not None else ""]
        if any(changed):  # titles, tables and JSON name the network priced, not the preset's
            name = f"{self.topo.name} at {', '.join(c for c in changed if c)}"
            self.topo = dataclasses.replace(self.topo, name=name)
        self.params = cfg.params_model()
        self.trace: GradientSource
        if source is not None:
            self.trace = source
        elif cfg.live is not None:
            from arcsim.traces.live import LiveSource  # (torch: live training)

            self.trace = LiveSource(cfg.live, capture_progress)
        else:
            path = (self.params.sample_trace(generated_traces_dir(), cfg.seed) if self.params is not None else
                    resolve_trace(cfg.trace, allow_capture=cfg.allow_capture, announce=announce, force=cfg.force,
                                  progress=capture_progress))
            self.trace = open_trace(path, check_later=True)  # (its checksum read beside the model's count)
        # the trace file's content identity, for the measurement cache
        self._hash = cache.trace_hash(self.trace.path) if isinstance(self.trace, Trace) else None
        self.notes_before: list[str] = []
        self.measuring_load = Load(0.0, usable_cores())  # what measuring_work saw (quiet until it looks)
        self._predict: Callable[[int], ComputePrediction] | None = None  # compute modelled at a batch per GPU
        self.gpu, self.compute_prediction = self._device()
        scale = 1.0 if self.params is None else self.params.scale
        if self.params is not None:
            compute = ComputeTimes(0.0, 0.0, np.zeros(len(self.trace.layers)), "none",
                                   "none: communication and compression only (--params has no compute model)")
        elif cfg.compute_profile:
            compute = from_profile(cfg.compute_profile, self.trace)
        elif self.compute_prediction is not None:
            compute = self._compute_of(self.compute_prediction)
        else:
            compute = from_trace(self.trace)
        buckets = self._buckets(compute)
        self.ctx = Context(self.trace, self.topo, compute, buckets, cfg.engine, cfg.compress_scale, self.gpu,
                           cfg.scope, numel_scale=scale, framework=cfg.framework)
        self.pricer = Pricer(self.topo, cfg.engine)
        self.grouping: Grouping | None = None
        if "node" in cfg.hierarchies:
            self.grouping = self.grouping_for(self.topo)
        self._measured: dict[MeasurementKey, Measurement] = {}
        self.cached = 0  # measurements read from the cache instead of run
        self._cached: list[tuple[int, torch.Tensor]] | None = None
        self._finite_checked: set[int] = set()  # a streamed trace's steps read whole once for NaN/Inf (sampled)
        self._layer_sample: LayerSample | None = None  # planned when first asked (_layer_sample_planned)
        self._layer_sample_planned = False
        self._sample_steps: list[tuple[int, torch.Tensor]] | None = None  # the layer sample's columns of every step
        self._whole_norms: dict[int, torch.Tensor] | None = None  # … and each worker's norm of each whole bucket
        self._works: dict[tuple[str, float], tuple[Any, ...] | None] = {}  # what a compressor does at a density
        self.timings: dict[str, float] = {}
        self._measuring_wall = 0.0  # seconds of wall time spent measuring (side by side: the wall, not the sum)
        if isinstance(self.trace, Trace):  # read beside the count above; before anything is measured or read from
            self.trace.check_intact()      # the cache, and before measuring_work watches the cores' load

    @property
    def live(self) -> bool:
        """Whether the gradients come from live training (arcsim.traces.live), not a trace file."""
        return bool(self.trace.meta.get("live"))

    @functools.cached_property
    def gradient_stats(self) -> GradientStats:
        """What the trace's measurements share of its gradients (made when the first one is measured)."""
        from arcsim.run.measure import GradientStats

        return GradientStats((self.cfg.density, *self.cfg.ratios))

    @functools.cached_property
    def sample_stats(self) -> GradientStats:
        """… and those of its layer sample."""
        from arcsim.run.measure import GradientStats

        return GradientStats((self.cfg.density, *self.cfg.ratios))

    def _compute_of(self, pred: ComputePrediction) -> ComputeTimes:
        """A compute prediction as this trace's layers see it."""
        return mapped(pred.profile, self.trace, f"for {pred.device.name}",
                      f"{pred.source} on {pred.device.full_name}, batch {pred.profile.batch} per GPU, "
                      f"{pred.precision} ({pred.detail})")

    def _buckets(self, compute: ComputeTimes) -> list[Bucket]:
        """The trace's layers grouped as the framework sends them, with ``compute``'s ready times."""
        cfg, scale = self.cfg, 1.0 if self.params is None else self.params.scale
        fw = self._framework()
        # a sample's cap: scaled down as the sample is
        if cfg.fusion == "model":
            return fw.buckets(self.trace.layers, compute.ready_s.tolist(), float("inf"), backward_s=compute.backward_s)
        first = fw.first_cap(cfg.bucket_mb)
        return fw.buckets(self.trace.layers, compute.ready_s.tolist(), fw.cap_mb(cfg.bucket_mb) * 2**20 / scale,
                          None if first is None else first / scale, compute.backward_s)

    def context_at_batch(self, batch: int) -> Context | None:
        """This run's context with compute modelled at ``batch`` per GPU; None where compute is not modelled here or
        the buckets would change with it (Horovod fuses what is ready in one cycle): the measurements are theirs."""
        if self._predict is None:
            return None
        compute = self._compute_of(self._predict(batch))
        buckets = self._buckets(compute)
        if [b.layers for b in buckets] != [b.layers for b in self.ctx.buckets]:
            return None
        return dataclasses.replace(self.ctx, compute=compute, buckets=buckets)

    def share_measurements(self, other: Analysis) -> None:
        """Reuse ``other``'s compressor runs (same trace and settings, another GPU or topology): bytes and
        errors do not depend on the device; CPU-timed compression is used only where nothing is modelled."""
        same = other.trace is self.trace or (isinstance(other.trace, Trace) and isinstance(self.trace, Trace)
                                             and other.trace.path == self.trace.path)
        if not same or (other.cfg.memory, other.cfg.seed, other.cfg.options, other.cfg.exact) != \
                (self.cfg.memory, self.cfg.seed, self.cfg.options, self.cfg.exact):
            raise RunError("measurements are shared only between runs of the same trace and compressor settings")
        if self.timed and (not other.timed or other.cfg.measure_device != self.cfg.measure_device):
            return  # the other run modelled compression and timed nothing here: measure again, timed
        self._measured = other._measured

    def _device(self) -> tuple[Device | None, ComputePrediction | None]:
        """The GPU this run prices compute and compression on (--gpu, else the topology's; a compute profile
        from a catalogue GPU names its own), and its compute prediction; (None, None): all measured here."""
        from arcsim.devices.predict import predict_compute

        where = self.cfg.compute_source(self.topo)
        if where.kind != "modelled" or where.gpu is None:
            return where.gpu, None
        name = where.gpu.name
        meta = self.trace.meta
        source = source_of_trace(meta)
        if source is None:
            raise RunError(f"the trace's model {meta['model']!r} cannot be rebuilt here (it is not in the zoo and "
                           f"the trace does not say how to build it), so its compute on {name} cannot be modelled: "
                           "give --compute-profile (arcsim trace profile on that GPU), or --gpu cpu for the "
                           "capture's own timings")
        dataset, size, data = input_of_trace(meta)
        if dataset is None and data is None and source.entry is None:
            raise RunError(f"the trace does not say what its model {meta['model']!r} was fed, so its compute on "
                           f"{name} cannot be modelled: record the job again with this arcsim's recording hook "
                           "(it keeps the input's shapes), or give --compute-profile, or --gpu cpu for the "
                           "recording's own timings")
        self.compute_basis = compute_basis(self.cfg, meta, where.gpu)
        self.announce(f"compute on {name}: {self.compute_basis['text']}")
        self._predict = functools.partial(predict_compute, source, name, precision=self.compute_basis["precision"],
                                          dataset=dataset, input_size=size, data=data)
        return where.gpu, self._predict(self.compute_basis["batch"])

    def steps(self) -> Iterator[tuple[int, torch.Tensor]]:
        """The trace's steps as stored (a half-precision trace is converted a bucket at a time by the
        measurement, not a whole step): held in memory when they fit CACHE_BYTES, else streamed."""
        t = self.trace
        if not isinstance(t, Trace):
            yield from t.steps_iter()
            return
        where = self.cfg.measure_device
        if self.streamed():
            yield from t.steps_iter(stored_dtype=True, device=where)
            return
        if self._cached is None:
            self._cached = list(t.steps_iter(stored_dtype=True, device=where))
        yield from self._cached

    def streamed(self) -> bool:
        """Whether the trace is too large to keep (CACHE_BYTES as stored): read again by every measurement."""
        t = self.trace
        return isinstance(t, Trace) and t.steps * t.step_bytes() > CACHE_BYTES

    def grid_steps(self) -> int:
        """Trace steps the ratio grid is measured on: all, unless the trace is large (then the first only)."""
        if self.cfg.grid_steps is not None:
            return max(1, min(self.cfg.grid_steps, self.trace.steps))
        t = self.trace
        return t.steps if t.steps * t.workers * t.elements <= GRID_ALL_STEPS_ELEMENTS else 1

    def grouping_for(self, topo: Topology) -> Grouping:
        """How the trace's workers stand for ``topo``'s nodes, for node-aware compression (refused before any
        work where the topology or the trace cannot have it)."""
        if topo.nodes < 2:
            raise RunError(f"node-aware compression compresses between nodes, and {topo.name} has one node; "
                           "use --hierarchy flat or a topology with two or more nodes")
        try:
            return group_workers(self.trace.workers, topo.gpus_per_node)
        except ArcsimError as exc:
            raise RunError(f"--hierarchy {self.cfg.hierarchy}: {exc}") from None

    def _key(self, compressor: str, density: float, grid: bool, grouping: Grouping | None = None
             ) -> MeasurementKey:
        uses = not INFO[compressor].density_free
        dens = density if uses else 1.0
        full = not grid or not uses or (dens == self.cfg.density and compressor in self.cfg.compressors)
        return compressor, dens, self.trace.steps if full else self.grid_steps(), grouping

    def measurement(self, compressor: str, density: float, grid: bool = False, hierarchy: str = "flat",
                    topo: Topology | None = None) -> Measurement:
        """The compressor measured on the trace (kept in memory, and on disk by arcsim.run.cache); grid points
        may use fewer steps (``grid_steps``). Live training measures several in one pass (``_measure_live``).
        ``hierarchy``: flat, or node-aware with the workers grouped for ``topo``'s nodes (default the run's)."""
        grouping = None if hierarchy == "flat" else self.grouping_for(topo or self.topo)
        key = self._key(compressor, density, grid, grouping)
        if key in self._measured:
            return self._measured[key]
        if self.live:
            self._measure_live(key)
            return self._measured[key]
        self.progress(f"{compressor} @ {key[1]:g}")
        started = time.perf_counter()
        name = self._cache_name(key)
        meas = cache.load(name)
        twin = None if meas is not None else self._twin(key)
        if meas is not None:
            self.cached += 1
        elif twin is not None:  # the same work as a planned measurement: its copy, at this density
            done = self.measurement(twin[0], twin[1], grid=twin[2] != self.trace.steps)  # (timed as its own)
            self.progress(f"{compressor} @ {key[1]:g}")
            started = time.perf_counter()
            meas = dataclasses.replace(done, density=key[1])
            cache.save(name, meas)
        elif self.streamed() and self.layer_sample_for(key) is None:
            self._measure_streamed(key)
            return self._measured[key]
        else:
            meas = self._measure_key(key)
            cache.save(name, meas)
        seconds = time.perf_counter() - started
        self._keep(key, meas, seconds)
        self._measuring_wall += seconds
        return meas

    def _measure_key(self, key: MeasurementKey) -> Measurement:
        """``key`` measured on the trace here (neither read from the cache nor kept there)."""
        from arcsim.run.measure import measure

        compressor, density, count, grouping = key
        layers = self.layer_sample_for(key)
        every = self.steps() if layers is None else iter(self.sample_steps())
        steps = every if count == self.trace.steps else itertools.islice(every, count)
        steps = self._told(steps, f"{compressor} @ {density:g}", count)
        return measure(steps, self.ctx.buckets, compressor, density, self._memory(compressor), self.cfg.seed,
                       self.cfg.options, timed=self.timed, count=count,
                       stats=self.gradient_stats if layers is None else self.sample_stats, grouping=grouping,
                       sample=self.sample_for(key), layer_sample=layers,
                       whole_norms=self.whole_norms() if self._needs_whole_norms(key) else None)

    def _twin(self, key: MeasurementKey) -> MeasurementKey | None:
        """The first planned measurement before ``key`` that does the very same work — a compressor whose setting at
        the two densities is the same in every bucket (Compressor.plan_key: PowerSGD's ranks, which round to 1 on
        LLaMA-60M's matrices at every density ≤ 0.003) — measured once and copied (None: ``key`` is measured). Flat,
        of a trace or live training, not --params (whose records are scaled as they are kept)."""
        compressor, density, steps, grouping = key
        if grouping is not None or self.params is not None or INFO[compressor].density_free:
            return None
        work = self._work_of(compressor, density)
        if work is None:
            return None
        for k in self.planned_keys():
            if k == key:
                return None
            if (k[0], k[2], k[3]) == (compressor, steps, None) and self._work_of(compressor, k[1]) == work:
                return k
        return None

    def _work_of(self, compressor: str, density: float) -> tuple[Any, ...] | None:
        """What ``compressor`` does at ``density`` in each bucket (None where it does not say: always measured)."""
        if (compressor, density) not in self._works:
            from arcsim.compressors.registry import make_compressor

            comp = make_compressor(compressor, density, seed=self.cfg.seed,
                                   **options_for(compressor, self.cfg.options))
            plans = [comp.plan_key(b.layout(), density) for b in self.ctx.buckets]
            self._works[(compressor, density)] = None if any(p is None for p in plans) else tuple(plans)
        return self._works[(compressor, density)]

    def sample_steps(self, with_norms: bool = False) -> list[tuple[int, torch.Tensor]]:
        """Every step's columns of the layer sample (gathered once, kept): gathered from the file read in chunks
        where the trace is too large to keep (each chunk checked for NaN or Inf as it is read). The whole buckets'
        norms (:meth:`whole_norms`) are found in the same read where a planned run needs them, or ``with_norms``."""
        if self._sample_steps is None or (with_norms and self._whole_norms is None):
            sample, t = self.layer_sample(), self.trace
            assert sample is not None and isinstance(t, Trace)
            norms = [BucketNorms(sample, t.workers) for _ in range(t.steps)] \
                if with_norms or any(self._needs_whole_norms(k) for k in self.planned_keys()) else None
            if self.streamed() and t.random_access and self.cfg.measure_device == "cpu":
                self._sample_steps = [(t.recorded_steps[i], sample.gather(t.step_chunks(i), t.workers,
                                                                          None if norms is None else norms[i]))
                                      for i in range(t.steps)]  # (each chunk checked finite as it is read)
                self._finite_checked.update(range(t.steps))
            else:
                self._sample_steps = []
                for i, (step, g) in enumerate(self.steps()):
                    self._sample_steps.append((step, g.index_select(1, sample.index.to(g.device))))
                    if norms is not None:
                        norms[i].add(0, g)
            if norms is not None:
                self._whole_norms = {step: n.norms() for (step, _), n in zip(self._sample_steps, norms, strict=True)}
        return self._sample_steps

    def _needs_whole_norms(self, key: MeasurementKey) -> bool:
        """Whether ``key`` is measured on the layer sample by a compressor that scales by the whole bucket's norm."""
        return self.layer_sample_for(key) is not None and needs_whole_norms(key[0],
                                                                            options_for(key[0], self.cfg.options))

    def whole_norms(self) -> dict[int, torch.Tensor]:
        """By training step, each worker's norm of each whole bucket [buckets, workers] (found with the sample's
        columns: sample_steps), for the compressors measured on the sample that scale by it (needs_whole_norms)."""
        self.sample_steps(with_norms=True)
        assert self._whole_norms is not None
        return self._whole_norms

    def _measure_streamed(self, wanted: MeasurementKey) -> None:
        """A trace too large to keep: ``wanted`` and the other planned measurements of as many steps, in one
        read of the trace and bucket by bucket (what they share of a bucket found once, then dropped), as many
        as their error-feedback state fits LIVE_MEMORY_BYTES (all of them on a one-step pass: no state kept);
        not those measured on the column sample (sample_steps)."""
        from arcsim.run.measure import measure_many

        t = self.trace
        group = self._one_pass(wanted, t.workers * t.elements, stateless=wanted[2] == 1,
                               todo=lambda k: self.layer_sample_for(k) is None and not cache.held(self._cache_name(k))
                               and self._twin(k) is None)
        started = time.perf_counter()
        sample = self.sample_for(wanted)
        if isinstance(t, Trace) and t.random_access and self.cfg.measure_device == "cpu":
            # each bucket's columns read when measured: memory O(workers × bucket); the buckets a sample leaves out
            # are read once, in chunks, only to refuse a NaN or Inf there as a whole read would
            if sample is not None:
                for i in range(wanted[2]):
                    if i not in self._finite_checked:
                        for _ in t.step_chunks(i):  # (each chunk checked as it is read)
                            pass
                        self._finite_checked.add(i)
            steps: Iterable[Any] = ((t.recorded_steps[i], t.step_on_demand(i)) for i in range(wanted[2]))
        else:
            steps = self.steps() if wanted[2] == t.steps else itertools.islice(self.steps(), wanted[2])
        steps = self._told(steps, f"{len(group)} runs in one read", wanted[2])
        which = [(c, d, self._memory(c)) for c, d, _, _ in group]
        measured = measure_many(steps, self.ctx.buckets, which, self.cfg.seed, self.cfg.options,
                                timed=self.timed, count=wanted[2], stats=self.gradient_stats,
                                grouping=wanted[3], sample=sample, bucket_major=True)
        release_freed_memory()  # the step's blocks: the next read would add to a fragmented heap (processes.py)
        share = (time.perf_counter() - started) / len(group)
        for key, meas in zip(group, measured, strict=True):
            if key != wanted:  # (measurement() said the one it was asked for)
                self.progress(f"{key[0]} @ {key[1]:g}")
            cache.save(self._cache_name(key), meas)
            self._keep(key, meas, share)
        self._measuring_wall += share * len(group)

    def _told(self, steps: Iterable[TraceStep], label: str, count: int) -> Iterator[TraceStep]:
        """``steps``, telling ``detail`` which of ``count`` is being measured (a long measurement moves)."""
        for i, step in enumerate(steps, 1):
            self.detail(f"{label}, step {i}/{count}")
            yield step

    def layer_sample(self) -> LayerSample | None:
        """The sample of every layer a large trace's measurements are taken on (arcsim.run.layer_sample), planned
        once for the trace's whole work (workers × elements × steps); None: every element — with --exact, for live
        training, where compression is timed here (a sample's time is not the bucket's), for --params (already a
        sample of small layers), or where the trace is small."""
        if not self._layer_sample_planned:
            t = self.trace
            if isinstance(t, Trace) and not (self.cfg.exact or self.timed or self.params is not None):
                self._layer_sample = LayerSample.plan(self.ctx.buckets, t.workers * t.elements * t.steps,
                                                  sample_threshold(), self.cfg.seed)
            self._layer_sample_planned = True
        return self._layer_sample

    def layer_sample_for(self, key: MeasurementKey) -> LayerSample | None:
        """The sample ``key`` is measured on, if its compressor takes one (layer_sample.takes_layer_sample)."""
        taken = takes_layer_sample(key[0], options_for(key[0], self.cfg.options), node_aware=key[3] is not None)
        return self.layer_sample() if taken else None

    def sample_for(self, key: MeasurementKey) -> BucketSample | None:
        """The buckets ``key`` is measured on where it is large (workers × elements × steps above
        sample_threshold()) and a sample leaves at least MIN_SAMPLE_SAVING of its elements out; None: every bucket
        (also with --exact, for live training, and where a sample would save less: LLaMA-60M's 6 buckets, whose 3
        alike are all measured, MIN_PER_STRATUM)."""
        t = self.trace
        if self.cfg.exact or not isinstance(t, Trace) or t.workers * t.elements * key[2] <= sample_threshold() \
                or self.layer_sample_for(key) is not None:
            return None
        sample = BucketSample.plan(self.ctx.buckets)
        skipped = 1 - sum(self.ctx.buckets[b].numel for b in sample.measured) / t.elements
        return None if skipped < MIN_SAMPLE_SAVING else sample

    def _keep(self, key: MeasurementKey, meas: Measurement, seconds: float) -> None:
        """``meas`` kept in memory for ``key`` (a synthetic sample's records scaled to the full model), and the
        seconds it took among the timings."""
        compressor, density, count, grouping = key
        if self.params is not None:  # what the sample sent, at the full model's size
            meas.records = [[[self.params.scale_record(r) for r in recs] for recs in step]
                            for step in meas.records]
        self._measured[key] = meas
        self.timings[f"measure {compressor} @ {density:g}{'' if grouping is None else ' node-aware'} "
                     f"({count} steps)"] = seconds

    def _timing_device(self) -> str:
        """What a timed measurement's times depend on beyond the CPU: the GPU and the torch it ran under."""
        if self.cfg.measure_device == "cpu":
            return "cpu"
        import torch

        return f"{cuda_name()} (torch {torch.__version__})"

    @property
    def timed(self) -> bool:
        """Whether a trace's measurements time one rank's compression: where nothing models it, and on a GPU
        (--measure-device cuda: beside the kernel model's price, arcsim.run.kernel_check)."""
        return self.ctx.gpu is None or self.cfg.measure_device != "cpu"

    def measure_ahead(self, processes: int | None = None) -> int:
        """Run the planned measurements that are neither in memory nor in the cache now, spread over
        ``processes`` forked processes (default: measure_processes(), at most the cores this process may use),
        each on one intra-op thread; the run then finds them in memory. Only for a trace file whose compression is
        modelled (nothing is timed: timings taken side by side would share the cores), and only the
        measurements on one intra-op thread anyway — every one on the layer sample, and the whole trace's where its
        buckets are small (measuring_threads; large ones use torch's threads in one process and their
        error-feedback state is not doubled). Returns how many were measured so."""
        todo = self._parallel_todo(processes)
        if not todo:
            return 0
        workers = self._processes(len(todo), processes)
        started, done = time.perf_counter(), 0
        # what the children read, read here once and shared (copy-on-write): the sample's columns, the whole trace
        if any(self.layer_sample_for(k) is not None for k in todo):
            self.sample_steps()
        if any(self.layer_sample_for(k) is None for k in todo):
            for _ in self.steps():
                break
        global _AHEAD
        _AHEAD = self
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                     initializer=_one_thread) as pool:
                for key, (meas, seconds) in zip(todo, pool.map(_measure_ahead_key, todo), strict=True):
                    self.progress(f"{key[0]} @ {key[1]:g}")
                    cache.save(self._cache_name(key), meas)  # here, not in the children: one writer at a time
                    self._keep(key, meas, seconds)
                    done += 1
        except Exception:  # a measurement's own error, or the pool's: the run measures what is left one at a
            pass           # time as it asks, and a measurement's error is raised there, in its order
        finally:
            _AHEAD = None
        self._measuring_wall += time.perf_counter() - started
        if done:
            self.timings[MEASURED_AHEAD] = float(done)
            self.timings[MEASURED_AHEAD_PROCESSES] = float(workers)
        return done

    @staticmethod
    def _processes(measurements: int, processes: int | None = None) -> int:
        """The processes measure_ahead spreads ``measurements`` over (``processes`` at most, else measure_processes()),
        no more than the cores this process may use."""
        return max(1, min(measurements, processes or measure_processes(), usable_cores()))

    def _parallel_todo(self, processes: int | None, todo: list[MeasurementKey] | None = None) -> list[MeasurementKey]:
        """The measurements measure_ahead would spread over processes, of ``todo`` (default: _to_measure()); none
        where it would not."""
        if (processes or measure_processes()) < 2 or usable_cores() < 2 or self.timed \
                or not isinstance(self.trace, Trace) or "fork" not in multiprocessing.get_all_start_methods() \
                or multiprocessing.current_process().daemon:
            return []
        todo = self._to_measure() if todo is None else todo
        if len(todo) < PARALLEL_MIN_MEASUREMENTS:
            return []
        streamed = self.streamed()  # (a streamed trace's whole measurements are made in one read of it, here)
        todo = [k for k in todo if self._one_thread(k) and (self.layer_sample_for(k) is not None or not streamed)]
        return todo if len(todo) >= PARALLEL_MIN_MEASUREMENTS else []

    def _one_thread(self, key: MeasurementKey) -> bool:
        """Whether ``key`` is measured on one intra-op thread (arcsim.run.measure.measuring_threads)."""
        from arcsim.run.measure import measuring_threads  # (loads torch: only where there is something to measure)

        return measuring_threads(self.ctx.buckets, self.trace.workers, self.layer_sample_for(key) is not None) == 1

    def _to_measure(self) -> list[MeasurementKey]:
        """The planned measurements a run still has to make: neither in memory, nor in the cache, nor a twin's copy."""
        return [k for k in self.planned_keys() if k not in self._measured and not cache.held(self._cache_name(k))
                and self._twin(k) is None]

    def _cache_name(self, key: MeasurementKey) -> str:
        compressor, density, steps, grouping = key
        options = {"scope": self.cfg.scope, **options_for(compressor, self.cfg.options)}  # others' leave it as it was
        return cache.key(self._trace_hash(), self.ctx.buckets, compressor, density, self._memory(compressor),
                         self.cfg.seed, options, steps, self.timed, grouping,
                         self.sample_for(key), self._timing_device(), self.layer_sample_for(key))

    def measuring_work(self, load: Load | None = None) -> tuple[int, float]:
        """The planned measurements neither in memory nor in the cache, and the seconds they should take here with
        the machine as loaded as ``load`` (default: as it is now, watched only where there is something to measure;
        kept in ``measuring_load``; arcsim.traces.estimates); (0, 0) for live training, whose training was estimated
        before it started."""
        if not isinstance(self.trace, Trace):
            return 0, 0.0
        todo = self._to_measure()
        if not todo:
            return 0, 0.0
        ahead = set(self._parallel_todo(None, todo))
        one_thread = [k for k in todo if k not in ahead and self._one_thread(k)]
        threaded = [k for k in todo if k not in ahead and k not in one_thread]

        def read(keys: Iterable[MeasurementKey]) -> float:
            return float(sum(self.trace.workers * k[2] * self._measured_elements(k) for k in keys))

        work = MeasuringWork(threaded=read(threaded), one_thread=read(one_thread), side_by_side=read(ahead),
                             processes=self._processes(len(ahead)), measurements=len(todo),
                             trace_bytes=self._trace_bytes_read(todo, bool(ahead)), timed=self.timed)
        self.measuring_load = load or Load.now()
        seconds = work.seconds(self.measuring_load)
        self.timings[MEASURING_ESTIMATE] = seconds
        return len(todo), seconds

    def _trace_bytes_read(self, todo: list[MeasurementKey], gathered_first: bool) -> float:
        """The stored gradients' bytes measuring ``todo`` reads, walked in the order the run measures (the layer
        sample gathered first where measure_ahead runs: ``gathered_first``). A kept trace is loaded once (steps).
        A streamed one is read whole to gather the layer sample (sample_steps), and once per pass of whole
        measurements (_measure_streamed: as many as _one_pass fits): their buckets' columns alone where the trace
        has them apart (after the steps read whole once to check them finite, where the pass takes a bucket
        sample), else the pass's steps whole."""
        t = self.trace
        assert isinstance(t, Trace)
        step_bytes = t.step_bytes()
        if not self.streamed():
            return float(t.steps * step_bytes) if self._cached is None else 0.0
        apart = t.random_access and self.cfg.measure_device == "cpu"
        checked, gathered, read = set(self._finite_checked), self._sample_steps is not None, 0.0
        left = set(todo)
        for key in todo:
            if key not in left:
                continue
            sampled = self.layer_sample_for(key) is not None
            if not gathered and (gathered_first or sampled):
                read += t.steps * step_bytes
                gathered = True
                checked.update(range(t.steps) if apart else ())
            if sampled:
                left.discard(key)
                continue
            left.difference_update(self._one_pass(key, t.workers * t.elements, stateless=key[2] == 1,
                                                  todo=lambda k: k in left and self.layer_sample_for(k) is None))
            if not apart:
                read += key[2] * step_bytes
                continue
            if self.sample_for(key) is not None:
                unchecked = set(range(key[2])) - checked
                read += len(unchecked) * step_bytes
                checked |= unchecked
            read += key[2] * t.workers * self._measured_elements(key) * t.dtype.itemsize
        return read

    def _measured_elements(self, key: MeasurementKey) -> int:
        """The elements ``key`` compresses per worker and step: the trace's, or its sample's."""
        sample, layers = self.sample_for(key), self.layer_sample_for(key)
        if layers is not None:
            return layers.sampled
        return self.trace.elements if sample is None else sum(self.ctx.buckets[i].numel for i in sample.measured)

    def _memory(self, compressor: str) -> str | None:
        return self.cfg.memory if not INFO[compressor].density_free else None

    def _measure_live(self, wanted: MeasurementKey) -> None:
        """One pass of live training measures ``wanted`` and, alongside it, the other planned measurements of
        as many steps, as many as fit LIVE_MEMORY_BYTES (each keeps error-feedback state for every worker)."""
        from arcsim.run.measure import measure_many
        from arcsim.traces.live import LiveSource

        live = self.trace
        assert isinstance(live, LiveSource)
        group = self._one_pass(wanted, live.workers * live.elements)
        started = time.perf_counter()
        for compressor, density, _, _ in group:
            self.progress(f"{compressor} @ {density:g}")
        steps = itertools.islice(live.steps_iter(), wanted[2])
        which = [(c, d, self._memory(c)) for c, d, _, _ in group]
        for key, meas in zip(group, measure_many(steps, self.ctx.buckets, which, self.cfg.seed, self.cfg.options,
                                                 timed=self.ctx.gpu is None, count=wanted[2],
                                                 grouping=wanted[3]), strict=True):
            self._measured[key] = meas
        self.timings[f"measure live pass {live.passes}: {len(group)} compressor runs ({wanted[2]} steps)"] = \
            time.perf_counter() - started
        self._measuring_wall += time.perf_counter() - started

    def _one_pass(self, wanted: MeasurementKey, elements: int, stateless: bool = False,
                  todo: Callable[[MeasurementKey], bool] = lambda _: True) -> list[MeasurementKey]:
        """``wanted`` and the other planned measurements of as many steps (and the same grouping) not yet
        measured (and ``todo``), as many as their error-feedback state over ``elements`` (workers × elements)
        fits LIVE_MEMORY_BYTES; all of them where the pass keeps no state (``stateless``)."""
        others = [k for k in self.planned_keys() if k[2] == wanted[2] and k[3] == wanted[3] and k != wanted
                  and k not in self._measured and todo(k)]
        room = len(others) + 1 if stateless else max(1, int(LIVE_MEMORY_BYTES // (LIVE_STATE_BYTES_PER_ELEMENT
                                                                                  * elements)))
        return [wanted, *others][:room]

    def _trace_hash(self) -> str:
        assert self._hash is not None, "only a trace file is measured through the cache"
        return self._hash

    def planned_keys(self) -> list[MeasurementKey]:
        """Every measurement a run makes: dense, each compressor at --density, then the ratio grid (each way
        of --hierarchy)."""
        ways = [None if h == "flat" else self.grouping for h in self.cfg.hierarchies]
        keys = [self._key("dense", 1.0, False),
                *(self._key(c, self.cfg.density, False, h) for c in self.cfg.compressors for h in ways),
                *(self._key(c, r, True, h) for c in self.cfg.compressors for r in self.cfg.ratios for h in ways)]
        return list(dict.fromkeys(keys))

    def planned_measurements(self) -> int:
        return len(self.planned_keys())

    def run(self, lean: bool = False) -> RunResult:
        """The whole answer; ``lean``: without the crossover and the tips of too-close verdicts (the choices,
        times and intervals are the same), as a network schedule's phases need it."""
        started = time.perf_counter()
        result = self._run(lean)
        self.timings[MEASURING_WALL] = self._measuring_wall
        self.timings["pricing, policy, front and crossover"] = time.perf_counter() - started - self._measuring_wall
        result.timings = dict(self.timings)
        result.compute_basis = self.compute_basis
        return result

    def _run(self, lean: bool) -> RunResult:
        cfg = self.cfg
        self.measure_ahead()
        dense_meas = self.measurement("dense", 1.0)
        if not any(r > 0 for step in dense_meas.ref2 for r in step):
            raise RunError(f"every gradient in {self.trace.label} is zero, so no compressor's error can be "
                           "measured; capture the trace from a model that is training")
        # the baseline a user would run: dense fp32 on its fastest collective (the ring ratio stays as an extra)
        dense = min(candidates_for(dense_meas, self.ctx, self.pricer), key=lambda c: c.iteration_s)
        ring = evaluate(dense_meas, self._dense_algo(), self.ctx, self.pricer)
        cands = [c for name in cfg.compressors for h in cfg.hierarchies
                 for c in candidates_for(self.measurement(name, cfg.density, hierarchy=h), self.ctx, self.pricer)]
        for c in [*cands, dense]:
            _set_speedups(c, dense, ring)
        grid = self._grid(dense, ring)
        front = self._pareto(grid)
        policy, recommendation = self._policy(cands, grid)
        errors = self._errors()
        rec = self._judged(recommendation or decisions.recommend(front, grid, policy), errors, dense, cands, grid,
                           tips=not lean)
        rec.plan = self._plan(rec, policy)
        crossover = decisions.Crossover("not priced (a lean run)") if lean else self._crossover(cands, grid)
        return RunResult(cfg, self.ctx, cands, dense, policy, front, crossover, rec,
                         self._assumptions() + density_notes(cands) + [errors.basis],
                         speedup_errors=errors.to_dict(), kernel_check=self._kernel_check(cands))

    def _kernel_check(self, cands: list[Candidate]) -> KernelCheck | None:
        """Where compression was timed on a GPU (--measure-device cuda, --live --device cuda): beside the model."""
        on_gpu = self.cfg.measure_device == "cuda" or (self.cfg.live is not None and self.cfg.live.on_gpu)
        if not on_gpu:
            return None
        return kernel_check(cands, self.ctx, cuda_name(), self.trace.workers)

    # -- how sure the speed-ups are (arcsim/run/doubt.py) ---------------------------------------------------
    def _errors(self) -> doubt.Errors:
        pred = self.compute_prediction
        return doubt.errors_for(self.topo, self.cfg.framework, None if pred is None else pred.expected_error,
                                self.ctx.gpu)

    def _judged(self, rec: decisions.Recommendation, errors: doubt.Errors, dense: Candidate, cands: list[Candidate],
                grid: list[Candidate], tips: bool = True) -> decisions.Recommendation:
        """Every candidate's and the recommendation's speed-up interval, verdict and (``tips``) tips."""
        batch = self.compute_basis["batch"] if self.compute_basis else None
        judge = doubt.Judge(errors, self.ctx, self.pricer, dense, grid, batch, self.context_at_batch)
        for c in [*cands, dense]:
            judge.mark(c, tips)
        pick = next((c for c in [*cands, *grid] if (c.compressor, c.collective, c.hierarchy, c.density)
                     == (rec.compressor, rec.collective, rec.hierarchy, rec.density)), None)
        if pick is None:  # a per-bucket mix: no one candidate's interval is its
            return rec
        if pick.verdict is None:  # a grid point: judged here
            judge.mark(pick, tips)
        return rec.judged(pick)

    # -- decisions (arcsim/run/decisions.py, arcsim/run/policies.py) -----------------------------------
    def _policy(self, cands: list[Candidate], grid: list[Candidate]
                ) -> tuple[decisions.Policy | None, decisions.Recommendation | None]:
        """The switching policy --policy names, and the recommendation when the policy makes it (auto, paper)."""
        from arcsim.run import policies
        from arcsim.run.convergence import fit_steps_model

        model = fit_steps_model(self.cfg.dense_steps)
        if self.cfg.policy == "auto":
            pol, best = policies.by_time_to_target(grid, cands, self.ctx, model)
            if pol.deploy == "mix":  # grid[0]: dense on its fastest collective
                return pol, decisions.recommend_policy(pol, grid, grid[0])
            return pol, decisions.recommend_soonest(best, pol)
        if self.cfg.policy == "paper":
            pol = policies.paper(grid, self.ctx, self.cfg.seed, model)
            return pol, decisions.recommend_policy(pol, grid, grid[0])
        if self.cfg.policy == "gate":
            slack = decisions.GATE_SLACK if self.cfg.slack is None else self.cfg.slack
            return decisions.policy(cands, self.ctx, slack), None
        return None, None

    def _plan(self, rec: decisions.Recommendation, pol: decisions.Policy | None) -> dict[str, Any] | None:
        """``rec`` per DDP bucket, for arcsim.hooks.MixedState (None: Horovod's or a fused model's buffers)."""
        if self.cfg.framework != "ddp" or self.cfg.fusion != "bucket":
            return None
        return decisions.plan_for(rec, pol, self.ctx, self.cfg.memory, self.cfg.seed,
                                  self.cfg.options.get("scope", "tensor")).to_dict()

    def _grid(self, dense: Candidate, ring: Candidate) -> list[Candidate]:
        points = [dense]
        for name in self.cfg.compressors:
            ratios = self.cfg.ratios if not INFO[name].density_free else (1.0,)
            for r, h in itertools.product(ratios, self.cfg.hierarchies):
                for c in candidates_for(self.measurement(name, r, grid=True, hierarchy=h), self.ctx, self.pricer):
                    _set_speedups(c, dense, ring)
                    points.append(c)
        return points

    def _pareto(self, grid: list[Candidate]) -> decisions.ParetoFront:
        return decisions.pareto(grid, self.cfg.ratios, self.cfg.weights)

    def _crossover(self, cands: list[Candidate], grid: list[Candidate]) -> decisions.Crossover:
        cx = decisions.crossover(self.cfg.compressors, self.cfg.density, self.cfg.ratios, grid, self.ctx,
                                 self.measurement)
        if self.cfg.hierarchy != "both":
            return cx
        return decisions.with_hierarchy(cx, self.cfg.compressors, self.cfg.density, self.ctx, self.measurement)

    def _dense_algo(self) -> str:
        return "measured" if "allreduce" in self.topo.calibration else "ring"

    def _framework(self) -> Framework:
        """The framework --framework names, with --cycle-ms for Horovod."""
        return get_framework(self.cfg.framework, None if self.cfg.cycle_ms is None else self.cfg.cycle_ms * 1e-3)

    def _timed_on(self) -> str:
        """Where compression is timed when it is measured: the GPU of a live CUDA run or --measure-device cuda,
        else this CPU."""
        if self.cfg.live is not None and self.cfg.live.on_gpu:
            return f"{self.trace.meta['device_name']} (CUDA events)"
        return f"{cuda_name()} (CUDA events)" if self.cfg.measure_device == "cuda" else "this CPU"

    def _assumptions(self) -> list[str]:
        t, topo, ctx = self.trace, self.topo, self.ctx
        notes = [*self.notes_before, f"compute: {ctx.compute.source}",
                 f"compression time: {ctx.compress_source}"
                 + (f" on {self._timed_on()}: one rank's slice through the real compressor and memory"
                    if ctx.gpu is None else f" on {ctx.gpu.full_name}: memory passes and kernel launches per "
                                            f"compressor, {kernel_source(ctx.gpu)} (arcsim/devices/kernels.py)"),
                 f"selection scope {self.cfg.scope}: "
                 + ("k = max(1, ⌊ρ·n⌋) in every layer of n elements (topk, randk, gaussiank, star, var; "
                    "arctopk: rows per layer), as the reference implementations"
                    if self.cfg.scope == "tensor" else "one k over each whole bucket") + " (--scope)",
                 (self._framework().describe(len(ctx.buckets), self.cfg.bucket_cap_mb)
                  if self.cfg.fusion == "bucket" else "fusion model: the whole gradient compressed and sent as one "
                  "vector after backward (latency paid once, no overlap)")
                 + f"; collectives as {topo.library} runs them ({get_library(topo.library).summary}), priced by the "
                 f"{self.cfg.engine} engine, one at a time in bucket order"
                 + (f"; measured fits for {', '.join(topo.calibration)} (arcsim calibrate) replace the step model"
                    if topo.calibration else "")]
        src, done = ("live training", "trained") if t.meta.get("live") else ("the trace", "captured")
        if self.params is None and topo.ranks > t.workers:  # (a synthetic sample's note comes below)
            notes.append(f"the topology has {topo.ranks} ranks, {src} {t.workers} workers: bytes are per rank "
                         f"(all-gather outputs scale with {topo.ranks} ranks), and fidelity is measured over the "
                         f"{t.workers} {done} workers, each standing for {topo.ranks / t.workers:g} ranks at the "
                         f"{done} batch of {t.meta['batch_per_worker']} (more ranks average away more noise: "
                         f"the measured error is an upper estimate of the error on {topo.ranks} ranks)")
        elif self.params is None and topo.ranks < t.workers:
            notes.append(f"the topology has {topo.ranks} ranks, {src} {t.workers} workers: bytes are per rank, "
                         f"and fidelity is measured over all {t.workers} {done} workers at the {done} batch of "
                         f"{t.meta['batch_per_worker']} (fewer ranks average away less noise: the measured error is "
                         f"a lower estimate of the error on {topo.ranks} ranks)")
        if self.grouping is not None:
            g = self.grouping
            notes.append(f"node-aware (--hierarchy {self.cfg.hierarchy}): dense reduce-scatter inside each node of "
                         f"{topo.gpus_per_node} GPUs, each GPU compresses its 1/{topo.gpus_per_node} slice with its "
                         f"own error feedback and exchanges it with the same GPU of every node ({topo.nodes} ranks, "
                         f"one rail per GPU sharing the node's {topo.network.nics_per_node} NIC(s)), then an "
                         f"all-gather inside the node; fidelity measured with the {t.workers} {done} workers as "
                         f"{g.label()} (node means average {g.gpus} workers, not {topo.gpus_per_node}; slices of "
                         f"1/{g.gpus} scaled to 1/{topo.gpus_per_node} for bytes and time); B/rank counts bytes "
                         "between nodes only")
        if self.grid_steps() < t.steps:
            notes.append(f"ratio-grid points other than --density were measured on the first {self.grid_steps()} "
                         f"of the trace's {t.steps} steps (large trace; --grid-steps to change)")
        samples = {tuple(m.sample["measured"]) for m in self._measured.values() if m.sample is not None}
        if samples:
            sampled = max(samples, key=len)
            notes.append(describe(BucketSample(tuple(tuple(s) for s in next(
                m.sample["strata"] for m in self._measured.values() if m.sample is not None)), sampled),
                self.ctx.buckets))
        layers = next((m.layer_sample for m in self._measured.values() if m.layer_sample is not None), None)
        if layers is not None:
            notes.append(describe_layer_sample(layers, len(self.ctx.buckets)))
        if self.cached:
            notes.append(f"{self.cached} of {len(self._measured)} compressor measurements were cached from an earlier "
                         f"run on the same trace and settings ({cache_dir()}; `arcsim cache clear` to drop "
                         "them)")
        if self.params is not None:
            notes.append(f"SYNTHETIC model of {self.params.params:,} fp32 parameters in {self.params.layers} equal "
                         f"layers: message sizes are the full model's; errors were measured on a "
                         f"{self.params.sample_layer * self.params.layers:,}-element sample (1/{self.params.scale:,.0f}"
                         f" of each layer) with synthetic heavy-tailed gradients, not a real model's; compression "
                         + ("modelled on the GPU at full size" if self.ctx.gpu is not None else
                            "timed on the sample here and scaled linearly"))
        elif t.meta.get("synthetic_data"):
            notes.append("the trace's data is SYNTHETIC: its gradients have the model's structure, not real "
                         "training statistics")
        return notes


def fusion_comparison(analysis: Analysis, bucketed: RunResult) -> list[dict[str, Any]]:
    """Each compressor at --density with its fastest collective, bucket by bucket (``bucketed``) and with the
    whole model fused into one vector (measured again: the compressor then selects over the whole gradient)."""
    cfg = dataclasses.replace(analysis.cfg, fusion="model", policy="none", ratios=(analysis.cfg.density,))
    fused = Analysis(cfg, announce=lambda _: None, source=analysis.trace).run()  # the same gradients

    def best(result: RunResult) -> dict[str, Candidate]:
        out: dict[str, Candidate] = {}
        for c in [result.dense, *result.candidates]:
            if c.compressor not in out or c.iteration_s < out[c.compressor].iteration_s:
                out[c.compressor] = c
        return out

    per_bucket, whole = best(bucketed), best(fused)
    return [{"compressor": name, "bucket_collective": b.collective, "bucket_iteration_s": b.iteration_s,
             "bucket_comm_s": b.comm_s, "bucket_exposed_comm_s": b.exposed_comm_s, "buckets": len(b.bucket_comm_s),
             "model_collective": whole[name].collective, "model_iteration_s": whole[name].iteration_s,
             "model_comm_s": whole[name].comm_s, "model_exposed_comm_s": whole[name].exposed_comm_s,
             "model_rel_error": whole[name].rel_error, "bucket_rel_error": b.rel_error}
            for name, b in per_bucket.items() if name in whole]
