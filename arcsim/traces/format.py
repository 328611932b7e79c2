"""The trace file: an uncompressed .npz written and read one step at a time (docs/trace-format.md).

Members (all plain .npy, no pickles):
  metadata.npy     uint8 — UTF-8 JSON object (schema_version, model, dataset, workers, …)
  layers.npy       uint8 — UTF-8 JSON list of {name, shape, numel, offset}, in backward order
  gradients.npy    [steps, workers, d] float16 | float32 — per-worker gradients, flat in layer order
  loss.npy         [steps] float64 — training loss (mean over workers) at each recorded step
  worker_loss.npy  [steps, workers] float64
  forward_s.npy    [steps] float64 — forward time on the capture device
  backward_s.npy   [steps] float64 — backward time
  ready_s.npy      [steps, layers] float64 — when each layer's gradient was ready, from backward start
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import threading
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.files import atomic_path, file_stamp, known_file_fact, remember_file_fact

if TYPE_CHECKING:  # torch loads where gradients are read or written: a trace's metadata and layers are read without it
    import torch

SCHEMA_VERSION = 1
DTYPES = {"fp16": np.float16, "fp32": np.float32}
REQUIRED_META = ("schema_version", "model", "dataset", "synthetic_data", "params", "batch_per_worker", "workers",
                 "steps", "recorded_steps", "dtype", "device", "torch_version", "seed", "command")
# what each metadata field must hold: a whole number ≥ the bound, a string, a flag, or a list of step numbers
META_TYPES: dict[str, tuple[str, int]] = {
    "schema_version": ("count", 1), "params": ("count", 1), "batch_per_worker": ("count", 0),
    "workers": ("count", 1), "steps": ("count", 1), "seed": ("count", 0), "recorded_steps": ("steps", 0),
    "model": ("text", 0), "dataset": ("text", 0), "dtype": ("text", 0), "device": ("text", 0),
    "torch_version": ("text", 0), "command": ("text", 0), "synthetic_data": ("flag", 0),
    "device_name": ("text", 0), "dataset_description": ("text", 0)}
SMALL_MEMBERS = {"loss": 1, "worker_loss": 2, "forward_s": 1, "backward_s": 1, "ready_s": 2}


class TraceError(ArcsimError):
    """A trace file that is missing, corrupt or inconsistent."""


GRADIENTS_MEMBER = "gradients.npy"  # the zip member holding every step's gradients


def as_torch_dtype(name: str) -> torch.dtype:
    """A trace's dtype (fp16, fp32) as torch holds it (torch loads here: a trace's metadata is read without it)."""
    import torch

    return {"fp16": torch.float16, "fp32": torch.float32}[name]


def _json_member(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, indent=1).encode(), dtype=np.uint8)


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


WRITE_ELEMENTS = 1 << 24  # a recorded step is checked and written in pieces of this many elements


class TraceWriter:
    """Stream a trace to disk: ``with TraceWriter(...) as w: w.write_step(...)``.

    Everything goes to a hidden temporary file beside the target, renamed into place only when all
    steps were written; an exception or Ctrl-C removes it, so no half-written trace is ever left.
    """

    def __init__(self, path: Path, meta: dict[str, Any], layers: tuple[Layer, ...], dtype: str) -> None:
        self.path, self.meta, self.layers = Path(path), dict(meta), layers
        self.dtype, self.stored = np.dtype(DTYPES[dtype]), as_torch_dtype(dtype)
        self.steps, self.workers = int(meta["steps"]), int(meta["workers"])
        self.elements = sum(layer.numel for layer in layers)
        self.written = 0
        self.small: dict[str, list[Any]] = {name: [] for name in SMALL_MEMBERS}

    def __enter__(self) -> TraceWriter:
        self.place = atomic_path(self.path)  # renamed into place at the end, or streamed to a pipe or device
        self.tmp = self.place.__enter__()
        # opened here, write-only: given a path, zipfile first tries read-write, and that passing open of a pipe
        # is a writer its reader can take for the whole stream (it then reads nothing, and the real one waits)
        self.file = open(self.tmp, "wb")  # closed in __exit__
        self.zip = zipfile.ZipFile(self.file, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self.member = self.zip.open(GRADIENTS_MEMBER, "w", force_zip64=True)
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.steps, self.workers, self.elements)}
        np.lib.format.write_array_header_1_0(self.member, header)
        return self

    def write_step(self, grads: torch.Tensor | Sequence[torch.Tensor], worker_loss: list[float], forward_s: float,
                   backward_s: float, ready_s: list[float]) -> None:
        """Append one recorded step: grads [workers, d] in layer order, or one [d] row per worker (any float
        dtype, any device)."""
        import torch

        if self.written >= self.steps:
            raise TraceError(f"trace declared {self.steps} steps; cannot write another")
        shapes = {tuple(row.shape) for row in grads}
        if len(grads) != self.workers or shapes != {(self.elements,)}:
            raise TraceError(f"step gradients are {len(grads)} rows of {sorted(shapes)}, expected {self.workers} "
                             f"of ({self.elements},)")
        for worker, row in enumerate(grads):  # a piece at a time: no whole copy beside the step
            row = row.detach()
            for lo in range(0, self.elements, WRITE_ELEMENTS):
                out = row[lo:lo + WRITE_ELEMENTS].to("cpu", self.stored)
                if not bool(torch.isfinite(out).all()):
                    source_finite = bool(torch.isfinite(row[lo:lo + WRITE_ELEMENTS]).all())
                    hint = (" (too large for fp16: capture with --dtype fp32)" if source_finite else
                            " (too large for fp16, or diverged: capture with --dtype fp32 to tell)"
                            if row.dtype == torch.float16 else "")
                    raise TraceError(f"gradient of worker {worker} at recorded step {self.written} is not finite"
                                     f"{hint}; lower --lr or check the model")
                self.member.write(memoryview(out.contiguous().numpy()).cast("B"))
        self.small["worker_loss"].append(worker_loss)
        self.small["loss"].append(float(np.mean(worker_loss)))
        self.small["forward_s"].append(forward_s)
        self.small["backward_s"].append(backward_s)
        self.small["ready_s"].append(ready_s)
        self.written += 1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None and self.written != self.steps:
                raise TraceError(f"only {self.written} of {self.steps} steps were written")
            self.member.close()
            if exc_type is None:
                for name in SMALL_MEMBERS:
                    self.zip.writestr(f"{name}.npy", _npy_bytes(np.asarray(self.small[name], dtype=np.float64)))
                layers = [{"name": la.name, "shape": list(la.shape), "numel": la.numel, "offset": la.offset}
                          for la in self.layers]
                self.zip.writestr("layers.npy", _npy_bytes(_json_member(layers)))
                self.zip.writestr("metadata.npy", _npy_bytes(_json_member(self.meta)))
            self.zip.close()
            self.file.close()
        except BaseException as failed:
            self._let_go()
            self.place.__exit__(type(failed), failed, failed.__traceback__)  # the partial file removed
            raise
        self.place.__exit__(exc_type, exc, tb)

    def _let_go(self) -> None:
        """After a failed write (a full disk): close the half-written file without finishing the zip, which
        would fail again, later, in the garbage collector's hands ('Exception ignored …')."""
        self.zip.fp = None  # a zip without a file has nothing left to finish
        with contextlib.suppress(OSError):  # flushing what the disk had no room for
            self.file.close()


