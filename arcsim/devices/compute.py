"""Forward, backward and per-parameter gradient-ready times of a zoo model on a catalogue GPU, without one.

Each counted operation (:mod:`arcsim.models.workload`) costs

    max(FLOPs / (peak of its class × e_class), bytes / (memory bandwidth × e_memory), host)

— a roofline per operation class with efficiencies ``e`` fitted to measured profiles, and ``host`` the
per-operation floor of eager PyTorch (the work that issues a kernel, which the GPU cannot beat when its
kernels are small): in forward, Python and the dispatcher issue each operation; in backward, autograd's
engine (C++, no Python) does; a convolution costs the host more (cuDNN's per-call work). bf16 or fp16
(autocast) runs the tensor-core classes at that format's peak and moves half the bytes (fp16 at bf16's fitted
efficiencies: no profile is fp16); each tensor-core operation also costs the host a cast (its fp32 operands
to 16 bits in forward, its gradients back to fp32 in backward), priced at what a cast costs, not at the price of
another operation. A parameter's gradient is ready when the backward operations before its accumulation are
done; each ready gradient then costs the host its hook: DDP's (C++, a few µs) in a prediction, and in a shipped
profile the profiler's (a Python hook that records a CUDA event per parameter), measured from the profiles' own
per-parameter timelines so that the fit cannot move it into the per-operation cost a DDP job would keep.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from pathlib import Path

import numpy as np

from arcsim.devices.catalog import DEVICE_DIR, HALF, Device
from arcsim.models.operations import OP_CLASSES, Workload
from arcsim.models.workload import count_workload
from arcsim.traces.profile import PROFILE_DIR, ComputeProfile, LayerTiming, load_profile

FIT_FILE = DEVICE_DIR / "efficiency.json"


TENSOR_CLASSES = ("conv", "matmul", "attention")
_CONV, _MEMORY = OP_CLASSES.index("conv"), OP_CLASSES.index("memory")


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the datasheet peaks reached, per (operation class, precision), and the host's costs (in the
    machine's launch costs: one tiny kernel issued from Python)."""

    tensor: dict[str, float]   # "conv/tf32", "matmul/fp32", "matmul/bf16", …: fraction of those units' peak
    memory: float              # fraction of the memory bandwidth reached
    host: float                # host time to issue one forward operation (eager PyTorch, from Python)
    autograd: float            # host time to issue one backward operation (autograd's engine)
    hook: float                # host time per gradient-ready hook of a profiler that records a CUDA event per
    #                            parameter (how the shipped profiles were taken); measured, not fitted
    cast: float = 1.0          # host time of autocast's casts for one tensor-core operation in forward
    cast_backward: float = 1.0  # … and of casting its gradients back to fp32 in backward
    conv_host: float = 1.0     # a convolution's host cost relative to another operation's (cuDNN's per-call work)

    def of(self, cls: str, units: str) -> float:
        """Efficiency of ``cls`` on ``units``; a pair no profile showed (a convolution on fp32 units, where a
        GPU lacks TF32) takes the fp32 matrix products' (CUDA cores either way). fp16 takes bf16's: no profile is
        fp16, and both are 16-bit tensor-core formats that autocast runs through the same kernels (cuBLAS, cuDNN)
        at the same datasheet peak on every GPU that has both (A100 312 / 312, H100 989 / 989 TFLOP/s)."""
        return self.tensor.get(f"{cls}/{'bf16' if units == 'fp16' else units}", self.tensor["matmul/fp32"])

    def vector(self) -> np.ndarray:
        """The fitted values, log-scaled (the hook is measured, not fitted)."""
        return np.log([*(self.tensor[k] for k in _TENSOR_KEYS), *(getattr(self, k) for k in _FITTED)])

    @classmethod
    def from_vector(cls, v: np.ndarray, hook: float) -> Efficiency:
        x = np.exp(v)
        n = len(_TENSOR_KEYS)
        return cls(dict(zip(_TENSOR_KEYS, map(float, x[:n]), strict=True)), hook=hook,
                   **{k: float(val) for k, val in zip(_FITTED, x[n:], strict=True)})

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "memory": self.memory, "host": self.host, "autograd": self.autograd,
                "hook": self.hook, "cast": self.cast, "cast_backward": self.cast_backward, "conv_host": self.conv_host}


_TENSOR_KEYS = ("conv/tf32", "conv/bf16", "matmul/fp32", "matmul/bf16", "attention/fp32", "attention/bf16")
_FITTED = ("memory", "host", "autograd", "cast", "cast_backward", "conv_host")
# DDP's per-parameter autograd hook (C++: marks the gradient ready and copies it into its bucket), in launch
# costs: estimated, a few µs; a prediction prices it instead of the profiler's Python hook (Efficiency.hook)
DDP_HOOK = 0.3
# the fit's bounds, in launch costs (memory: a fraction): the measured launch cost (one tiny kernel issued from
# Python) is the floor of a forward operation; autograd's engine issues from C++, and may beat it
BOUNDS = {"memory": (1e-3, 1.0), "host": (1.0, 20.0), "autograd": (0.25, 20.0), "cast": (1e-3, 20.0),
          "cast_backward": (1e-3, 20.0), "conv_host": (0.5, 5.0)}
