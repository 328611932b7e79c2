"""Compressor measurements on disk, so a trace re-priced on another topology, library, GPU or engine only
prices: one gzipped JSON file per (trace content, bucket layout, compressor, density, memory, seed,
options, steps, timing), under $ARCSIM_CACHE_DIR, else $XDG_CACHE_HOME/arcsim, else ~/.cache/arcsim.

A trace's content hash is computed once per (path, size, modification time) and remembered. The cache is
capped at CAP_BYTES: the least recently used files go first. ``arcsim cache info|clear``.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arcsim.comm.log import CommRecord
from arcsim.files import atomic_path, write_atomic
from arcsim.run.buckets import Bucket
from arcsim.run.measure import Measurement

CAP_BYTES = 2 * 2**30
VERSION = 2  # bump when what a measurement holds changes


def cache_dir() -> Path:
    if os.environ.get("ARCSIM_CACHE_DIR"):
        return Path(os.environ["ARCSIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "arcsim"


def trace_hash(path: Path) -> str:
    """SHA-256 of the trace file's bytes, remembered per (path, size, mtime) in the cache's index."""
    path = path.resolve()
    stat = path.stat()
    index_path = cache_dir() / "traces.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    stamp = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    if stamp not in index:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(2**22), b""):
                digest.update(block)
        index[stamp] = digest.hexdigest()
        index_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(index_path, json.dumps(index))
    return str(index[stamp])


def key(trace: str, buckets: list[Bucket], compressor: str, density: float, memory: str | None, seed: int,
        options: Mapping[str, Any], steps: int, timed: bool) -> str:
    body = json.dumps({"v": VERSION, "trace": trace, "buckets": [(b.lo, b.hi) for b in buckets],
                       "compressor": compressor, "density": density, "memory": memory, "seed": seed,
                       "options": dict(sorted(options.items())), "steps": steps, "timed": timed},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def load(name: str) -> Measurement | None:
    path = cache_dir() / f"{name}.json.gz"
    try:
        raw = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    os.utime(path)  # recently used: evicted last
    raw["records"] = [[[CommRecord(**r) for r in recs] for recs in step] for step in raw["records"]]
    return Measurement(**raw)


def save(name: str, meas: Measurement) -> None:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / f"{name}.json.gz") as tmp:
        tmp.write_bytes(gzip.compress(json.dumps(dataclasses.asdict(meas)).encode()))
    _evict(directory)


def entries() -> list[Path]:
    directory = cache_dir()
    return sorted(directory.glob("*.json.gz"), key=lambda p: p.stat().st_mtime) if directory.is_dir() else []


def _evict(directory: Path) -> None:
    files = entries()
    total = sum(p.stat().st_size for p in files)
    for path in files:  # oldest first
        if total <= CAP_BYTES:
            break
        total -= path.stat().st_size
        path.unlink(missing_ok=True)


def clear() -> tuple[int, int]:
    """Remove every cached measurement and the trace index; returns (files, bytes) removed."""
    files = entries()
    size = sum(p.stat().st_size for p in files)
    for path in files:
        path.unlink(missing_ok=True)
    (cache_dir() / "traces.json").unlink(missing_ok=True)
    return len(files), size