class GradientSource(Protocol):
    """What `arcsim run` reads gradients and timings from: a trace file (:class:`Trace`) or live training
    (:class:`arcsim.traces.live.LiveSource`)."""

    path: Path
    meta: dict[str, Any]
    layers: tuple[Layer, ...]
    forward_s: np.ndarray
    backward_s: np.ndarray
    ready_s: np.ndarray

    @property
    def label(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def elements(self) -> int: ...
    def steps_iter(self) -> Iterator[tuple[int, torch.Tensor]]: ...


@dataclass
class Trace:
    """An opened, validated trace. Gradients stay on disk; ``steps_iter()`` reads one step at a time."""

    path: Path
    meta: dict[str, Any]
    layers: tuple[Layer, ...]
    dtype: np.dtype
    loss: np.ndarray
    worker_loss: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    ready_s: np.ndarray
    _data_offset: int | None  # where gradient bytes start in the file (stored members), else None
    # the gradients' CRC-32 being checked beside the caller's work (open_trace(check_later=True)); None: checked
    _checking: _Checksum | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"trace {self.path.name}"

    def check_intact(self) -> None:
        """Wait for the checksum open_trace(check_later=True) began, and refuse the trace where it failed (at every
        call); nothing where it is checked. Every read of the gradients calls it first."""
        checking = self._checking
        if checking is not None:
            if not checking.result():
                raise TraceError(damaged(self.path))
            self._checking = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickled for another process) of a checked trace: the check's thread does not travel."""
        self.check_intact()
        return {**self.__dict__, "_checking": None}

    @property
    def steps(self) -> int:
        return int(self.meta["steps"])

    @property
    def workers(self) -> int:
        return int(self.meta["workers"])

    @property
    def elements(self) -> int:
        return sum(layer.numel for layer in self.layers)

    @property
    def recorded_steps(self) -> list[int]:
        return [int(s) for s in self.meta["recorded_steps"]]

    def step_bytes(self) -> int:
        """One step's gradients as stored: every worker's."""
        return self.workers * self.elements * self.dtype.itemsize

    def _read_into(self, fh: Any, out: torch.Tensor) -> None:
        view = memoryview(out.numpy().data).cast("B")
        got = fh.readinto(view)
        while got < len(view):  # zip streams may return short reads
            more = fh.readinto(view[got:])
            if not more:
                raise TraceError(f"{self.path} ends inside the gradients (truncated); capture it again")
            got += more

    def _raw_steps(self, start: int, stop: int) -> Iterator[torch.Tensor]:
        """Steps as stored (fp16/fp32), each read straight into a fresh tensor: no intermediate copies."""
        import torch

        self.check_intact()
        dtype = self.torch_dtype
        if self._data_offset is not None:
            with open(self.path, "rb", buffering=0) as fh:
                fh.seek(self._data_offset + start * self.step_bytes())
                for _ in range(start, stop):
                    out = torch.empty(self.workers, self.elements, dtype=dtype)
                    self._read_into(fh, out)
                    yield out
            return
        with zipfile.ZipFile(self.path) as zf, zf.open(GRADIENTS_MEMBER) as fh:  # compressed member: sequential
            _read_npy_header(fh)
            for i in range(stop):
                out = torch.empty(self.workers, self.elements, dtype=dtype)
                self._read_into(fh, out)
                if i >= start:
                    yield out

    def steps_iter(self, start: int = 0, stop: int | None = None, device: str | torch.device = "cpu",
                   stored_dtype: bool = False) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (training step, gradients [workers, d]) — float32, or as stored with ``stored_dtype`` —
        refusing NaN/Inf with the step and worker."""
        import torch

        stop = self.steps if stop is None else min(stop, self.steps)
        for i, raw in enumerate(self._raw_steps(start, stop), start=start):
            g = raw.to(device=device, dtype=raw.dtype if stored_dtype else torch.float32)
            del raw
            self._check_finite(g, i)
            yield self.recorded_steps[i], g

    def step_chunks(self, index: int, chunk: int = 1 << 20) -> Iterator[torch.Tensor]:
        """Step ``index`` as float32 column chunks [workers, ≤ chunk]: memory O(workers × chunk)."""
        yield from self.step_columns(index, [(lo, min(lo + chunk, self.elements))
                                             for lo in range(0, self.elements, chunk)])

    def step_columns(self, index: int, ranges: list[tuple[int, int]]) -> Iterator[torch.Tensor]:
        """Step ``index``'s columns [lo, hi) of every worker, range by range, as float32 [workers, hi − lo]:
        memory O(workers × (hi − lo)) for a stored trace; a compressed one is read whole (no random access)."""
        import torch

        if self._data_offset is None:
            _, g = next(self.steps_iter(index, index + 1))
            for lo, hi in ranges:
                yield g[:, lo:hi]
            return
        self.check_intact()
        dtype = self.torch_dtype
        size = self.dtype.itemsize
        base = self._data_offset + index * self.step_bytes()
        with open(self.path, "rb", buffering=0) as fh:
            for lo, hi in ranges:
                out = torch.empty(self.workers, hi - lo, dtype=dtype)
                for w in range(self.workers):
                    fh.seek(base + (w * self.elements + lo) * size)
                    self._read_into(fh, out[w])
                g = out.float()
                del out
                self._check_finite(g, index)
                yield g

    @property
    def torch_dtype(self) -> torch.dtype:
        """The gradients' dtype as stored, as torch names it (float16 or float32)."""
        return as_torch_dtype("fp16" if self.dtype == np.float16 else "fp32")

    @property
    def random_access(self) -> bool:
        """Whether columns of a step can be read without the rest (the gradients stored, not compressed)."""
        return self._data_offset is not None

    def step_on_demand(self, index: int) -> StepColumns:
        """Step ``index`` as a [workers, d] stand-in that reads the columns asked of it (``g[:, lo:hi]``), when
        asked: a measurement of a few buckets reads those alone, in O(workers × bucket) memory, not the step.
        Only where the gradients are stored (:attr:`random_access`): a compressed member is read from its start."""
        if not self.random_access:
            raise TraceError(f"{self.path}: its gradients are compressed, so a step's columns cannot be read alone; "
                             "read its steps whole (steps_iter)")
        return StepColumns(self, index)

    def _check_finite(self, g: torch.Tensor, index: int) -> None:
        import torch

        # a NaN makes its row's max and min NaN, +Inf is its max, -Inf its min: exact, and on ResNet-50's
        # half-precision steps 12× cheaper than a float32 row sum (0.23 s against 2.7 s for three steps)
        bad = ~(torch.isfinite(g.amax(dim=1)) & torch.isfinite(g.amin(dim=1)))
        if bool(bad.any()):
            worker = int(torch.nonzero(bad)[0, 0])
            raise TraceError(f"{self.path}: gradient of worker {worker} at recorded step {index} "
                             f"(training step {self.recorded_steps[index]}) contains NaN or Inf")

    def layout(self) -> tuple[Layer, ...]:
        return self.layers


