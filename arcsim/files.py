"""Writing files so that no reader ever sees half of one: write beside the final name, then rename; results
tables that grow row by row and survive a kill; and results kept on disk between commands (gzipped JSON
under $ARCSIM_CACHE_DIR, else $XDG_CACHE_HOME/arcsim, else ~/.cache/arcsim; capped at CACHE_CAP_BYTES, the
least recently used dropped first): compressor measurements (arcsim.run.cache) and model workloads
(arcsim.devices.workload) name their own files, and ``arcsim cache info|clear`` sees them all."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that look at it still work); renamed onto
    ``path`` when the block ends, removed if it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_atomic(path: Path, text: str, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``text`` to ``path`` atomically; ``check(tmp)`` may refuse the content before it lands."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
        if check is not None:
            check(tmp)
    return path


class AppendOnlyCSV:
    """A CSV that grows by whole rows, each batch fsynced, so an interrupted run keeps what it finished;
    a row cut off by a kill mid-write is dropped when the file is next opened (``repair``)."""

    def __init__(self, path: Path, columns: Sequence[str], extra: Literal["raise", "ignore"] = "raise") -> None:
        self.path, self.columns, self.extra = Path(path), list(columns), extra

    def repair(self) -> None:
        """Drop a last row without its newline (a write cut off by a kill)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.columns, extrasaction=self.extra)
            if new:
                writer.writeheader()
            writer.writerows(rows)
            fh.flush()
            os.fsync(fh.fileno())


def unwritable_reason(path: Path, directory: bool) -> str | None:
    """Why ``path`` (a file, or a directory when ``directory``) cannot be written, or None if it can.

    Probes for real — creates what is missing and a scratch file, then removes them — so a check made
    before long work leaves nothing behind and catches what permission bits alone do not (/proc, full or
    read-only mounts)."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        return f"{path} is {'a file' if directory else 'a directory'}"
    target = path if directory else path.parent
    missing, d = [], target
    while not d.exists():
        missing.append(d)
        d = d.parent
    if not d.is_dir():
        return f"{d} is not a directory"
    created: list[Path] = []
    try:
        for m in reversed(missing):
            m.mkdir()
            created.append(m)
        with tempfile.NamedTemporaryFile(dir=target):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        for m in reversed(created):
            m.rmdir()
    return None


def read_yaml(path: Path, what: str, error: type[Exception]) -> Any:
    """The YAML document of ``path`` (None when empty); a missing file or bad YAML is one ``error`` line."""
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None


# -- results kept between commands ------------------------------------------------------------------
CACHE_CAP_BYTES = 2 * 2**30
CACHE_SUFFIX = ".json.gz"
TRACE_INDEX = "traces.json"  # trace files' content hashes by (path, size, mtime), beside the cache (run/cache.py)


def cache_dir() -> Path:
    if os.environ.get("ARCSIM_CACHE_DIR"):
        return Path(os.environ["ARCSIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "arcsim"


def cache_key(fields: Mapping[str, Any]) -> str:
    """A cache file's name for what its content depends on (JSON-able ``fields``; others by ``str``)."""
    body = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def cache_read(name: str) -> Any | None:
    """The object kept as ``name``, or None (absent or unreadable); a read marks it recently used."""
    path = cache_dir() / f"{name}{CACHE_SUFFIX}"
    try:
        obj = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError):
        return None
    os.utime(path)
    return obj


def cache_write(name: str, obj: Any) -> None:
    """Keep ``obj`` (JSON-able) as ``name``, then drop the least recently used past CACHE_CAP_BYTES."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / f"{name}{CACHE_SUFFIX}") as tmp:
        tmp.write_bytes(gzip.compress(json.dumps(obj).encode()))
    files = cache_entries()
    total = sum(p.stat().st_size for p in files)
    for path in files:  # oldest first
        if total <= CACHE_CAP_BYTES:
            break
        total -= path.stat().st_size
        path.unlink(missing_ok=True)


def cache_entries() -> list[Path]:
    directory = cache_dir()
    return sorted(directory.glob(f"*{CACHE_SUFFIX}"), key=lambda p: p.stat().st_mtime) if directory.is_dir() else []


def cache_clear() -> tuple[int, int]:
    """Remove everything kept (and the trace-hash index); returns (files, bytes) removed."""
    files = cache_entries()
    size = sum(p.stat().st_size for p in files)
    for path in files:
        path.unlink(missing_ok=True)
    (cache_dir() / TRACE_INDEX).unlink(missing_ok=True)
    return len(files), size
