"""Where a run's compute comes from, decided in one place for `arcsim run` and `arcsim train`.

In order: ``--params`` prices no compute; a GPU that trains live measures it; a ``--compute-profile`` gives
it (compression priced on the named catalogue GPU, else on the GPU the profile was measured on); a
catalogue GPU (``--gpu``, else the topology's) has it modelled by the device model for the run's model,
batch and precision; with no GPU named, or ``cpu``, it is as measured on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arcsim.devices.catalog import Device, device

ComputeKind = Literal["none", "live-gpu", "profile", "modelled", "here"]


@dataclass(frozen=True)
class ComputeSource:
    kind: ComputeKind
    gpu: Device | None        # the catalogue GPU compression (and modelled compute) is priced on
    why_not_modelled: str     # what --batch and --precision cannot shape here ("" when modelled)


def compute_source(gpu: str | None, *, params: bool = False, live_on_gpu: bool = False,
                   profile: str | None = None) -> ComputeSource:
    """``gpu``: --gpu, else the topology's GPU (None when it names none)."""
    catalogue = device(gpu) if gpu is not None and device(gpu).modelled else None
    if params:
        return ComputeSource("none", catalogue, "--params prices no compute")
    if live_on_gpu:
        return ComputeSource("live-gpu", None, "--live --device cuda measures compute on this GPU")
    if profile:
        if gpu is None:
            from arcsim.devices.predict import device_of_profile  # torch: only where a profile is given
            from arcsim.traces.profile import load_profile

            catalogue = device_of_profile(load_profile(profile), profile)
        return ComputeSource("profile", catalogue, "--compute-profile gives the compute")
    if gpu is None:
        return ComputeSource("here", None, "the topology names no GPU, so compute is as measured on this machine "
                                           "(name one with --gpu, e.g. --gpu h100; arcsim device list)")
    if catalogue is None:
        return ComputeSource("here", None, f"--gpu {gpu} takes compute as measured on this machine")
    return ComputeSource("modelled", catalogue, "")
