"""Compressor measurements on disk (arcsim.files), so a trace re-priced on another topology, library,
GPU or engine only prices: one file per (trace content, bucket layout, compressor, density, memory, seed,
options, steps, timing, the device measured on). A trace's content is named by its zip directory's checksums
(:func:`trace_hash`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arcsim.comm.log import CommRecord
from arcsim.compressors.grouping import Grouping
from arcsim.files import CACHE_SUFFIX, cache_key, cache_read, cache_write, results_dir
from arcsim.run.layer_sample import LayerSample
from arcsim.run.measurement import Measurement
from arcsim.run.sampling import BucketSample
from arcsim.strategy.buckets import Bucket
from arcsim.traces.format import GRADIENTS_MEMBER, TraceError

VERSION = 5  # bump when what a measurement holds changes (or, up to ties, how it is measured); 4: node-aware
#             slices cut at row boundaries (their measurements from before are of other slices); 5: a layer
#             sample's error terms weighted layer by layer, and its groups' sums with the exact part


def trace_hash(path: Path) -> str:
    """The trace's content identity: SHA-256 over each member's name, size and CRC-32 as its zip directory holds
    them and over the bytes of every member but the gradients (a few kB) — the gradients' CRC checked against their
    bytes when open_trace first opens the file — so no second read of a many-gigabyte file (a SHA-256 of LLaMA-1B's
    5.4 GB took 2 s of a cold run's wall time). Two traces whose gradients differ share it with odds of 2⁻³²."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(path) as zf:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                digest.update(json.dumps([info.filename, info.file_size, info.CRC]).encode())
                if info.filename != GRADIENTS_MEMBER:
                    digest.update(zf.read(info))
    except (OSError, zipfile.BadZipFile) as exc:
        raise TraceError(f"{path}: the trace changed or went while it was read ({exc}); run again") from None
    return digest.hexdigest()


def key(trace: str, buckets: list[Bucket], compressor: str, density: float, memory: str | None, seed: int,
        options: Mapping[str, Any], steps: int, timed: bool, grouping: Grouping | None = None,
        sample: BucketSample | None = None, device: str = "cpu", layers: LayerSample | None = None) -> str:
    fields = {"v": VERSION, "trace": trace, "buckets": [(b.lo, b.hi) for b in buckets], "compressor": compressor,
              "density": density, "memory": memory, "seed": seed, "options": dict(sorted(options.items())),
              "steps": steps, "timed": timed}
    if grouping is not None:  # flat keys stay as they were: measurements already cached are still found
        fields["grouping"] = dataclasses.astuple(grouping)
    if sample is not None:  # a sample of the buckets (exact keys stay as they were)
        fields["sample"] = list(sample.measured)
    if layers is not None:  # a sample of every layer
        fields["layers"] = layers.signature
    if device != "cpu":  # timed on a GPU (CPU keys stay as they were)
        fields["device"] = device
    return cache_key(fields)


def held(name: str) -> bool:
    """Whether the cache holds a measurement named ``name`` (without reading it)."""
    return (results_dir() / f"{name}{CACHE_SUFFIX}").is_file()


def load(name: str) -> Measurement | None:
    """The measurement kept as ``name``, or None: absent, or of another shape (a damaged entry is a miss)."""
    raw = cache_read(name)
    if not isinstance(raw, dict):
        return None
    try:
        raw["records"] = [[[CommRecord(**r) for r in recs] for recs in step] for step in raw["records"]]
        return Measurement(**raw)
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def save(name: str, meas: Measurement) -> None:
    cache_write(name, dataclasses.asdict(meas))
