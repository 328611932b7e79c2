"""Compression on a GPU: passes over memory and kernel launches per compressor, priced by the device.

One bucket of ``numel`` fp32 elements in ``layers`` layers costs

    passes × numel × 4 B / memory bandwidth + (per_layer × layers + fixed) × launch cost

The counts (passes, per_layer, fixed) of each (compressor, scope) are fitted by non-negative least squares
to kernel times measured on a GPU (``benchmarks/gpu_measure.py --parts compress`` → compress_times.json;
``benchmarks/kernel_table.py`` turns that into ``devices/kernels/<device>.json``, with the device and torch
version). A device with its own table is priced from its own counts (measured); any other from the H100's
counts and its own datasheet bandwidth and launch cost (estimated). STAR's and VAR's leader does the
selection, so the leader's time (on every rank's critical path) is the one used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from arcsim.devices.catalog import DEVICE_DIR, Device
from arcsim.errors import ArcsimError

KERNEL_DIR = DEVICE_DIR / "kernels"
ANCHOR = "h100"
SCOPE_FREE = ("dense", "fp16", "bf16", "powersgd")
# adaptive's default inner selector does its kernel work; a bf16 cast moves the bytes an fp16 cast does (estimated)
PRICED_AS = {"adaptive": "topk", "bf16": "fp16"}


@dataclass(frozen=True)
class KernelCounts:
    passes: float      # fp32 passes over the bucket's elements
    per_layer: float   # launches per layer in the bucket
    fixed: float       # launches per call

    def seconds(self, numel: int, layers: int, device: Device) -> float:
        return (self.passes * numel * 4 / device.bandwidth
                + (self.per_layer * layers + self.fixed) * device.launch_us * 1e-6)


def _key(compressor: str, scope: str | None) -> str:
    return compressor if compressor in SCOPE_FREE or scope is None else f"{compressor}/{scope}"


def fit_counts(rows: list[dict], device: Device) -> dict[str, KernelCounts]:
    """Counts per (compressor, scope) from measured rows (numel, layers, compressor, variant, scope, ms);
    a flat vector (one layer) counts for both scopes; STAR's non-leader rows are left out."""
    from scipy.optimize import nnls

    groups: dict[str, list[dict]] = {}
    for r in rows:
        if "other" in (r.get("variant") or ""):
            continue
        scopes = [r["scope"]] if r["scope"] else [None] if r["compressor"] in SCOPE_FREE else ["tensor", "bucket"]
        for scope in scopes:
            groups.setdefault(_key(r["compressor"], scope), []).append(r)
    out = {}
    for key, group in sorted(groups.items()):
        a = np.array([[r["numel"] * 4 / device.bandwidth, r["layers"] * device.launch_us * 1e-6,
                       device.launch_us * 1e-6] for r in group])
        t = np.array([r["ms"] * 1e-3 for r in group])
        weights = 1 / t  # relative error: small buckets count as much as large ones
        x, _ = nnls(a * weights[:, None], t * weights)
        out[key] = KernelCounts(*(float(v) for v in x))
    return out


def table_path(device_name: str) -> Path:
    return KERNEL_DIR / f"{device_name}.json"


@lru_cache(maxsize=16)
def load_counts(device_name: str) -> tuple[dict[str, KernelCounts], dict]:
    data = json.loads(table_path(device_name).read_text())
    return {k: KernelCounts(**v) for k, v in data["counts"].items()}, data


@lru_cache(maxsize=16)
def counts_for(device_name: str) -> tuple[dict[str, KernelCounts], dict, bool]:
    """The table a device is priced from: its own if measured (True), else the anchor's."""
    own = table_path(device_name).exists()
    return (*load_counts(device_name if own else ANCHOR), own)


def compress_seconds(compressor: str, scope: str, numel: int, layers: int, device: Device) -> float:
    """Local compression work of one bucket on ``device``."""
    counts, _, _ = counts_for(device.name)
    key = _key(PRICED_AS.get(compressor, compressor), scope)
    if key not in counts:
        raise ArcsimError(f"no kernel counts for {key} on {device.name}; rerun benchmarks/gpu_measure.py --parts "
                          "compress on a GPU and benchmarks/kernel_table.py")
    return counts[key].seconds(numel, layers, device)


def kernel_source(device: Device) -> str:
    """Where ``device``'s compression counts come from, for the output."""
    _, data, own = counts_for(device.name)
    if own:
        return f"measured on {data['device_name']} (torch {data['torch']})"
    return f"estimated: {data['device_name']}'s counts priced by {device.name}'s datasheet bandwidth and launch cost"
