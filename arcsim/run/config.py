"""What `arcsim run` is asked (RunConfig) and its checks, torch-free: a bad argument is answered before torch loads.
The analysis that carries it out is arcsim.run.analysis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arcsim.catalog import (
    AG_FAMILY,
    AR_TOPK_FAMILY,
    BUCKET_MB_RANGE,
    COMPRESSORS,
    DEFAULT_RATIOS,
    FUSIONS,
    HIERARCHIES,
    INFO,
    MEASURE_DEVICES,
    POLICIES,
    bucket_mb_ok,
    check_compression,
    check_options,
    fusion_message,
    hierarchy_message,
)
from arcsim.collectives.libraries import get_library
from arcsim.devices.catalog import HALF, PRECISIONS, device, priced_gpu
from arcsim.devices.source import ComputeSource, compute_source
from arcsim.errors import ArcsimError
from arcsim.files import writable_cache_dir
from arcsim.netsim import ENGINES
from arcsim.strategy.frameworks import FRAMEWORKS, framework_message, get_framework
from arcsim.strategy.schedule import STRATEGIES, Quantize, check_fits
from arcsim.topology import DEFAULT_TOPOLOGY, Topology, load_topology
from arcsim.traces.params import DEFAULT_LAYERS, ParamsModel

if TYPE_CHECKING:
    from arcsim.traces.training import TrainingConfig


class RunError(ArcsimError):
    """A bad `arcsim run` request."""


@dataclass
class RunConfig:
    topology: str = DEFAULT_TOPOLOGY
    trace: str | None = None
    compressors: tuple[str, ...] = COMPRESSORS
    density: float = 0.01
    memory: str | None = None           # None: ef14 for compressors, none for dense/fp16
    engine: str = "analytic"
    bucket_mb: float | None = None      # DDP bucket cap / Horovod fusion threshold, MiB (None: the framework's)
    policy: str = "auto"
    ratios: tuple[float, ...] = DEFAULT_RATIOS
    weights: tuple[float, float] | None = None
    compute_profile: str | None = None
    slack: float | None = None          # gate policy only: error allowed above Top-K's, relative (None: GATE_SLACK)
    dense_steps: float = 1000.0         # steps dense takes to the target: scales every time to target
    seed: int = 0
    allow_capture: bool = True
    force: bool = False                 # past the estimated memory of a capture (arcsim.traces.estimates)
    grid_steps: int | None = None       # trace steps for ratio-grid points (None: all, or 1 for large traces)
    compress_scale: float | dict[str, float] = 1.0  # measured compression × this, or per compressor (> 1 where
    #                                                ranks share cores: emulation)
    options: dict[str, Any] = field(default_factory=lambda: {"scope": "tensor"})  # each compressor takes its own
    gpu: str | None = None              # catalogue device; None: the topology's, else compute as the trace measured
    batch: int | None = None            # per GPU, for a GPU's compute (None: the trace's, else DEFAULT_GPU_BATCH)
    precision: str | None = None        # fp32, bf16 or fp16 autocast, a GPU's compute (None: the trace's, else fp32)
    library: str | None = None          # the communication library; None: the topology's
    bandwidth: float | None = None      # per-NIC bandwidth override, bytes/s
    latency: float | None = None        # one-way network latency override, s
    fusion: str = "bucket"              # bucket: DDP buckets; model: the whole gradient as one vector
    params: int | None = None           # a model of this many fp32 parameters instead of a trace (synthetic)
    layers: int | None = None           # its layer count (default DEFAULT_LAYERS)
    live: TrainingConfig | None = None  # gradients from live data-parallel training instead of a trace
    hierarchy: str = "flat"             # flat | node | both (arcsim.compressors.hierarchy)
    framework: str = "ddp"              # ddp | horovod | deepspeed: how gradients are grouped and sent (frameworks.py)
    cycle_ms: float | None = None       # Horovod's cycle time (None: HOROVOD_CYCLE_TIME's default, 1 ms)
    exact: bool = False                 # measure every bucket (else large measurements sample: run/sampling.py)
    measure_device: str = "cpu"         # where a trace's compressors run: cpu, or cuda (timed: run/kernel_check.py)

    @property
    def hierarchies(self) -> tuple[str, ...]:
        """The ways each compressor is priced: flat, node-aware, or both."""
        return ("flat", "node") if self.hierarchy == "both" else (self.hierarchy,)

    def planned_measurements_at_most(self) -> int:
        """How many compressor measurements a run makes at most (dense; each compressor at --density and over the
        ratio grid, each way of --hierarchy), known before any trace is read."""
        per_way = sum(1 if INFO[c].density_free else len({self.density, *self.ratios}) for c in self.compressors)
        return 1 + per_way * len(self.hierarchies)

    def params_model(self) -> ParamsModel | None:
        """The synthetic model --params asks for (None: a trace run)."""
        if self.params is None:
            return None
        return ParamsModel(self.params, self.layers or min(DEFAULT_LAYERS, self.params))

    @property
    def bucket_cap_mb(self) -> float:
        """The DDP bucket cap, Horovod fusion threshold or DeepSpeed buffer in MiB: --bucket-mb, else the framework's
        default."""
        return get_framework(self.framework).cap_mb(self.bucket_mb)

    @property
    def scope(self) -> str:
        return str(self.options.get("scope", "tensor"))

    def compute_source(self, topology: Topology | None = None) -> ComputeSource:
        """Where this run's compute comes from (arcsim.devices.source), on ``topology`` (default: the named one)."""
        topology_gpu = (topology or load_topology(self.topology)).gpu
        return compute_source(priced_gpu(self.gpu, topology_gpu), params=self.params is not None,
                              live_on_gpu=self.live is not None and self.live.on_gpu, profile=self.compute_profile)

    def check(self) -> None:
        writable_cache_dir()  # measurements are kept there, generated traces written there
        load_topology(self.topology)  # a missing or bad topology file, an unknown GPU in it
        check_compression(self.compressors, self.memory, RunError)
        check_options(self.compressors, self.options, RunError)
        if self.precision is not None and self.precision not in PRECISIONS:
            raise RunError(f"unknown precision {self.precision!r}; choose {', '.join(PRECISIONS)}")
        if self.gpu is not None:
            gpu = device(self.gpu)
            if gpu.modelled and self.precision is not None:
                gpu.check_precision(self.precision)
        if self.batch is not None and self.batch < 1:
            raise RunError(f"--batch is per GPU and at least 1, got {self.batch}")
        flags = [f for f, given in (("--batch", self.batch is not None and self.live is None),
                                    (f"--precision {self.precision}", self.precision in HALF)) if given]
        why = self.compute_source().why_not_modelled if flags else None
        if flags and why:
            raise RunError(f"{' and '.join(flags)} shape the compute modelled on a catalogue GPU, but {why}; "
                           f"drop {' and '.join(f.split()[0] for f in flags)}")
        if self.live is not None:
            if self.trace is not None or self.params is not None:
                raise RunError("--live trains the model here: give it without --trace or --params")
            self.live.check()
            if self.live.on_gpu and self.gpu is not None:
                raise RunError("--live --device cuda measures compute and compression on this GPU; --gpu would "
                               "price them on a catalogue GPU instead: give one of the two")
        if self.measure_device not in MEASURE_DEVICES:
            raise RunError(f"unknown --measure-device {self.measure_device!r}; choose {' or '.join(MEASURE_DEVICES)}")
        if self.measure_device == "cuda":
            if self.live is not None:
                raise RunError("--live trains and measures on its own --device: give --measure-device with --trace")
            import torch  # only here: the rest of the check needs no torch

            if not torch.cuda.is_available():
                raise RunError("--measure-device cuda asked for, but this torch sees no CUDA device; drop it to "
                               "measure on this CPU")
        if self.params is not None:
            if self.trace is not None or self.compute_profile:
                raise RunError("--params prices a synthetic model: give it without --trace or --compute-profile")
            self.params_model()  # checks the layer count
        elif self.layers is not None:
            raise RunError("--layers goes with --params (the layer count of that synthetic model)")
        if self.framework not in FRAMEWORKS:
            raise RunError(framework_message(self.framework))
        if self.cycle_ms is not None and (self.framework != "horovod" or not self.cycle_ms >= 0):
            raise RunError("--cycle-ms is Horovod's cycle time (≥ 0): give it with --framework horovod")
        if self.fusion not in FUSIONS:
            raise RunError(fusion_message(self.fusion))
        if self.library is not None:
            get_library(self.library)
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise RunError(f"--bandwidth must be positive (got {self.bandwidth:g})")
        if self.latency is not None and not self.latency >= 0:
            raise RunError(f"--latency must be ≥ 0 (got {self.latency:g})")
        if self.policy not in POLICIES:
            raise RunError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.policy == "paper" and not set(self.compressors) & set(AG_FAMILY + AR_TOPK_FAMILY):
            raise RunError("--policy paper chooses among top-k compressors: add one of "
                           f"{', '.join(AG_FAMILY + AR_TOPK_FAMILY)} to --compressors")
        if not self.dense_steps > 0:
            raise RunError(f"--dense-steps must be positive, got {self.dense_steps:g}")
        if self.hierarchy not in HIERARCHIES:
            raise RunError(hierarchy_message(self.hierarchy))
        if self.engine not in ENGINES:
            raise RunError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        bad = [r for r in (self.density, *self.ratios) if not 0 < r <= 1]
        if bad or not self.ratios:
            raise RunError(f"ratios and --density must lie in (0, 1]; got {bad[0] if bad else 'an empty grid'}")
        if self.bucket_mb is not None and not bucket_mb_ok(self.bucket_mb):
            raise RunError(f"--bucket-mb must be {BUCKET_MB_RANGE}, got {self.bucket_mb:g}")
        if self.weights is not None and (len(self.weights) != 2 or min(self.weights) < 0 or sum(self.weights) <= 0):
            raise RunError("--weights takes two non-negative numbers TIME,ERROR, not both zero (e.g. 1,1)")
        scales = self.compress_scale.values() if isinstance(self.compress_scale, dict) else [self.compress_scale]
        if not all(s > 0 for s in scales):
            raise RunError(f"compress_scale must be positive, got {self.compress_scale}")
        if self.slack is not None and self.policy != "gate":
            raise RunError(f"--slack sets --policy gate's error limit; --policy {self.policy} has none: drop --slack, "
                           "or add --policy gate")
        if self.slack is not None and not self.slack >= 0:
            raise RunError(f"--slack must be ≥ 0, got {self.slack}")


def parse_sharding(value: str) -> tuple[str, ...]:
    """``none,full,hybrid`` → its strategies, each known and given once."""
    names = tuple(s.strip().lower() for s in value.split(",") if s.strip())
    unknown = [s for s in names if s not in STRATEGIES]
    if not names or unknown:
        raise ArcsimError(f"--sharding {value!r}: choose among {', '.join(STRATEGIES)}, joined by commas "
                          "(none: DDP; full: FSDP / ZeRO-3; hybrid: HSDP)")
    return tuple(dict.fromkeys(names))


def check_sharding(strategies: Sequence[str], ranks: int, gpus_per_node: int, nodes: int, where: str,
                   sampled: bool) -> None:
    """Refuse, before any work, what cannot be sharded: a --params sample (its layers are not a model's) and what
    the cluster's nodes cannot do."""
    sharded = [s for s in strategies if s != "none"]
    if not sharded:
        return
    if sampled:
        raise ArcsimError("--sharding full or hybrid needs a model's parameters: give a trace (or --live), not "
                          "--params")
    if ranks < 2:
        raise ArcsimError(f"{where} has one rank: sharding needs at least 2")
    for s in sharded:
        check_fits(s, Quantize(), gpus_per_node, nodes, where)
