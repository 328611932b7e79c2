"""What a sweep covers: axes (from the command line or a YAML file), brace expansion, and the point list.

A sweep is the product of its axes. Every axis takes a list; every string in it may hold brace groups
(``8x8-ib{25,100,400}`` is three topologies, ``{8,16}x8-ib{100,400}`` four). Points carry plain values
only, so they travel to worker processes or a Dask cluster as they are, and each has a stable id that
the results table is keyed by (resume skips ids already there).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arcsim.catalog import (
    BUCKET_MB_RANGE,
    COMPRESSORS,
    DDP_BUCKET_MB,
    DENSITY_FREE,
    FUSIONS,
    LIVE_DEFAULTS,
    MEMORIES,
    bucket_mb_ok,
    fusion_message,
)
from arcsim.errors import ArcsimError
from arcsim.files import read_yaml
from arcsim.netsim import ENGINES
from arcsim.topology import DEFAULT_TOPOLOGY, MAX_RANKS
from arcsim.units import parse_duration, parse_params, parse_rate

RESULTS = "results.csv"  # in a sweep's folder: one row per finished point
SPEC = "sweep.yaml"  # beside it: what was asked
CHART_KINDS = ("heatmap", "speedup", "crossover", "breakdown", "hierarchy")  # arcsim.sweep.plots.KINDS draws them

# axis name → what it is (for errors and `arcsim sweep --help`)
AXES: dict[str, str] = {
    "topology": "preset, YAML file or name grammar, e.g. 8x8-ib{25,100,400}",
    "bandwidth": "per-NIC bandwidth override, e.g. 10Gbit, 100Gbit",
    "latency": "network latency override, e.g. 2us, 50us",
    "ranks": "rank count: nodes = ranks / GPUs per node of the topology",
    "trace": "gradient trace (.npz); a known model's name (resnet18.npz) is captured if missing",
    "params": "instead of a trace: a synthetic model of this many parameters, e.g. 125M, 7B (arcsim run --params)",
    "compressor": f"one of {', '.join(COMPRESSORS)}",
    "density": "k/d in (0, 1] (ignored by dense, fp16 and powersgd's rank)",
    "bucket_mb": "DDP bucket cap, MiB of fp32",
    "engine": "analytic or des",
    "gpu": "the GPU compute and compression are priced on (arcsim device list; cpu: as measured here); "
           "default: the topology's",
    "library": "communication library: nccl, gloo, mpi or ideal; default: the topology's",
    "fusion": "bucket (DDP buckets, each compressed and sent on its own) or model (the whole gradient as one "
              "vector); default bucket",
    "live": "instead of a trace: a model trained data-parallel here, its gradients fed straight to the "
            "compressors (arcsim run --live): a zoo name (e.g. resnet18) or your own (file.py:build, "
            "package.module:build, hf:CONFIG.json); see live_workers, live_steps, live_device, live_dataset",
    "hierarchy": "flat (compress across every rank) or node (dense inside a node, compressed between nodes; "
                 "topologies with several GPUs per node); default flat",
}
NUMERIC_AXES = ("bandwidth", "latency", "ranks", "density", "bucket_mb")  # _normalise reads them as numbers
OPTIONAL_AXES = ("library", "fusion", "params", "live", "hierarchy")  # later axes: not in a point's id when unset
SETTINGS: dict[str, str] = {  # single values, not swept
    "memory": f"error feedback for every compressor: {', '.join(MEMORIES)} (default ef14)",
    "seed": "seed for randomized compressors",
    "compute_profile": "compute timings from this profile instead of the trace's own",
    "out": "results directory",
    "live_workers": f"with live: data-parallel workers (default {LIVE_DEFAULTS['workers']})",
    "live_steps": f"with live: training steps measured after one warm-up step (default {LIVE_DEFAULTS['steps']})",
    "live_device": "with live: cpu or cuda (cuda also times compute and compression there; default "
                   f"{LIVE_DEFAULTS['device']})",
    "live_dataset": "with live: the built-in dataset the models train on (default: each zoo model's own; a "
                    "model of your own needs it, e.g. python-text)",
}
MAX_POINTS = 100_000  # a sweep's points are held in memory and each costs milliseconds to seconds
LIVE_SETTINGS = {f"live_{k}": v for k, v in LIVE_DEFAULTS.items()}  # live_workers, live_steps, live_device


class SweepError(ArcsimError):
    """A sweep spec that cannot be run."""


def split_top_level(text: str) -> list[str]:
    """Split on commas outside braces: ``a{1,2},b`` → ``['a{1,2}', 'b']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise SweepError(f"unbalanced '}}' in {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise SweepError(f"unbalanced '{{' in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


_BRACE = re.compile(r"\{([^{}]*)\}")


def too_many(count: int, what: str) -> SweepError:
    return SweepError(f"{what} has at least {count:,} points; a sweep holds at most {MAX_POINTS:,} — "
                      "split it, or sweep fewer values per axis")


def expand_braces(text: str, limit: int = MAX_POINTS) -> list[str]:
    """Every string a brace pattern stands for, in order: ``x{1,2}y{a,b}`` → x1ya, x1yb, x2ya, x2yb;
    refused as soon as there are more than ``limit``."""
    m = _BRACE.search(text)
    if m is None:
        if "{" in text or "}" in text:
            raise SweepError(f"unbalanced braces in {text!r}")
        return [text]
    options = [o.strip() for o in m.group(1).split(",")]
    if not all(options):
        raise SweepError(f"empty choice in {{{m.group(1)}}} of {text!r}")
    out: list[str] = []
    for o in options:
        out += expand_braces(text[:m.start()] + o + text[m.end():], limit)
        if len(out) > limit:
            raise too_many(len(out), f"the pattern {text[:60]!r}")
    return out


def axis_values(raw: Any) -> list[Any]:
    """An axis from YAML or the command line: a scalar, a comma list, or a list; strings brace-expanded."""
    items = raw if isinstance(raw, list | tuple) else split_top_level(raw) if isinstance(raw, str) else [raw]
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            for part in split_top_level(item):
                out += expand_braces(part)
        else:
            out.append(item)
        if len(out) > MAX_POINTS:
            raise too_many(len(out), "an axis")
    return out


@dataclass
class SweepSpec:
    axes: dict[str, list[Any]]
    memory: str = "ef14"
    seed: int = 0
    compute_profile: str | None = None
    out: str | None = None
    source: str = "command line"
    live_settings: dict[str, Any] | None = None  # live_workers, live_steps, live_device when the live axis is used

    def points(self) -> list[dict[str, Any]]:
        """The product of the axes, each point with its id, in a stable order. Dense and fp16 ignore the
        density and error feedback, so they appear once per combination of the other axes."""
        names = list(AXES)
        pts, seen = [], set()
        for combo in itertools.product(*(self.axes[n] for n in names)):
            p = dict(zip(names, combo, strict=True))
            free = p["compressor"] in DENSITY_FREE
            p.update(density=1.0 if free else p["density"], memory=self.memory, seed=self.seed,
                     compute_profile=self.compute_profile)
            if p["live"] is not None:
                p.update(self.live_settings or LIVE_SETTINGS)
            p["point_id"] = point_id(p)
            if p["point_id"] not in seen:
                seen.add(p["point_id"])
                pts.append(p)
        return pts

    def count_note(self, points: int) -> str:
        """Why the point count is below the product of the axes (empty when it is not)."""
        product = math.prod(len(v) for v in self.axes.values())
        if points >= product:
            return ""
        return (f"{product:,} combinations, {product - points:,} fewer points: "
                f"{', '.join(DENSITY_FREE)} do not depend on the density, so each appears once per other setting")

    def describe(self) -> str:
        """What was swept, for titles: the axes with more than one value."""
        varied = [f"{n} ({len(v)})" for n, v in self.axes.items() if len(v) > 1]
        return " × ".join(varied) if varied else "a single point"

    def to_dict(self) -> dict[str, Any]:
        """The spec as a sweep file takes it back: bandwidths and latencies with their units (10Gbit, 5us)."""
        axes = {name: [_with_unit(name, v) for v in values] for name, values in self.axes.items()}
        return {**axes, "memory": self.memory, "seed": self.seed, "compute_profile": self.compute_profile,
                **(self.live_settings or {})}


def _with_unit(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name == "bandwidth":
        return f"{value * 8 / 1e9:.12g}Gbit"
    if name == "latency":
        return f"{value * 1e6:.12g}us"
    return value


def point_id(point: Mapping[str, Any]) -> str:
    """A short stable hash of a point's parameters."""
    body = json.dumps({k: point[k] for k in sorted(point)
                       if k != "point_id" and not (k in OPTIONAL_AXES and point[k] is None)},
                      sort_keys=True, default=str)
    return hashlib.sha1(body.encode()).hexdigest()[:12]


def load_yaml_spec(path: Path) -> dict[str, Any]:
    raw = read_yaml(path, "sweep file", SweepError)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: a sweep file is a mapping of axis: values, e.g. `compressor: [topk, arctopk]`")
    return raw


def build_spec(raw: Mapping[str, Any], source: str = "command line") -> SweepSpec:
    """Check and normalise a spec: known keys, parsable values, no empty axis."""
    unknown = sorted(set(raw) - set(AXES) - set(SETTINGS))
    if unknown:
        raise SweepError(f"{source}: unknown key {', '.join(map(repr, unknown))}; sweep axes are "
                         f"{', '.join(AXES)} and settings {', '.join(SETTINGS)}")
    axes: dict[str, list[Any]] = {}
    defaults: dict[str, Any] = {"topology": DEFAULT_TOPOLOGY, "bandwidth": None, "latency": None, "ranks": None,
                                "trace": None, "compressor": ["dense", "topk", "randk", "arctopk", "star", "powersgd"],
                                "density": 0.01, "bucket_mb": DDP_BUCKET_MB, "engine": "analytic", "gpu": None,
                                "library": None, "fusion": None, "params": None, "live": None, "hierarchy": None}
    for name in AXES:
        if name in raw and raw[name] is None and defaults[name] is not None:
            raise SweepError(f"{source}: axis {name!r} has no value; give one or more (e.g. {name}: "
                             f"{_example(name, defaults[name])}) or leave it out for the default")
        given = raw.get(name, defaults[name])
        values = [None] if given is None else axis_values(given)
        if not values:
            raise SweepError(f"{source}: axis {name!r} is empty, so the sweep has no points; give it a value "
                             "or leave it out for the default")
        axes[name] = [_normalise(name, v, source) for v in values]
        if len(set(map(str, axes[name]))) != len(axes[name]):
            raise SweepError(f"{source}: axis {name!r} repeats a value: {str(axes[name])[:200]}")
    combinations = math.prod(len(v) for v in axes.values())
    if combinations > MAX_POINTS:
        raise too_many(combinations, f"{source}: the sweep ({' × '.join(str(len(v)) for v in axes.values())})")
    sources = [name for name in ("trace", "params", "live") if any(v is not None for v in axes[name])]
    if len(sources) > 1:
        raise SweepError(f"{source}: give one of trace, params (a synthetic model) and live (training here), "
                         f"not {' and '.join(sources)}")
    given_live = sorted(k for k in (*LIVE_SETTINGS, "live_dataset") if raw.get(k) is not None)
    if given_live and sources != ["live"]:
        raise SweepError(f"{source}: {', '.join(given_live)} only apply to live training; add the live axis (e.g. "
                         "live: cnn) or remove them")
    live_settings = _live_settings(raw, source, axes["live"]) if sources == ["live"] else None
    memory = str(raw.get("memory", "ef14"))
    if memory not in MEMORIES:
        raise SweepError(f"{source}: unknown memory {memory!r}; choose one of {', '.join(MEMORIES)}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SweepError(f"{source}: seed must be a whole number ≥ 0 (got {seed!r})")
    profile = raw.get("compute_profile")
    return SweepSpec(axes, memory=memory, seed=seed, compute_profile=str(profile) if profile else None,
                     out=str(raw["out"]) if raw.get("out") else None, source=source, live_settings=live_settings)


def _live_settings(raw: Mapping[str, Any], source: str, models: Sequence[str]) -> dict[str, Any]:
    """live_workers, live_steps, live_device and (when given) live_dataset, checked as `arcsim run --live`
    checks them, for every model on the live axis."""
    from arcsim.traces.training import TrainingConfig

    got: dict[str, Any] = {k: raw.get(k) if raw.get(k) is not None else v for k, v in LIVE_SETTINGS.items()}
    try:
        got["live_workers"], got["live_steps"] = int(got["live_workers"]), int(got["live_steps"])
    except (TypeError, ValueError):
        raise SweepError(f"{source}: live_workers and live_steps are whole numbers") from None
    try:
        TrainingConfig(model="cnn", workers=got["live_workers"], steps=got["live_steps"],
                       device=str(got["live_device"])).check()
        from arcsim.models.source import model_source

        if raw.get("live_dataset") is not None:
            got["live_dataset"] = str(raw["live_dataset"])
        for model in models:
            model_source(model).dataset_for(got.get("live_dataset"), None)
    except ArcsimError as exc:
        raise SweepError(f"{source}: {exc}".replace("--workers", "live_workers").replace("--steps", "live_steps")
                         .replace("--dataset", "live_dataset")) from None
    return got


def _normalise(name: str, value: Any, source: str) -> Any:
    """One axis value in canonical form (numbers as numbers, names checked)."""
    if value is None:
        return None
    where = f"{source}: {name}"
    try:
        if isinstance(value, bool) and name in NUMERIC_AXES:  # YAML's yes/true would read as 1
            raise ValueError
        if name == "bandwidth":
            rate = parse_rate(value)
            if rate <= 0:
                raise ValueError
            return rate  # bytes/s
        if name == "latency":
            lat = parse_duration(value)
            if lat < 0:
                raise ValueError
            return lat
        if name == "ranks":
            ranks = int(value)
            if ranks < 2 or ranks != float(value):
                raise ValueError
            if ranks > MAX_RANKS:
                raise ValueError
            return ranks
        if name in ("density", "bucket_mb"):
            x = float(value)
            if not (0 < x <= 1 if name == "density" else bucket_mb_ok(x)):
                raise ValueError
            return x
    except (TypeError, ValueError, OverflowError, ArcsimError):
        hint = {"bandwidth": "e.g. 100Gbit", "latency": "e.g. 5us",
                "ranks": f"a whole number of ranks from 2 to {MAX_RANKS:,}", "density": "a number in (0, 1]",
                "bucket_mb": BUCKET_MB_RANGE}[name]
        raise SweepError(f"{where}: cannot use {value!r} ({hint})") from None
    if name == "gpu":
        from arcsim.devices.catalog import devices

        if str(value).lower() not in devices():
            raise SweepError(f"{where}: unknown GPU {value!r}; choose one of: {', '.join(devices())}")
        return str(value).lower()
    if name == "params":
        try:
            return parse_params(value)
        except ArcsimError as exc:
            raise SweepError(f"{where}: {exc}") from None
    if name == "library":
        from arcsim.collectives.libraries import get_library

        try:
            return get_library(str(value)).name
        except ArcsimError as exc:
            raise SweepError(f"{where}: {exc}") from None
    if name == "live":
        from arcsim.models.source import model_source

        try:
            model_source(str(value)).check()
        except ArcsimError as exc:
            raise SweepError(f"{where}: {exc}") from None
    if name == "fusion" and value not in FUSIONS:
        raise SweepError(f"{where}: {fusion_message(value)}")
    if name == "hierarchy" and value not in ("flat", "node"):
        raise SweepError(f"{where}: a hierarchy on an axis is flat or node (flat,node for both), got {value!r}")
    if name == "compressor" and value not in COMPRESSORS:
        raise SweepError(f"{where}: unknown compressor {value!r}; choose from {', '.join(COMPRESSORS)}")
    if name == "engine" and value not in ENGINES:
        raise SweepError(f"{where}: unknown engine {value!r}; choose analytic or des")
    return str(value)


def _example(name: str, default: Any) -> str:
    return ", ".join(map(str, default[:2])) if isinstance(default, list) else str(default)


def merge(yaml_raw: Mapping[str, Any], cli: Mapping[str, Any]) -> dict[str, Any]:
    """Command-line values override the file's, key by key."""
    return {**yaml_raw, **{k: v for k, v in cli.items() if v is not None}}

