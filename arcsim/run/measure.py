"""Run one compressor (with its error feedback) over a trace, bucket by bucket, and keep what pricing needs.

Each bucket has its own compressor and memory state, as a DDP comm hook keeps per-bucket state. For
every (step, bucket): the CommLog records (priced later on any topology), the squared aggregate error
and reference norm (so whole-model errors are exact sums), the compression gain ||C(u)||/||u|| of
Tyagi & Swany, and one rank's compression time (timed on the first step, on one worker's slice, with CUDA events where
the gradients are on a GPU).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from arcsim.catalog import INFO, memory_for, options_for
from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.solo import SoloComm
from arcsim.compressors.base import Compressed, Compressor
from arcsim.compressors.grouping import Grouping, slice_bounds, slice_seed
from arcsim.compressors.hierarchy import NodeAware, node_memories, worker_memory
from arcsim.compressors.memory import Memory, make_memory
from arcsim.compressors.nested import NestedTopK, RawTopK
from arcsim.compressors.registry import make_compressor
from arcsim.run.layer_sample import GROUPS, Groups, LayerSample
from arcsim.run.measurement import Measurement
from arcsim.run.sampling import BucketSample
from arcsim.strategy.buckets import Bucket
from arcsim.traces.timing import Clock


def default_memory(compressor: str) -> str:
    return INFO[compressor].default_memory


SHARED_BYTES = 3 << 30  # what GradientStats may keep: the means, fp32 buckets and nested Top-K sets


class GradientStats:
    """What every measurement of the same gradients needs of them, per (trace step, bucket): the workers'
    mean, its squared norm and each worker's norm — computed by the first measurement, read by the others
    (the grid measures ~67 (compressor, density) pairs on the same steps; these depend on neither); also the
    bucket converted to float32 (from a half-precision trace) and, for the planned ``densities``, the nested
    Top-K sets of its raw gradient (arcsim.compressors.nested). What is model-sized is kept only within
    ``shared_bytes`` (a 1 B model's means alone are 5.4 GB) and computed again where it did not fit."""

    def __init__(self, densities: Iterable[float] = (), shared_bytes: int = SHARED_BYTES) -> None:
        self._means: dict[tuple[int, int], torch.Tensor] = {}
        self._norms: dict[tuple[int, int], torch.Tensor] = {}
        self._mean2: dict[tuple[int, int], float] = {}
        self._kept: dict[tuple[Any, ...], Any] = {}
        self._floats: dict[tuple[int, int], torch.Tensor] = {}
        self._nested: dict[tuple[int, int], tuple[NestedTopK, int]] = {}  # the sets, and the bytes set aside
        self.densities = tuple(d for d in densities if 0 < d < 1)
        self._room = shared_bytes

    def bucket(self, step: int, b: Bucket, g: torch.Tensor) -> torch.Tensor:
        """Bucket ``b``'s [W, n] float32 gradients of step ``g``: a view where ``g`` is float32 in memory, else
        converted (or read: arcsim.traces.format.StepColumns) once and kept while there is room."""
        if (step, b.index) in self._floats:
            return self._floats[step, b.index]
        x = g[:, b.lo:b.hi].float()
        converted = g.dtype != torch.float32 or not getattr(g, "in_memory", True)  # (a step read on demand: read)
        if converted and self._take(x.numel() * 4):
            self._floats[step, b.index] = x
        return x

    def nested(self, step: int, bucket: int, x: torch.Tensor) -> RawTopK | None:
        """The nested Top-K sets of the raw gradients ``x`` of (step, bucket) at the planned densities (found
        as compressors ask), bound to ``x``; None without planned densities or room."""
        if (step, bucket) not in self._nested:
            need = int(x.numel() * 4 * sum(self.densities))  # int32 indices, one set per density
            if not self.densities or not self._take(need):
                return None
            self._nested[step, bucket] = NestedTopK(self.densities), need
        return self._nested[step, bucket][0].bind(x)

    def forget(self, step: int, bucket: int) -> None:
        """Drop what is kept of (step, bucket) but its scalars, and give its room back."""
        for kept in (self._floats, self._means):
            t = kept.pop((step, bucket), None)
            self._room += 0 if t is None else t.numel() * 4
        _, reserved = self._nested.pop((step, bucket), (None, 0))
        self._room += reserved

    def _take(self, size: int) -> bool:
        if size > self._room:
            return False
        self._room -= size
        return True

    def mean(self, step: int, bucket: int, x: torch.Tensor) -> torch.Tensor:
        """The workers' mean [1, n] of ``x``: kept while there is room, else computed again when asked."""
        if (step, bucket) in self._means:
            return self._means[step, bucket]
        mean = x.mean(dim=0, keepdim=True)
        if self._take(mean.numel() * 4):
            self._means[step, bucket] = mean
        return mean

    def mean2(self, step: int, bucket: int, x: torch.Tensor) -> float:
        """||ḡ||² of the bucket's mean gradient (``x``: the bucket's [W, n] gradients)."""
        if (step, bucket) not in self._mean2:
            self._mean2[step, bucket] = float(self.mean(step, bucket, x).pow(2).sum())
        return self._mean2[step, bucket]

    def kept(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """``compute()``, kept under ``key`` for the other measurements of the same gradients (a scalar or a short
        list: nothing model-sized)."""
        if key not in self._kept:
            self._kept[key] = compute()
        return self._kept[key]

    def norms(self, step: int, bucket: int, x: torch.Tensor) -> torch.Tensor:
        if (step, bucket) not in self._norms:
            self._norms[step, bucket] = x.norm(dim=1).clamp_min(1e-30)
        return self._norms[step, bucket]


SMALL_WORK_ELEMENTS = 1 << 20  # a bucket of fewer elements over all workers is compressed on one intra-op thread


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` inside (None: left as they are), restored after."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measuring_threads(buckets: list[Bucket], workers: int, sampled: bool = False) -> int | None:
    """The intra-op threads to measure with: one where every bucket is small (its ops last microseconds,
    and splitting them over threads costs more than it gives — on a 2-core machine shared with other work
    two threads took 19–50 s where one took 2 s, waiting at every op's barrier for a descheduled thread) and on a
    layer sample (``sampled``) always, so its sums are the same measured side by side (Analysis.measure_ahead) or
    not; None (torch's own) for larger buckets, where two threads measured ~2× faster on an idle machine."""
    return 1 if sampled or max(b.numel for b in buckets) * workers < SMALL_WORK_ELEMENTS else None


ROW_KEYS = ("records", "err2", "ref2", "upd2", "raw2", "gain", "selected", "compress_s")  # a step's, per bucket
PART_KEYS = ("err2_parts", "ref2_parts")  # … and, on a layer sample, per bucket and group


class BucketedCompression:
    """Per-bucket compressors and memories over W in-process workers, as DDP comm hooks keep them; each
    ``step`` returns each bucket's aggregated update and what pricing and fidelity need for that step."""

    def __init__(self, buckets: list[Bucket], compressor: str, density: float, memory: str | None = None,
                 seed: int = 0, options: Mapping[str, Any] | None = None, timed: bool = True,
                 stats: GradientStats | None = None, grouping: Grouping | None = None,
                 only: Iterable[int] | None = None, parts: Mapping[int, Groups] | None = None,
                 whole_norms: Mapping[int, torch.Tensor] | None = None) -> None:
        """``stats``: shared with other measurements of the same gradients (None: computed, not kept).
        ``grouping``: compress node-aware, the workers grouped into nodes so (None: flat). ``only``: compress
        these buckets (by index) and skip the others (a sample: arcsim.run.sampling); None: every bucket.
        ``parts``: each bucket's elements' groups (a layer sample: arcsim.run.layer_sample), whose err² and ref² are
        also kept group by group; ``whole_norms``: by training step, each worker's norm of each whole bucket
        [buckets, workers], handed to the compressors (Compressor.whole_norms)."""
        self.buckets, self.seed, self.shared_options = buckets, seed, dict(options or {})
        self.only = None if only is None else frozenset(only)
        self.parts, self.whole_norms = parts, whole_norms
        self.row_keys = ROW_KEYS + (PART_KEYS if parts is not None else ())
        self.stats = stats
        self.memory = memory_for(compressor, memory)  # DGC and onebit keep their own (always none)
        self.grouping = grouping
        self.layouts = [b.layout() for b in buckets]
        # error feedback: flat, a memory per bucket; node-aware, one per slice of each bucket (the other list empty)
        self.mems = [make_memory(self.memory) for _ in buckets] if grouping is None else []
        self.slice_mems = [] if grouping is None else [
            [make_memory(self.memory) for _ in range(grouping.gpus)] for _ in buckets]
        self.switch(compressor, density)
        self.comm: InProcessComm | None = None
        self.timed = timed  # False where compression is modelled (a catalogue GPU): nothing timed, NaN kept
        self.timing_threads = torch.get_num_threads()  # one rank's work is timed on the threads it would have

    def _timed(self, *args: Any) -> float:
        """:func:`one_rank_seconds` on the intra-op threads the process had (a measurement may use fewer)."""
        with intra_op_threads(self.timing_threads):
            return one_rank_seconds(*args)

    @property
    def hierarchy(self) -> str:
        return "flat" if self.grouping is None else "node"

    def switch(self, compressor: str, density: float) -> None:
        """Compress with ``compressor`` at ``density`` from now on; the error-feedback memories carry over (what
        a worker, or a node's slice, has not yet sent is owed whatever compresses it next)."""
        self.compressor, self.density = compressor, density
        self.options = options_for(compressor, self.shared_options)  # shared options (scope …) this one accepts
        self.comps = [self._compressor(b) for b in self.buckets]
        self.one_rank: dict[int, float] = {}  # per-rank compression seconds per bucket, timed on its first step
        self.node_aware = [] if self.grouping is None else [self._node_aware_of(b) for b in self.buckets]

    def _compressor(self, b: Bucket) -> Compressor:
        return make_compressor(self.compressor, self.density, seed=self.seed + b.index, **self.options)

    def _node_aware_of(self, b: Bucket) -> NodeAware:
        assert self.grouping is not None
        return NodeAware(self.grouping, b.numel, b.layout(), functools.partial(self._slice_part, b.index))

    def regroup(self, grouping: Grouping | None) -> None:
        """Compress flat (None) or node-aware with ``grouping`` from now on, the error feedback carried over
        (arcsim.compressors.hierarchy.node_memories and worker_memory: what the workers owed their nodes owe,
        and back)."""
        if grouping != self.grouping:
            if self.grouping is not None:
                self.mems = [worker_memory(parts, self.grouping) for parts in self.slice_mems]
                self.slice_mems = []
            if grouping is not None:
                self.slice_mems = [node_memories(mem, grouping, slice_bounds(b.numel, grouping.gpus, layout))
                                   for mem, b, layout in zip(self.mems, self.buckets, self.layouts, strict=True)]
                self.mems = []
            self.grouping = grouping
        self.switch(self.compressor, self.density)

    def release(self, index: int) -> None:
        """Forget bucket ``index``'s state — its memory's residual, its compressor's momentum, velocity or errors
        (DGC, 1-bit Adam, Signum keep a model-sized one) — where no step of it follows: one pass measuring many
        compressors would otherwise hold every compressor's state of every bucket at its end (LLaMA-1B: past
        24 GB)."""
        b = self.buckets[index]
        self.comps[index] = self._compressor(b)
        if self.grouping is None:
            self.mems[index] = make_memory(self.memory)
        else:
            self.slice_mems[index] = [make_memory(self.memory) for _ in range(self.grouping.gpus)]
            self.node_aware[index] = self._node_aware_of(b)

    def take_memories(self, other: BucketedCompression) -> None:
        """A copy of ``other``'s error feedback, regrouped to this one's hierarchy (an adaptive decision's trial)."""
        wanted = self.grouping
        self.grouping, self.mems, self.slice_mems = other.grouping, copy.deepcopy(other.mems), copy.deepcopy(
            other.slice_mems)
        self.regroup(wanted)

    def _slice_part(self, bucket: int, g: int) -> tuple[Compressor, Memory]:
        """Node-aware: the compressor (a seed of its own) and memory of slice ``g`` of bucket ``bucket``."""
        return (make_compressor(self.compressor, self.density, seed=slice_seed(self.seed, bucket, g), **self.options),
                self.slice_mems[bucket][g])

    def step(self, step: int, g: torch.Tensor, final: bool = False, updates: bool = True,
             buckets: Iterable[Bucket] | None = None) -> tuple[list[torch.Tensor], dict[str, list]]:
        """Compress [W, d] gradients bucket by bucket; returns the [1, bucket] updates (in bucket order, which
        is the order of the flat vector; none kept without ``updates``: a model-sized vector a trace's
        measurement does not apply) and the step's row. ``final``: no step follows (memories stay).
        ``buckets``: these of the step only (one pass of several measurements, bucket by bucket)."""
        if self.comm is None:
            self.comm = InProcessComm(g.shape[0])
        comm = self.comm
        row: dict[str, list] = {k: [] for k in self.row_keys}
        kept: list[torch.Tensor] = []
        stats = self.stats or GradientStats()
        for b in self.buckets if buckets is None else buckets:
            if self.only is not None and b.index not in self.only:
                continue
            x = stats.bucket(step, b, g)  # a half-precision step is converted here, a bucket at a time
            mean_g = stats.mean(step, b.index, x)
            if self.node_aware:
                out = self._node_aware(step, b, x, stats, row, final)
                kept.extend([out] if updates else [])
                continue
            comp = self.comps[b.index]
            comp.raw = stats.nested(step, b.index, x)  # (bound to x: dropped after this bucket)
            comp.whole_norms = None if self.whole_norms is None else self.whole_norms[step][b.index]
            seen: dict[str, Any] = {}

            def observe(u: torch.Tensor, res: Compressed, x: torch.Tensor = x, mean_g: torch.Tensor = mean_g,
                        stats: GradientStats = stats, index: int = b.index, seen: dict = seen) -> None:
                raw = u is x and res.reference is None  # the gradient itself was sent (no feedback yet, or none)
                mean = mean_g if raw else u.mean(dim=0, keepdim=True) if res.reference is None else res.reference
                if self.parts is None:
                    seen["err2"] = float((res.aggregate.float() - mean).pow(2).sum())
                    seen["ref2"] = stats.mean2(step, index, x) if raw else float(mean.pow(2).sum())
                else:  # a layer sample: each element weighted by what it stands for
                    groups = self.parts[index]
                    seen["err2_parts"] = groups.sums((res.aggregate.float() - mean).pow(2))
                    seen["ref2_parts"] = stats.kept(("ref2 parts", step, index), lambda: groups.sums(mean.pow(2))) \
                        if raw else groups.sums(mean.pow(2))
                    seen["err2"], seen["ref2"] = sum(seen["err2_parts"]), sum(seen["ref2_parts"])
                norms = stats.norms(step, index, x) if raw else u.norm(dim=1).clamp_min(1e-30)
                seen["gain"] = float((res.contribution.norms(u.shape[1]) / norms).mean())
                seen["selected"] = float(res.selected.float().mean())

            mark = comm.log.mark()
            out = self.mems[b.index].step(x, comp, comm, step, self.layouts[b.index], observe, final)
            comp.raw = None
            kept.extend([out] if updates else [])
            if not seen:  # sent dense this step (EF21's first step): exact
                seen = {"err2": 0.0, "ref2": self._raw2(stats, step, b.index, x, mean_g), "gain": 1.0,
                        "selected": float(b.numel)}
                if self.parts is not None:
                    seen["err2_parts"] = [0.0] * (GROUPS + 1)
                    seen["ref2_parts"] = self.parts[b.index].sums(mean_g.pow(2))
            row["records"].append(comm.log.since(mark))
            wrong = (out.float() - mean_g).pow(2)
            row["upd2"].append(float(wrong.sum()) if self.parts is None else self.parts[b.index].total(wrong))
            row["raw2"].append(self._raw2(stats, step, b.index, x, mean_g))
            if b.index not in self.one_rank:
                self.one_rank[b.index] = float("nan") if not self.timed else self._timed(
                    x, self.compressor, self.density, self.memory, self.seed + b.index, self.options,
                    self.layouts[b.index])
            row["compress_s"].append(self.one_rank[b.index])
            for key in ("err2", "ref2", "gain", "selected", *(PART_KEYS if self.parts is not None else ())):
                row[key].append(seen[key])
        return kept, row

    def _raw2(self, stats: GradientStats, step: int, index: int, x: torch.Tensor, mean_g: torch.Tensor) -> float:
        """‖ḡ‖² of a bucket (on a layer sample, the whole bucket's estimate: each element weighted)."""
        if self.parts is None:
            return stats.mean2(step, index, x)
        groups = self.parts[index]
        return stats.kept(("raw2", step, index), lambda: groups.total(mean_g.pow(2)))

    def _node_aware(self, step: int, b: Bucket, x: torch.Tensor, stats: GradientStats, row: dict[str, list],
                    final: bool) -> torch.Tensor:
        """One bucket compressed node-aware (arcsim.compressors.hierarchy); its row entries appended."""
        mean_g = stats.mean(step, b.index, x)
        node = self.node_aware[b.index]
        out, records, st = node.step(x, step, final)
        reference = st.compressed_mean()
        row["records"].append(records)
        if self.parts is None:
            row["err2"].append(float((out - reference).pow(2).sum()))
            row["ref2"].append(float(reference.pow(2).sum()))
            row["upd2"].append(float((out - mean_g).pow(2).sum()))
        else:  # a layer sample: each element weighted by what it stands for
            row["err2_parts"].append(self.parts[b.index].sums((out - reference).pow(2)))
            row["ref2_parts"].append(self.parts[b.index].sums(reference.pow(2)))
            row["err2"].append(sum(row["err2_parts"][-1]))
            row["ref2"].append(sum(row["ref2_parts"][-1]))
            row["upd2"].append(self.parts[b.index].total((out - mean_g).pow(2)))
        row["raw2"].append(self._raw2(stats, step, b.index, x, mean_g))
        row["gain"].append(st.gain)
        row["selected"].append(float(st.selected.mean()))
        if b.index not in self.one_rank:  # one rank's work: its slice, as priced (n / G of the priced node)
            lo, hi = node.bounds[0]
            self.one_rank[b.index] = float("nan") if not self.timed else node.grouping.slice_scale * self._timed(
                node.node_means(x)[:, lo:hi].contiguous(), self.compressor, self.density, self.memory,
                self.seed + b.index, self.options, node.layouts[0])
        row["compress_s"].append(self.one_rank[b.index])
        return out


def measure(steps: Iterable[tuple[int, torch.Tensor]], buckets: list[Bucket], compressor: str, density: float,
            memory: str | None = None, seed: int = 0, options: Mapping[str, Any] | None = None,
            timed: bool = True, count: int | None = None, stats: GradientStats | None = None,
            grouping: Grouping | None = None, sample: BucketSample | None = None,
            layer_sample: LayerSample | None = None,
            whole_norms: Mapping[int, torch.Tensor] | None = None) -> Measurement:
    """Compress every bucket of every trace step; ``steps`` yields (training step, [W, d] float32, or half
    precision, converted a bucket at a time). ``timed``: also time one rank's compression here (skip it
    where compression is modelled on a GPU). ``count``: how many steps ``steps`` yields, where known (the
    memories then skip their update after the last). ``stats``: the gradients' statistics shared with other
    measurements of the same steps. ``grouping``: node-aware, the workers grouped into nodes so. ``sample``:
    compress only its buckets, the others estimated from them (arcsim.run.sampling; None: every bucket).
    ``layer_sample``: ``steps`` are its sampled columns (arcsim.run.layer_sample), ``whole_norms`` by training step
    the whole buckets' norms of each worker (for the compressors that scale by them: needs_whole_norms)."""
    return measure_many(steps, buckets, [(compressor, density, memory)], seed, options, timed, count, stats,
                        grouping, sample, layer_sample=layer_sample, whole_norms=whole_norms)[0]


def measure_many(steps: Iterable[tuple[int, torch.Tensor]], buckets: list[Bucket],
                 which: list[tuple[str, float, str | None]], seed: int = 0, options: Mapping[str, Any] | None = None,
                 timed: bool = True, count: int | None = None, stats: GradientStats | None = None,
                 grouping: Grouping | None = None, sample: BucketSample | None = None,
                 bucket_major: bool = False, layer_sample: LayerSample | None = None,
                 whole_norms: Mapping[int, torch.Tensor] | None = None) -> list[Measurement]:
    """:func:`measure` for several (compressor, density, memory) at once, in ONE pass over ``steps``: each
    step is given to all of them before the next is asked for (live training yields one step at a time).
    ``bucket_major``: each bucket to all of them before the next, what is shared of it (its float32
    conversion, mean, nested Top-K sets) then dropped — a model too large for the shared room still shares.
    ``layer_sample``: ``steps`` are its sampled columns (arcsim.run.layer_sample), ``buckets`` the whole ones; the
    measurements are its estimates of the whole buckets'."""
    stats = stats or GradientStats()  # shared by these runs, and only by them unless the caller keeps it
    only = None if sample is None else sample.measured
    parts = None if layer_sample is None else layer_sample.groups
    buckets = buckets if layer_sample is None else list(layer_sample.buckets)
    runs = [BucketedCompression(buckets, c, d, m, seed, options, timed, stats, grouping, only, parts, whole_norms)
            for c, d, m in which]
    elements = sum(b.numel for b in buckets)
    out = [Measurement(bc.compressor, bc.density, bc.memory, elements, "flat" if grouping is None else "node")
           for bc in runs]
    for i, (step, g) in enumerate(steps):  # (live training yields these: its own threads and autograd)
        final = i + 1 == count
        with intra_op_threads(measuring_threads(buckets, g.shape[0], layer_sample is not None)), torch.no_grad():
            if not bucket_major:
                for bc, meas in zip(runs, out, strict=True):
                    meas.add(bc.step(step, g, final=final, updates=False)[1])
            else:
                rows: list[dict[str, list]] = [{k: [] for k in bc.row_keys} for bc in runs]
                for b in buckets:
                    for bc, row in zip(runs, rows, strict=True):
                        for key, values in bc.step(step, g, final=final, updates=False, buckets=[b])[1].items():
                            row[key].extend(values)
                        if final:  # this run's state of this bucket, before the next run makes its own
                            bc.release(b.index)
                    stats.forget(step, b.index)
                for meas, row in zip(out, rows, strict=True):
                    meas.add(row)
        del g
    if layer_sample is not None:
        return [layer_sample.expand(meas) for meas in out]
    return out if sample is None else [sample.expand(meas) for meas in out]


TIMING_BUDGET_S = 0.02  # per bucket: cheap compressions are repeated until this much time is spent …
TIMING_CALLS = (3, 15)  # … within these bounds on the number of timed calls


def one_rank_seconds(x: torch.Tensor, compressor: str, density: float, memory: str, seed: int,
                     options: Mapping[str, Any], layout) -> float:
    """One rank's compression work on its own slice: a fresh compressor and memory over a SoloComm
    (collectives become copies), warmed up once, then the median of 3–15 timed steps (as many as fit in
    TIMING_BUDGET_S) — so fixed per-call costs count in full instead of being shared by the W workers
    stacked in-process, and a scheduler hiccup on a busy machine does not become the prediction."""
    comp = make_compressor(compressor, density, seed=seed, **options)
    mem = make_memory(memory)
    comm = SoloComm(x.shape[0], leader=True)  # a leader's work (AR-Top-K) is on every rank's critical path
    mine = x[0:1].clone()
    mem.step(mine.clone(), comp, comm, 0, layout)
    clock = Clock(x.device)  # CUDA events on a GPU (kernels are asynchronous), the host clock on the CPU
    times: list[float] = []
    while len(times) < TIMING_CALLS[0] or (len(times) < TIMING_CALLS[1] and sum(times) < TIMING_BUDGET_S):
        arg = mine.clone()
        clock.finish()
        started = clock.mark()
        mem.step(arg, comp, comm, len(times) + 1, layout)
        ended = clock.mark()
        clock.finish()
        times.append(clock.seconds(started, ended))
    return float(np.median(times))
