"""What heavy work will take, said before it starts: training W workers here (``trace capture``, ``run --live``)
and measuring compressors on a trace (a cold ``arcsim run``). Training that would need more memory than this
machine has available is refused (one ``error:`` line) unless ``--force``.

The rates are measured on the 2-core development machine (training 2026-11-25, measuring 2026-11-29); each
constant names its source. They are rough by design: they decide whether to warn and refuse, not what to report.
Measuring is scaled by the load other work puts on the machine now (:class:`Load`: on a busy machine it had been
3-4x too low) and spread over the processes that measure side by side.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from arcsim.errors import ArcsimError
from arcsim.processes import physical_memory_bytes, usable_cores
from arcsim.units import format_size

if TYPE_CHECKING:
    from arcsim.traces.training import TrainingConfig

BASE_BYTES = 450e6            # the arcsim process with torch loaded: 428-446 MB peak RSS (a cached `arcsim run`,
#                               a cnn capture)
TRAIN_FLOPS_PER_S = 70e9      # training on this CPU, forward + backward (captures, 2026-11-25): resnet18 85 GFLOP in
#                               2.1 s and 341 GFLOP in 3.1 s (the 256 GFLOP between in 1.0 s); llama_60m 264 GFLOP in
#                               7.8 s and 527 GFLOP in 7.7 s (its text data's set-up dominates)
TRAIN_START_S = 2.0           # building the model and its data: cnn 1.0-1.1 s, resnet18 ~1.8 s, llama_60m ~7 s
MEASURE_ELEMENTS_PER_S = 220e6  # measuring compressors with their error feedback on a trace, one run at a time on
#                                torch's threads: gradient elements read (workers × steps × elements) per second,
#                                PowerSGD measured whole (2026-11-29): llama_60m 1.39 G in 4.6-7.8 s (180-300 M/s),
#                                llama_1b 3.38 G in 21 s streamed (160 M/s); the geometric middle
MEASURE_ONE_THREAD_ELEMENTS_PER_S = 130e6  # the same on one thread, per process, two side by side on 2 cores
#                                (2026-11-29): the shipped trace's 82 runs, 0.40 G in 1.6-1.8 s with their own
#                                costs; llama_60m's layer sample 1.29 G in 4.5 s (143 M/s a process), llama_1b's
#                                1.97 G in 8.3 s (118 M/s)
MEASURE_FIXED_S = 0.002       # each run's own cost (its set-up, its result kept in the cache): the shipped trace's
#                               82 runs took 1.6-1.8 s where their elements at the rate above say 1.54 s (1-3 ms a run)
TRACE_READ_BYTES_PER_S = 1e9   # a pass over the stored gradients (loading them, gathering the layer sample, a
#                               streamed pass of whole measurements), 2026-11-29: llama_60m's 0.93 GB loaded with
#                               the sample and its buckets' norms 0.65 GB/s, loaded alone 1.44 GB/s; llama_1b's
#                               5.4 GB gathered in chunks 1.3-1.8 GB/s
MEASURE_TIMED_FACTOR = 1.5     # compression timed here as well (--gpu cpu): the shipped trace 3.0 s against 2.0 s
BUSY_SLOWDOWN = 1.2            # a load that slows measuring by this much or more is named in the estimate
LOAD_WINDOW_S = 0.1            # how long Load.now watches the cores (the 1-minute load average had a run that had
#                               just ended make a quiet machine's estimate 1.5× long)
NOTE_SECONDS, NOTE_BYTES = 10.0, 2e9  # work estimated at either or more is announced before it starts
OPTIMIZER_SLOTS = {"sgd": 1, "adamw": 2}  # fp32 state per parameter: momentum; AdamW's two moments
LIVE_STATE_BYTES_PER_ELEMENT = 8  # a compressor measured live keeps error feedback and a scratch copy per worker
CAPTURE_BYTES_PER_ELEMENT = 0  # a step written to a trace is held in its stored dtype already and written in
#                                pieces (arcsim.traces.format.TraceWriter.write_step): nothing model-sized beside


class TooBig(ArcsimError):
    """Work estimated past what this machine has (lifted by ``--force``)."""


@dataclass(frozen=True)
class Estimate:
    memory_bytes: float
    seconds: float
    detail: str

    @property
    def worth_saying(self) -> bool:
        return self.seconds >= NOTE_SECONDS or self.memory_bytes >= NOTE_BYTES

    def describe(self) -> str:
        return (f"about {format_size(self.memory_bytes)} of memory and ~{rough_duration(self.seconds)} here "
                f"({self.detail})")


def rough_duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``18 h``: an estimate's time, in whole units from 10 up, else two figures."""
    unit, scale = next(((u, s) for u, s in (("h", 3600.0), ("min", 60.0)) if seconds >= 1.5 * s), ("s", 1.0))
    value = seconds / scale
    return f"{value:.0f} {unit}" if value >= 10 else f"{value:.2g} {unit}"


