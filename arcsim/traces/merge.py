"""Join the parts a recording hook wrote (one per rank of a user's DDP job) into one trace of W workers.

Each part holds that rank's gradient of every parameter on the recorded steps, in the order the buckets
became ready, the ready times and the forward time (:class:`arcsim.hooks.RecordingState`). The parts must
come from one job: the same world size and recorded ranks (one part per recorded rank: all of them, or
those ``RecordingState``'s ``ranks`` named), recorded steps, parameter names and shapes. The parts are
read memory-mapped and written a worker's piece at a time, so merging holds no step of every worker.
The trace's compute timings are the medians over the ranks; its losses were not seen by the hook (zeros,
and ``losses_recorded`` false in the metadata). Naming the model (``--model``, as capture takes it)
records how to rebuild it, after checking that its parameters are the recorded ones; with the input the
hook saw (shapes and dtypes: ``recorded_input``), ``arcsim run`` prices its compute on a GPU with nothing
more. The batch (the input's leading dimension), the autocast precision and the optimizer (when the job
gave it to the hook) are the job's own.
"""

from __future__ import annotations

import itertools
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arcsim.compressors.layout import Layer
from arcsim.errors import ArcsimError
from arcsim.models.inputs import RecordedInput
from arcsim.models.source import ModelSource, absolute_ref, load_callable
from arcsim.traces.format import SCHEMA_VERSION, TraceWriter

PART_KEYS = {"rank", "world", "steps", "order", "shapes", "grads", "ready_s", "forward_s"}


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ArcsimError(f"no such recording: {path}")
    try:
        part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ArcsimError(f"{path} is not a recording part ({type(exc).__name__}); write it with "
                          "RecordingState.save") from None
    if not isinstance(part, dict) or not set(part) >= PART_KEYS:
        raise ArcsimError(f"{path} is not a recording part; write it with RecordingState.save")
    problem = _malformed(part)
    if problem:
        raise ArcsimError(f"{path} is not a whole recording part: {problem}; record the job again (RecordingState.save "
                          "after its last step)")
    return part


