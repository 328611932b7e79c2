"""Compression timed on this machine's GPU beside the kernel model's price of the same work (--measure-device cuda).

The measurement (arcsim.run.measure.one_rank_seconds) runs one rank's slice of each bucket through the real
compressor and its error-feedback memory over a SoloComm of the trace's W workers, with CUDA events around it. The
kernel model (arcsim.devices.kernels) prices the compressor's passes and launches for the same buckets, density and
peers on the catalogue GPU this one is. Their ratio is the model's error on this GPU for this trace. Error
feedback's own passes (a sum and a difference over the bucket) are in the measurement and not in the model, so a
ratio under 1 for a compressor with memory is partly theirs: the row says which memory ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from arcsim.devices.catalog import Device, matching
from arcsim.devices.kernels import compress_seconds, kernel_source
from arcsim.run.candidates import Candidate, Context


@dataclass(frozen=True)
class KernelRow:
    compressor: str
    density: float | None
    memory: str
    measured_s: float   # one step's compression, one rank, every bucket measured (CUDA events)
    modelled_s: float   # the kernel model's price of the same buckets on the catalogue GPU

    @property
    def ratio(self) -> float:
        return self.modelled_s / self.measured_s if self.measured_s > 0 else float("nan")


@dataclass(frozen=True)
class KernelCheck:
    device: str                 # the GPU measured on, as torch names it
    model: str                  # the catalogue GPU priced, and whence its counts ("" where none)
    rows: tuple[KernelRow, ...]
    why: str = ""               # no rows: why not

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "model": self.model,
                "rows": [{**asdict(r), "ratio": r.ratio} for r in self.rows], "why": self.why or None}


def kernel_check(cands: list[Candidate], ctx: Context, device_name: str, workers: int) -> KernelCheck:
    """Each flat candidate's measured compression beside the model's, on the catalogue GPU ``device_name`` is (no
    rows, and why, where the catalogue has no such GPU or nothing flat was timed). Buckets a sample left out (their
    times are estimates) are left out of both sides."""
    gpu = matching(device_name)
    if gpu is None:
        return KernelCheck(device_name, "", (), f"the GPU catalogue has no {device_name} to model it on "
                                                "(arcsim device list)")
    rows, seen = [], set()
    for c in cands:
        meas = c.measurement
        if meas is None or c.hierarchy != "flat" or (c.compressor, c.density) in seen or not meas.compress_s:
            continue
        seen.add((c.compressor, c.density))
        buckets = range(len(ctx.buckets)) if meas.sample is None else meas.sample["measured"]
        measured = [meas.compress_s[0][b] for b in buckets]
        if any(t != t for t in measured):  # NaN: this one was not timed (measured by an earlier, modelled run)
            continue
        rows.append(KernelRow(c.compressor, c.density, meas.memory, sum(measured),
                              sum(_modelled(c, ctx, b, gpu, workers) for b in buckets)))
    why = "" if rows else "no compressor was timed across every rank (flat); node-aware runs are not checked"
    return KernelCheck(device_name, f"{gpu.name}, {kernel_source(gpu)}", tuple(rows), why)


def _modelled(c: Candidate, ctx: Context, bucket: int, gpu: Device, workers: int) -> float:
    b = ctx.buckets[bucket]
    return compress_seconds(c.compressor, ctx.scope, b.numel, len(b.layers), gpu, c.density, workers)