def training(cfg: TrainingConfig, state_per_element: float = 0.0) -> Estimate:
    """Training ``cfg`` here: the model's parameters and gradients, their average and the optimizer's state (fp32;
    none when the recorded step is the last: nothing trains after it), the recorded step's gradients of every worker
    (in the dtype they are held in), one worker's activations (every forward operation's operands
    and result, counted on the meta device: an upper estimate), plus ``state_per_element`` bytes × workers ×
    parameters (what the caller keeps beside); time from the step's FLOPs."""
    params, activations, flops = _step(cfg)
    # parameters and gradients; their average and the optimizer's state only where a step follows the last recorded
    state = 4 * params * (2 + (1 + OPTIMIZER_SLOTS.get(cfg.optimizer_name(), 2) if cfg.total_steps > 1 else 0))
    recorded = cfg.record_dtype().itemsize * cfg.workers * params
    memory = BASE_BYTES + state + recorded + activations + state_per_element * cfg.workers * params
    seconds = TRAIN_START_S + flops * cfg.workers * cfg.total_steps / TRAIN_FLOPS_PER_S
    return Estimate(memory, seconds, f"{params:,} parameters × {cfg.workers} workers, {cfg.total_steps} training "
                                     f"step(s) of {flops / 1e9:,.1f} GFLOP per worker")