def _whole(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _recorded_ranks(part: dict[str, Any]) -> Any:
    """The ranks of the job that recorded (parts written before ``ranks`` existed: every rank)."""
    return part.get("ranks", list(range(part["world"])))


def _malformed(part: dict[str, Any]) -> str | None:
    """What is wrong inside one part (None: nothing), checked before anything is written: its rank, its
    recorded steps (each once, in order), its layout, and one gradient, ready time per parameter and
    forward time per step."""
    if not (_whole(part["world"], 1) and _whole(part["rank"]) and part["rank"] < part["world"]):
        return f"rank {part['rank']!r} of world {part['world']!r} is not a rank of a job"
    steps, order, shapes = part["steps"], part["order"], part["shapes"]
    if not isinstance(steps, list) or not steps:
        return "it holds no recorded step"
    if not all(_whole(s) for s in steps) or any(b <= a for a, b in itertools.pairwise(steps)):
        return f"its steps {steps} are not whole numbers each recorded once, in order"
    if (not isinstance(order, list) or not order or not isinstance(shapes, dict) or sorted(order) != sorted(shapes)
            or len(set(order)) != len(order)):
        return "its parameter order and shapes do not name the same parameters, each once"
    if not all(isinstance(shape, list | tuple) and all(_whole(n, 1) for n in shape) for shape in shapes.values()):
        return "a parameter's shape is not a list of sizes"
    recorded = _recorded_ranks(part)
    if (not isinstance(recorded, list) or len(recorded) < 2 or part["rank"] not in recorded
            or not all(_whole(r) and r < part["world"] for r in recorded)):
        return f"its recorded ranks {recorded!r} are not two or more ranks of the job, its own among them"
    params = sum(math.prod(shape) for shape in shapes.values())
    for key, ok in (("grads", lambda g: isinstance(g, torch.Tensor) and tuple(g.shape) == (params,)
                     and g.dtype in (torch.float16, torch.float32)),
                    ("ready_s", lambda r: isinstance(r, list) and len(r) == len(order)
                     and all(isinstance(t, float | int) and math.isfinite(t) for t in r)),
                    ("forward_s", lambda f: isinstance(f, float | int) and math.isfinite(f) and f >= 0)):
        held = part.get(key)
        if not isinstance(held, dict) or sorted(held) != steps:
            return f"its {key} are not one per recorded step {steps}"
        bad = [s for s in steps if not ok(held[s])]
        if bad:
            return f"its {key} of step {bad[0]} does not match the {len(order)} parameters ({params:,} elements)"
    return None


def merge_recordings(paths: list[Path], out: Path, source: ModelSource | None = None, dataset: str | None = None,
                     batch: int = 0, dtype: str = "fp16", data: str | None = None) -> Path:
    """Write ``out`` from the ranks' parts; every mismatch between them is one ArcsimError. ``batch``: per rank
    (0: the recorded input's); ``dataset`` or ``data``: what the job trained on, when it is one of those."""
    parts = sorted((_read(Path(p)) for p in paths), key=lambda part: part["rank"])
    world = parts[0]["world"]
    if world < 2:
        raise ArcsimError("a trace needs at least 2 workers; record a job of 2 or more ranks")
    ranks = _recorded_ranks(parts[0])
    if ([part["rank"] for part in parts] != ranks or any(part["world"] != world for part in parts)
            or any(_recorded_ranks(part) != ranks for part in parts)):
        raise ArcsimError(f"the parts are ranks {[part['rank'] for part in parts]} of worlds "
                          f"{sorted({part['world'] for part in parts})}, recording ranks {ranks}: give one part "
                          "per recorded rank of one job")
    if dtype == "fp32" and any(part["grads"][s].dtype != torch.float32 for part in parts for s in part["steps"]):
        raise ArcsimError("the parts hold fp16 gradients (RecordingState keeps fp16 unless told dtype='fp32'): "
                          "merge them with --dtype fp16, or record again with dtype='fp32'")
    if data is not None:
        if dataset is not None:
            raise ArcsimError("--data and --dataset both name what the job trained on: give one of them")
        load_callable(data, "--data")
    first = parts[0]
    for part in parts[1:]:
        for key in ("steps", "order", "shapes"):
            if part[key] != first[key]:
                raise ArcsimError(f"rank {part['rank']} recorded other {key} than rank 0: the ranks disagree on "
                                  "the layout (different models, or buckets built differently)")
    layers, offset = [], 0
    for name in first["order"]:
        layers.append(Layer(name, tuple(first["shapes"][name]), offset))
        offset += math.prod(first["shapes"][name])
    params = offset
    recorded = RecordedInput.from_meta(first.get("inputs"))
    if source is not None:
        _check_source(source, dataset, data, layers)
    steps = first["steps"]
    ready = np.median([[part["ready_s"][s] for s in steps] for part in parts], axis=0)  # [steps, layers]
    ready = np.maximum.accumulate(np.clip(ready, 0, None), axis=1)
    forward = np.median([[part["forward_s"][s] for s in steps] for part in parts], axis=0)
    meta = {"schema_version": SCHEMA_VERSION, "model": source.label if source else "recorded",
            **({"model_source": source.to_meta()} if source else {}),
            "dataset": dataset or (absolute_ref(data) if data else "the recorded job's"),
            "dataset_description": "the recorded DDP job's own data",
            **({"recorded_input": recorded.to_meta()} if recorded else {}),
            "optimizer": first.get("optimizer") or "not recorded (give RecordingState.for_model the optimizer)",
            "precision": first.get("precision", "fp32"),
            "synthetic_data": False, "params": params, "batch_per_worker": batch or (recorded.batch if recorded else 0),
            "workers": len(parts), **({"recorded_ranks": ranks, "job_world_size": world}
                                       if len(parts) < world else {}),
            "steps": len(steps), "recorded_steps": list(steps), "dtype": dtype, "device": "recorded",
            "device_name": "the recorded job's", "torch_version": first.get("torch_version", torch.__version__),
            "seed": 0, "losses_recorded": False, "command": shlex.join(["arcsim", *sys.argv[1:]])}
    with TraceWriter(Path(out), meta, tuple(layers), dtype) as writer:
        for i, s in enumerate(steps):  # each worker's row as its part holds it (mapped): no step of all in memory
            writer.write_step([part["grads"][s] for part in parts], [0.0] * len(parts), float(forward[i]),
                              float(ready[i].max()), ready[i].tolist())
    return Path(out)


def _check_source(source: ModelSource, dataset: str | None, data: str | None, layers: list[Layer]) -> None:
    """The named model must have exactly the recorded parameters, or pricing it would price another."""
    from arcsim.models.datasets import data_spec

    source.check()
    name = None if data else dataset or source.default_dataset
    spec = data_spec(name) if name else None
    with torch.device("meta"):
        model = source.build(spec)
    have = {n: tuple(p.shape) for n, p in model.named_parameters()}
    recorded = {la.name: la.shape for la in layers}
    if have != recorded:
        differ = sorted(set(have.items()) ^ set(recorded.items()))[:3]
        raise ArcsimError(f"--model {source.ref} does not have the recorded parameters (first differences: "
                          f"{differ}); name the model the job trained")