# a gap between two gradients' events shorter than this (launch costs) was paced by the GPU, not by the host
HOST_PACED_GAP = 1.0


def device_seconds(flops: np.ndarray, nbytes: np.ndarray, classes: np.ndarray, device: Device, precision: str,
                   eff: Efficiency) -> np.ndarray:
    """The GPU's time for each operation: the slower of its compute and its memory traffic (``classes``
    index OP_CLASSES)."""
    rate = np.array([device.peak(c, precision) * eff.of(c, device.units(c, precision)) if c in TENSOR_CLASSES
                     else np.inf for c in OP_CLASSES])
    scale = 0.5 if precision in HALF else 1.0
    return np.maximum(flops / rate[classes], nbytes * scale / (device.bandwidth * eff.memory))


def issue_seconds(work: Workload, phase: str, device: Device, precision: str, eff: Efficiency) -> np.ndarray:
    """The host's time to issue each operation of ``phase``: ``host`` (forward) or ``autograd`` (backward) launch
    costs, ``conv_host`` times that for a convolution, plus under bf16 autocast a tensor-core operation's casts."""
    _, _, classes = work.arrays(phase)
    backward = phase == "backward"
    per_op = (eff.autograd if backward else eff.host) * np.where(classes == _CONV, eff.conv_host, 1.0)
    tensor = classes != _MEMORY
    casts = np.where(tensor, eff.cast_backward if backward else eff.cast, 0.0) if precision in HALF else 0.0
    return (per_op + casts) * device.launch_us * 1e-6


def finish_times(work: Workload, phase: str, device: Device, precision: str, eff: Efficiency,
                 instrumented: bool = False) -> np.ndarray:
    """When each operation of ``phase`` ends, counted from the phase's start.

    The host issues the operations (:func:`issue_seconds`) plus, in backward, a hook for each gradient that
    becomes ready: DDP's (``DDP_HOOK``), or where ``instrumented`` (a profile timed with a CUDA event per
    parameter, as the shipped ones were) the profiler's ``hook``; the GPU runs them in order as they arrive.
    The machine's launch cost (the catalogue's ``launch_us``, measured) carries the host's speed from one
    machine to another. free_i = max(free_{i−1}, issued_i) + d_i is a max-plus scan:
    free_i = S_i + max_{j≤i}(issued_j − S_{j−1}) with S the running sum of the device times d."""
    flops, nbytes, classes = work.arrays(phase)
    if not flops.size:
        return np.zeros(0)
    hook = eff.hook if instrumented else DDP_HOOK
    after = hook * device.launch_us * 1e-6 * backward_hooks(work) if phase == "backward" else np.zeros(flops.size)
    issued = np.cumsum(issue_seconds(work, phase, device, precision, eff)) + \
        np.concatenate([[0.0], np.cumsum(after)[:-1]])
    d = device_seconds(flops, nbytes, classes, device, precision, eff)
    total = np.cumsum(d)
    return total + np.maximum.accumulate(issued - (total - d))


def backward_hooks(work: Workload) -> np.ndarray:
    """How many parameters become ready right after each backward operation."""
    hooks = np.zeros(len(work.backward))
    for after in work.ready_after.values():
        hooks[max(after - 1, 0)] += 1
    return hooks


def phase_seconds(work: Workload, phase: str, device: Device, precision: str, eff: Efficiency,
                  instrumented: bool = False) -> float:
    ends = finish_times(work, phase, device, precision, eff, instrumented)
    return float(ends[-1]) if ends.size else 0.0


def modelled_profile(work: Workload, device: Device, precision: str, eff: Efficiency,
                     instrumented: bool = False) -> ComputeProfile:
    """What a DDP job sees (its own hooks priced), or with ``instrumented`` what a profile taken with a CUDA
    event per parameter (arcsim trace profile) would measure."""
    device.check_precision(precision)
    bwd = finish_times(work, "backward", device, precision, eff, instrumented)
    ready = {n: float(bwd[i - 1]) if i > 0 else 0.0 for n, i in work.ready_after.items()}
    layers = [LayerTiming(n, work.numel[n], ready[n]) for n in work.order]
    return ComputeProfile(work.model, work.batch, "model", device.full_name,
                          phase_seconds(work, "forward", device, precision, eff), float(bwd[-1]) if bwd.size else 0.0,
                          layers, "modelled", 0, extra={"precision": precision, "input_shape": list(work.input_shape)})


# -- measured profiles and the fit ------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    path: Path
    model: str
    device: str          # catalogue name
    batch: int
    precision: str
    forward_s: float
    backward_s: float
    dataset: str | None
    input_size: int | None
    instrumented: bool = True   # timed by ComputeTimer: a Python hook recording a CUDA event per parameter

    def workload(self) -> Workload:
        return count_workload(self.model, self.batch, self.dataset, self.input_size)