class StepColumns:
    """A stored step read by columns on demand (:meth:`Trace.step_on_demand`): ``shape`` and ``dtype`` as the step's,
    ``step[:, lo:hi]`` the float32 [workers, hi − lo] columns of every worker (checked finite). ``in_memory`` is
    False: a reader keeps what it converts rather than slicing it again (arcsim.run.measure.GradientStats)."""

    in_memory = False

    def __init__(self, trace: Trace, index: int) -> None:
        self.trace, self.index = trace, index
        self.shape = (trace.workers, trace.elements)
        self.dtype = trace.torch_dtype

    def __getitem__(self, key: tuple[slice, slice]) -> torch.Tensor:
        rows, cols = key
        if rows != slice(None) or cols.step not in (None, 1):
            raise TypeError("a step read on demand gives every worker's columns lo:hi, nothing else")
        lo, hi, _ = cols.indices(self.shape[1])
        return next(self.trace.step_columns(self.index, [(lo, hi)]))


def _read_npy_header(fh: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(fh)
    raise ValueError(f"unsupported .npy version {version}")


def _read_small(zf: zipfile.ZipFile, name: str, path: Path) -> np.ndarray:
    try:
        with zf.open(f"{name}.npy") as fh:
            return np.load(io.BytesIO(fh.read()), allow_pickle=False)
    except KeyError:
        raise TraceError(f"{path} has no {name} member; it is not an arcsim trace (see docs/trace-format.md)") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise TraceError(f"{path}: member {name} is unreadable ({exc}); capture the trace again") from None


def _read_json(zf: zipfile.ZipFile, name: str, path: Path) -> Any:
    raw = _read_small(zf, name, path)
    try:
        return json.loads(raw.astype(np.uint8).tobytes().decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: {name} is not valid JSON ({exc})") from None


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_meta_types(meta: dict[str, Any], path: Path) -> None:
    """Each field the readers use must hold its kind of value; one TraceError names the first that does not."""
    want_text = {"count": "a whole number ≥ {}", "steps": "a list of whole numbers ≥ {}", "text": "a string",
                 "flag": "true or false"}
    for key, (kind, minimum) in META_TYPES.items():
        if key not in meta:
            continue
        value = meta[key]
        if kind == "count":
            ok = _is_count(value, minimum)
        elif kind == "steps":
            ok = isinstance(value, list) and all(_is_count(s, minimum) for s in value)
        else:
            ok = isinstance(value, str if kind == "text" else bool)
        if not ok:
            raise TraceError(f"{path}: metadata field {key} is {json.dumps(value)[:60]}, not "
                             f"{want_text[kind].format(minimum)}; the file was not written by arcsim "
                             "or was edited — capture the trace again")


def _stored_data_offset(path: Path, info: zipfile.ZipInfo, header_end: int) -> int | None:
    """Absolute file offset of the array bytes of a stored (uncompressed) member, else None."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
        if local[:4] != b"PK\x03\x04":
            raise TraceError(f"{path}: bad local header for gradients; the file is corrupt")
        name_len, extra_len = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len + header_end


CHECKSUM_FACT = "gradients_checksum_ok"  # the file fact (arcsim.files) a trace's checked checksum is kept as


def damaged(path: Path) -> str:
    return (f"{path}: the stored gradients do not match their checksum (CRC-32); the file was damaged after it was "
            "written — copy or capture it again")


def _gradients_intact(path: Path) -> bool:
    """Whether the gradients member's bytes match the CRC-32 the zip directory holds for them."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(GRADIENTS_MEMBER)
        start = _stored_data_offset(path, info, 0)
        if start is None:  # compressed: zipfile checks the CRC when the member is read to its end
            try:
                with zf.open(info) as fh:
                    while fh.read(2**22):
                        pass
            except zipfile.BadZipFile:
                return False
            return True
    crc, left = 0, info.compress_size
    with open(path, "rb") as fh:
        fh.seek(start)
        while left:
            block = fh.read(min(left, 2**22))
            if not block:
                return False
            crc, left = zlib.crc32(block, crc), left - len(block)
    return crc == info.CRC


def _layers_from_json(rows: Any, path: Path) -> tuple[Layer, ...]:
    layers, offset = [], 0
    try:
        for row in rows:
            shape = tuple(int(s) for s in row["shape"])
            if int(row["numel"]) != math.prod(shape) or int(row["offset"]) != offset:
                raise TraceError(f"{path}: layer {row['name']!r} has numel {row['numel']} and offset "
                                 f"{row['offset']}, but its shape {shape} at offset {offset} says otherwise")
            layers.append(Layer(str(row["name"]), shape, offset))
            offset += int(row["numel"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}: the layer table is malformed ({exc!r})") from None
    if not layers:
        raise TraceError(f"{path}: the layer table is empty")
    return tuple(layers)


def open_trace(path: str | Path, check_later: bool = False) -> Trace:
    """Open and validate a trace; every inconsistency is a TraceError naming the file and the fix. The gradients'
    checksum is checked once per file (kept in the cache's index); ``check_later``: on a thread of its own (the
    file read and the CRC-32 let the interpreter run on), so that the caller's work goes on beside it — the trace
    is refused when first read (Trace.check_intact): page-cached, 0.4 s of LLaMA-60M's 0.9 GB and 2.3 s of
    LLaMA-1B's 5.4 GB go on while `arcsim run` counts the model."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"no such trace file: {path}")
    if path.suffix != ".npz":
        raise TraceError(f"{path} is not a trace: traces are .npz files (see docs/trace-format.md)")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise TraceError(f"{path} is not a readable .npz ({exc}); it may be truncated — capture it again") from None
    with zf:
        meta = _read_json(zf, "metadata", path)
        if not isinstance(meta, dict):
            raise TraceError(f"{path}: metadata is not a JSON object")
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise TraceError(f"{path} has trace schema version {version!r}; this arcsim reads version "
                             f"{SCHEMA_VERSION} — recapture it with this version")
        missing = [k for k in REQUIRED_META if k not in meta]
        if missing:
            raise TraceError(f"{path}: metadata lacks {', '.join(missing)}")
        _check_meta_types(meta, path)
        layers = _layers_from_json(_read_json(zf, "layers", path), path)
        try:
            info = zf.getinfo(GRADIENTS_MEMBER)
            with zf.open(info) as fh:
                shape, fortran, dtype = _read_npy_header(fh)
                header_end = fh.tell()
        except KeyError:
            raise TraceError(f"{path} has no gradients member; it is not an arcsim trace") from None
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise TraceError(f"{path}: the gradients header is unreadable ({exc})") from None
        small = {name: _read_small(zf, name, path) for name in SMALL_MEMBERS}
    steps, workers, d = int(meta["steps"]), int(meta["workers"]), sum(la.numel for la in layers)
    if dtype not in (np.float16, np.float32) or fortran:
        raise TraceError(f"{path}: gradients must be C-ordered float16 or float32, found {dtype}")
    if workers < 2:
        raise TraceError(f"{path} holds {workers} worker; arcsim compares workers' gradients and needs at least 2 "
                         "— capture it again with --workers 2 or more")
    if tuple(shape) != (steps, workers, d):
        raise TraceError(f"{path}: gradients are shaped {tuple(shape)} but metadata and the layer table say "
                         f"({steps}, {workers}, {d})")
    if len(meta["recorded_steps"]) != steps:
        raise TraceError(f"{path}: {len(meta['recorded_steps'])} recorded step numbers for {steps} steps")
    expected = {"loss": (steps,), "worker_loss": (steps, workers), "forward_s": (steps,),
                "backward_s": (steps,), "ready_s": (steps, len(layers))}
    for name, want in expected.items():
        if small[name].shape != want:
            raise TraceError(f"{path}: {name} is shaped {small[name].shape}, expected {want}")
    for name in ("forward_s", "backward_s", "ready_s"):
        times = small[name]
        if not (np.isfinite(times).all() and (times >= 0).all()):
            raise TraceError(f"{path}: {name} holds negative or non-finite times; a compute timing cannot be — "
                             "capture the trace again")
    if info.file_size != header_end + steps * workers * d * np.dtype(dtype).itemsize:
        raise TraceError(f"{path}: the gradients member holds {info.file_size} bytes, not what its shape "
                         f"{tuple(shape)} needs; the file is truncated or corrupt")
    offset = _stored_data_offset(path, info, header_end)
    trace = Trace(path, meta, layers, np.dtype(dtype), small["loss"], small["worker_loss"], small["forward_s"],
                  small["backward_s"], small["ready_s"], offset)
    known = known_file_fact(path, CHECKSUM_FACT)
    if known is None:
        trace._checking = _Checksum(path)
        if not check_later:
            trace.check_intact()
    elif not known:
        raise TraceError(damaged(path))
    return trace


class _Checksum(threading.Thread):
    """_gradients_intact(path) on a thread of its own (a daemon: an early end of the run does not wait for it), its
    verdict kept among the file facts under the file's stamp as it was before the read."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="arcsim-trace-checksum", daemon=True)
        self.path, self.stamp, self.pid = path, file_stamp(path), os.getpid()
        self.intact: bool | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.intact = _gradients_intact(self.path)
        except BaseException as exc:  # (raised where the result is asked for)
            self.error = exc
        else:
            remember_file_fact(self.stamp, CHECKSUM_FACT, self.intact)

    def result(self) -> bool:
        """The check's verdict once the thread has ended (no thread of it is left for a fork to copy); in a process
        forked before the verdict, where the thread does not run, the check made again there."""
        if os.getpid() == self.pid:
            self.join()
        elif self.intact is None and self.error is None:
            return _gradients_intact(self.path)
        if self.error is not None:
            raise self.error
        assert self.intact is not None
        return self.intact
