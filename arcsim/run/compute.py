"""Where the compute times come from: the trace's own timings, or a compute profile measured elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arcsim.errors import ArcsimError
from arcsim.traces.format import GradientSource
from arcsim.traces.profile import ComputeProfile, load_profile


@dataclass(frozen=True)
class ComputeTimes:
    forward_s: float
    backward_s: float
    ready_s: np.ndarray     # per trace layer (backward order), from the start of backward
    device: str             # "cpu", "cuda"
    source: str             # for the output: where these numbers were measured
    after_s: float = 0.0    # after the last communication: optimizer step, DDP's copies back (profiles that say)


def from_trace(trace: GradientSource) -> ComputeTimes:
    """Median over the recorded steps of the timings captured with the trace (or measured in live training)."""
    how = "live training" if trace.meta.get("live") else "trace capture"
    return ComputeTimes(float(np.median(trace.forward_s)), float(np.median(trace.backward_s)),
                        np.median(trace.ready_s, axis=0), trace.meta["device"],
                        f"measured in {how} on {trace.meta['device']} ({trace.meta.get('device_name', '?')}), "
                        f"batch {trace.meta['batch_per_worker']} per worker")


def from_profile(path: str | Path, trace: GradientSource) -> ComputeTimes:
    """A compute profile file's timings mapped onto the trace's layer table (names and sizes must agree)."""
    prof = load_profile(path)
    return mapped(prof, trace, str(path), f"profile {Path(path).name}: {prof.device_name}, batch {prof.batch} "
                                          f"({prof.extra.get('precision', 'fp32')})")


def mapped(prof: ComputeProfile, trace: GradientSource, where: str, source: str) -> ComputeTimes:
    """``prof``'s timings on the trace's layer table (names and sizes must agree)."""
    timed = {la.name: la for la in prof.layers}
    for layer in trace.layers:
        row = timed.get(layer.name)
        if row is None or row.numel != layer.numel:
            found = "missing" if row is None else f"{row.numel:,} elements"
            raise ArcsimError(f"compute profile {where} does not match {trace.label}: layer {layer.name} "
                              f"({layer.numel:,} elements) is {found} in the profile; profile the same model "
                              f"({trace.meta['model']})")
    if len(timed) != len(trace.layers):
        raise ArcsimError(f"compute profile {where} has {len(timed)} layers, {trace.label} has "
                          f"{len(trace.layers)}; profile the same model ({trace.meta['model']})")
    ready = np.array([timed[la.name].ready_s for la in trace.layers])
    return ComputeTimes(prof.forward_s, prof.backward_s, ready, prof.device, source, prof.after_backward_s)