def live_run(cfg: TrainingConfig, measurements: int, budget: float) -> Estimate:
    """``arcsim run --live``: ``measurements`` compressor runs, as many per training pass as fit ``budget`` bytes of
    their state (arcsim.run.analysis), each pass training again."""
    per = LIVE_STATE_BYTES_PER_ELEMENT * cfg.workers * _step(cfg)[0]
    group = min(measurements, max(1, int(budget // per)))
    passes = math.ceil(measurements / group)
    est = training(cfg, state_per_element=LIVE_STATE_BYTES_PER_ELEMENT * group)
    return Estimate(est.memory_bytes, est.seconds * passes,
                    f"{est.detail}; {measurements} compressor runs, {group} per training pass: {passes} pass(es)")


def _step(cfg: TrainingConfig) -> tuple[int, float, float]:
    """(parameters, one worker's forward bytes, forward + backward FLOPs) of a training step, counted on meta."""
    from arcsim.models.workload import count_workload

    work = count_workload(cfg.source, cfg.batch or cfg.source.default_batch, cfg.dataset, cfg.input_size, cfg.data)
    return (sum(work.numel.values()), sum(op.bytes for op in work.forward),
            sum(op.flops for op in work.forward) + sum(op.flops for op in work.backward))


@dataclass(frozen=True)
class Load:
    """What other work asks of this machine's cores: ``others`` runnable tasks on average over ``cores``."""

    others: float
    cores: int

    @classmethod
    def now(cls) -> Load:
        """The other tasks runnable now, over LOAD_WINDOW_S (:func:`others_runnable`); where /proc cannot say, the
        1-minute load average less this process's share (:func:`own_load`) — which still counts, for a minute, a run
        that has just ended."""
        others = others_runnable(LOAD_WINDOW_S)
        if others is None:
            try:
                others = max(0.0, os.getloadavg()[0] - own_load())
            except (OSError, AttributeError):  # (no load average at all: Windows)
                others = 0.0
        return cls(others, usable_cores())

    @property
    def slowdown(self) -> float:
        """Wall time against an idle machine's, sharing the cores fairly: our ``cores`` threads beside
        ``others`` get cores / (cores + others) of them."""
        return 1.0 + self.others / self.cores

    def cores_for(self, processes: int) -> float:
        """The cores ``processes`` single-threaded processes of ours get beside the others' work (a fair share)."""
        return min(float(processes), self.cores * processes / (processes + self.others))

    def describe(self) -> str:
        """``, the cores busy: load 2.0 on 2, 2.0× an idle machine's time``, or nothing on a quiet machine."""
        if self.slowdown < BUSY_SLOWDOWN:
            return ""
        return f", the cores busy: load {self.others:.1f} on {self.cores}, {self.slowdown:.1f}× an idle machine's time"


def others_runnable(window: float, samples: int = 5) -> float | None:
    """Other tasks runnable on this machine, on average over ``window`` seconds (``samples`` readings of
    /proc/loadavg's count of runnable tasks, less this one, which reads it); None where /proc cannot say."""
    counts = []
    try:
        for i in range(samples):
            counts.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1)
            if i + 1 < samples:
                time.sleep(window / (samples - 1))
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, sum(counts) / len(counts))


def own_load() -> float:
    """This process's part in the 1-minute load average: its CPU seconds per second since it started, weighted as
    the average's exponential window (60 s) has seen them; 0 where /proc cannot say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
        elapsed = float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0
    if elapsed <= 0:
        return 0.0
    return time.process_time() / elapsed * (1 - math.exp(-elapsed / 60))


@dataclass(frozen=True)
class MeasuringWork:
    """What measuring a trace's compressors reads, and how it runs (arcsim.run.analysis.Analysis.measuring_work):
    gradient elements read one run at a time on torch's threads (``threaded``) or on one thread (``one_thread``,
    arcsim.run.measure.measuring_threads), or side by side in ``processes`` one-thread processes (``side_by_side``,
    Analysis.measure_ahead); ``measurements`` runs in all; the stored trace's bytes read (``trace_bytes``);
    ``timed``: the compression timed as well."""

    threaded: float = 0.0
    one_thread: float = 0.0
    side_by_side: float = 0.0
    processes: int = 1
    measurements: int = 0
    trace_bytes: float = 0.0
    timed: bool = False

    def seconds(self, load: Load) -> float:
        """The time it should take here with the machine as loaded as ``load``: torch's threads slowed by the
        load, one thread or process by the cores it gets beside the others' work."""
        timed = MEASURE_TIMED_FACTOR if self.timed else 1.0
        one = timed * self.one_thread / MEASURE_ONE_THREAD_ELEMENTS_PER_S + self.trace_bytes / TRACE_READ_BYTES_PER_S
        side = timed * self.side_by_side / MEASURE_ONE_THREAD_ELEMENTS_PER_S
        return ((timed * self.threaded / MEASURE_ELEMENTS_PER_S + self.measurements * MEASURE_FIXED_S)
                * load.slowdown + one / load.cores_for(1) + side / load.cores_for(self.processes))


def available_memory() -> float:
    """Bytes this machine can give a new process now (MemAvailable), or its physical memory where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(physical_memory_bytes())


def check_training(what: str, estimate: Callable[[], Estimate], force: bool) -> Estimate | None:
    """``estimate()``, refused past the available memory (``check_fits``); None where the model cannot be counted
    on the meta device (a model of the user's that needs real data, or fails: its training reports why)."""
    try:
        est = estimate()
    except Exception:  # the user's model or data on meta tensors: no estimate, never a refusal
        return None
    check_fits(what, est, force)
    return est


def check_fits(what: str, est: Estimate, force: bool) -> None:
    """Refuse ``what`` when its estimated memory exceeds what is available (unless ``force``)."""
    free = available_memory()
    if est.memory_bytes > free and not force:
        raise TooBig(f"{what} needs {est.describe()}, and this machine has {format_size(free)} available; use "
                     "fewer workers, a smaller model or batch, or --force to try anyway")