@lru_cache(maxsize=16)
def measured_profiles(device_name: str) -> tuple[Measured, ...]:
    """The shipped profiles measured on ``device_name`` (file names <model>-<device>-b<batch>-<precision>.json)."""
    out = []
    for path in sorted(PROFILE_DIR.glob(f"*-{device_name}-b*-*.json")):
        prof = load_profile(path)
        precision = next((h for h in HALF if str(prof.extra.get("precision", "")).startswith(h)), "fp32")
        shape = prof.extra.get("input_shape") or []
        size = int(shape[-1]) if len(shape) == 3 else (int(shape[0]) if prof.extra.get("dataset") == "synthetic-tokens"
                                                        else None)
        out.append(Measured(path, prof.model, device_name, prof.batch, precision, prof.forward_s, prof.backward_s,
                            prof.extra.get("dataset"), size))
    return tuple(out)


def find_measured(model: str, device_name: str, batch: int, precision: str) -> Measured | None:
    for m in measured_profiles(device_name):
        if (m.model, m.batch, m.precision) == (model, batch, precision):
            return m
    return None


def _residuals(v: np.ndarray, cases: Sequence[Measured], device: Device, hook: float) -> np.ndarray:
    eff = Efficiency.from_vector(v, hook)
    out = []
    for m in cases:
        w = m.workload()
        for phase, measured in (("forward", m.forward_s), ("backward", m.backward_s)):
            out.append(math.log(phase_seconds(w, phase, device, m.precision, eff, m.instrumented) / measured))
    return np.array(out)


@lru_cache(maxsize=256)
def same_op_gaps(m: Measured) -> tuple[float, ...]:
    """Gaps (s) between the events of gradients that become ready after the same backward operation: nothing
    between them but the profiler's hook, the gradient's accumulation and, under bf16, its cast back to fp32.
    The first quarter is left out (the host may still be ahead of the GPU there)."""
    w = m.workload()
    ready = {layer.name: layer.ready_s for layer in load_profile(m.path).layers}
    names = [n for n in w.order if n in ready]
    groups: dict[int, list[float]] = {}
    for n in names[len(names) // 4:]:
        groups.setdefault(w.ready_after[n], []).append(ready[n])
    times = [sorted(ts) for ts in groups.values()]
    return tuple(b - a for ts in times for a, b in pairwise(ts))


def host_paced_gaps(cases: Sequence[Measured], device: Device) -> list[float]:
    """:func:`same_op_gaps` in launch costs, where the host paced them (in a GPU-paced stretch they are a
    fraction of a launch)."""
    launch = device.launch_us * 1e-6
    return [g / launch for m in cases for g in same_op_gaps(m) if g / launch >= HOST_PACED_GAP]


def profiler_hook(cases: Sequence[Measured], device: Device) -> float:
    """The profiler's per-parameter cost in launch costs, measured from the fp32 profiles' own timelines: the
    median host-paced gap between two gradients ready after the same operation."""
    paced = host_paced_gaps([m for m in cases if m.precision == "fp32"], device)
    return float(np.median(paced)) if paced else 1.0


def fit(cases: Sequence[Measured], device: Device, start: Efficiency | None = None,
        hook: float | None = None) -> Efficiency:
    """Efficiencies minimising the squared log error of forward and backward times over ``cases``; the
    profiler's hook is measured from their timelines (:func:`profiler_hook`) unless given."""
    from scipy.optimize import least_squares

    hook = profiler_hook(cases, device) if hook is None else hook
    x0 = (start or Efficiency(dict.fromkeys(_TENSOR_KEYS, 0.5), 0.5, 2.0, 1.0, hook)).vector()
    n = len(_TENSOR_KEYS)
    lower = np.log([1e-3] * n + [BOUNDS[k][0] for k in _FITTED])
    upper = np.log([1.0] * n + [BOUNDS[k][1] for k in _FITTED])
    result = least_squares(_residuals, np.clip(x0, lower + 1e-9, upper - 1e-9), bounds=(lower, upper),
                           args=(cases, device, hook))
    return Efficiency.from_vector(result.x, hook)


def step_error(m: Measured, device: Device, eff: Efficiency) -> float:
    """Relative error of the modelled forward + backward time against the measured one."""
    w = m.workload()
    pred = sum(phase_seconds(w, phase, device, m.precision, eff, m.instrumented) for phase in ("forward", "backward"))
    return float(pred / (m.forward_s + m.backward_s) - 1)


@lru_cache(maxsize=1)
def load_fit() -> tuple[Efficiency, dict]:
    """The committed efficiencies (benchmarks/device_fit.py writes them) and what the fit measured."""
    data = json.loads(FIT_FILE.read_text())
    return Efficiency(**data["efficiency"]), data
