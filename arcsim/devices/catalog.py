"""The device catalogue: one YAML file per accelerator under ``arcsim/data/devices/`` (datasheet peaks, memory
bandwidth and size, kernel-launch cost, and where each number comes from)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from arcsim.errors import ArcsimError
from arcsim.files import packaged

DEVICE_DIR = packaged("devices")
PRECISIONS = ("fp32", "bf16", "fp16")  # fp16: mixed precision on the fp16 tensor cores (V100 has no bf16)
CPU = "cpu"
HALF = ("bf16", "fp16")  # 16-bit precisions: tensor cores at that peak, half the bytes


@dataclass(frozen=True)
class Device:
    name: str
    full_name: str
    peak_tflops: dict[str, float]   # dense peak per number format: fp32, tf32, bf16, fp16
    memory_bandwidth_GBps: float
    memory_GB: float
    launch_us: float
    source: str
    launch_source: str

    @property
    def modelled(self) -> bool:
        """False for ``cpu``: what runs here is measured, not modelled."""
        return self.name != CPU

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.memory_bandwidth_GBps * 1e9

    @property
    def capacity_bytes(self) -> float:
        """Memory in bytes (the datasheet's GB, 10^9 B): what a strategy's memory per GPU must fit in."""
        return self.memory_GB * 1e9

    def check_precision(self, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ArcsimError(f"unknown precision {precision!r}; choose {', '.join(PRECISIONS)}")
        if precision not in self.peak_tflops:
            raise ArcsimError(f"{self.name} ({self.full_name}) has no {precision} units; use --precision fp32")

    def units(self, op_class: str, precision: str) -> str:
        """The number format an operation of ``op_class`` runs in, as PyTorch runs it by default: bf16 or fp16 on
        those tensor cores; fp32 convolutions on TF32 (cuDNN's default) where the device has it, fp32 matrix
        products at the fp32 rate (torch's default matmul precision, "highest")."""
        self.check_precision(precision)
        if precision in HALF:
            return precision
        return "tf32" if op_class == "conv" and "tf32" in self.peak_tflops else "fp32"

    def peak(self, op_class: str, precision: str) -> float:
        """FLOP/s of the units an ``op_class`` operation runs on in ``precision``."""
        return self.peak_tflops[self.units(op_class, precision)] * 1e12

    def to_dict(self) -> dict:
        return {"name": self.name, "full_name": self.full_name, "peak_tflops": self.peak_tflops,
                "memory_bandwidth_GBps": self.memory_bandwidth_GBps, "memory_GB": self.memory_GB,
                "launch_us": self.launch_us, "source": self.source, "launch_source": self.launch_source}


@lru_cache(maxsize=1)
def devices() -> dict[str, Device]:
    out = {}
    for path in sorted(DEVICE_DIR.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        out[raw["name"]] = Device(raw["name"], raw["full_name"], {k: float(v) for k, v in raw["peak_tflops"].items()},
                                  float(raw["memory_bandwidth_GBps"]), float(raw["memory_GB"]),
                                  float(raw["launch_us"]), raw["source"], raw["launch_source"])
    if not out:
        raise ArcsimError(f"the GPU catalogue is missing from the package ({DEVICE_DIR}); reinstall arcsim")
    return out


def priced_gpu(gpu: str | None, topology_gpu: str | None) -> str | None:
    """The GPU a step's compute and compression are priced on: ``--gpu``, else the topology's GPU (None when neither
    names one; "cpu": as measured on this machine). Every command asks here."""
    return gpu or topology_gpu


def device(name: str) -> Device:
    """A catalogue device by name (case-insensitive), or one error line listing them."""
    found = devices().get(name.lower())
    if found is None:
        raise ArcsimError(f"unknown GPU {name!r}; choose one of: {', '.join(devices())} (arcsim device list)")
    return found


def modelled_device(gpu: str, precision: str, batch: int) -> Device:
    """The catalogue GPU a prediction is asked for, after the checks that need no model: one error line each."""
    dev = device(gpu)
    if not dev.modelled:
        raise ArcsimError("cpu is measured, not modelled: compute comes from the trace's capture here "
                          "(or arcsim trace profile); choose a GPU for a prediction")
    dev.check_precision(precision)
    if batch < 1:
        raise ArcsimError(f"--batch is per GPU and at least 1, got {batch}")
    return dev


def matching(torch_name: str) -> Device | None:
    """The catalogue GPU a torch device name is (e.g. "NVIDIA H100 80GB HBM3" → h100), or None."""
    squeezed = torch_name.lower().replace(" ", "").replace("-", "")
    found = [d for name, d in devices().items() if name != "cpu" and name in squeezed]
    return max(found, key=lambda d: len(d.name)) if found else None
