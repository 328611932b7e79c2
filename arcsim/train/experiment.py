"""An `arcsim train` experiment: every (compressor, seed) run, priced, appended to a resumable history.

The output directory holds ``config.json`` (what the runs depend on), ``history.csv`` (one row per step
of every finished run, appended as each run finishes), ``summary.csv`` and the charts. Re-running with
the same settings skips the runs already in the history; more compressors or seeds add runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from arcsim.errors import ArcsimError
from arcsim.files import AppendOnlyCSV, atomic_path, read_json, write_atomic
from arcsim.topology import Topology, load_topology
from arcsim.train.loop import Setup, TrainConfig, prepare, train
from arcsim.train.outcome import compute_times, history_rows, price, priced_on
from arcsim.units import format_duration

HISTORY_COLUMNS = ("compressor", "seed", "memory", "step", "loss", "accuracy", "val_loss", "time_s", "collective",
                   "diverged")
# settings the runs depend on; compressors and seeds may grow between invocations
RUN_KEYS = ("model", "dataset", "workers", "density", "memory", "steps", "batch", "lr", "momentum", "eval_every",
            "bucket_mb", "compute_profile", "scope")


def run_key(cfg: TrainConfig, topology: str | None, engine: str, gpu: str | None = None,
            library: str | None = None) -> dict[str, Any]:
    raw = dataclasses.asdict(cfg)
    key = {**{k: raw[k] for k in RUN_KEYS}, "topology": topology, "engine": engine}
    overrides = {"gpu": gpu, "library": library, "fusion": None if cfg.fusion == "bucket" else cfg.fusion}
    return key | {k: v for k, v in overrides.items() if v} | cfg.extra_key()  # older directories still resume


def claim_dir(out: Path, key: dict[str, Any]) -> None:
    """Create an experiment directory holding ``key`` in config.json, or reopen one that holds the same key;
    one holding other settings, or something else, is refused."""
    config = out / "config.json"
    if config.exists():
        held = read_json(config, "experiment record", ArcsimError)
        if held != key:
            changed = sorted(k for k in set(held) | set(key) if held.get(k) != key.get(k))
            raise ArcsimError(f"{out} holds runs with other settings ({', '.join(changed)} differ); give a new "
                              "--out, or delete that directory to start over")
    elif out.exists() and any(out.iterdir()):
        raise ArcsimError(f"{out} exists and is not an arcsim train directory; give a new --out")
    out.mkdir(parents=True, exist_ok=True)
    if not config.exists():
        write_atomic(config, json.dumps(key, indent=1))


def open_dir(out: Path, key: dict[str, Any], steps: int) -> set[tuple[str, int]]:
    """Create or reopen the experiment directory; returns the (compressor, seed) runs already finished."""
    claim_dir(out, key)
    history = load_history(out)
    complete = _complete(history, steps)
    if not complete.all() or _older(out):  # a run cut off by a kill: drop its rows, it is redone whole
        with atomic_path(out / "history.csv") as tmp:
            history[complete].to_csv(tmp, index=False, columns=list(HISTORY_COLUMNS))
        history = history[complete]
    return {(c, int(s)) for c, s in history[["compressor", "seed"]].itertuples(index=False)}


def _older(out: Path) -> bool:
    """A history written before a column was added (it is rewritten with the column, empty)."""
    path = out / "history.csv"
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open() as fh:
        return fh.readline().strip().split(",") != list(HISTORY_COLUMNS)


def _complete(history: pd.DataFrame, steps: int) -> pd.Series:
    """Rows that belong to runs that finished (all steps, or stopped by divergence)."""
    runs = history.groupby(["compressor", "seed"])
    return (runs["step"].transform("max") == steps) | runs["diverged"].transform("any").astype(bool)


def load_history(out: Path) -> pd.DataFrame:
    path = out / "history.csv" if out.is_dir() else out
    if not path.exists():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in HISTORY_COLUMNS})
    AppendOnlyCSV(path, HISTORY_COLUMNS).repair()  # a row cut off by a kill
    try:
        history = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ArcsimError(f"{path} is not an arcsim train history: {exc}") from None
    return history.reindex(columns=list(HISTORY_COLUMNS))  # an older history: the newer columns empty


def append_history(out: Path, rows: list[dict[str, Any]]) -> None:
    AppendOnlyCSV(out / "history.csv", HISTORY_COLUMNS).append(rows)


def estimate_seconds(cfg: TrainConfig, setup: Setup, runs: int) -> float | None:
    """How long ``runs`` runs take on this machine, from the compute profile measured here (None when it was
    given): every step trains each worker's batch; each evaluation runs forward over the held-out split."""
    if setup.profile_path is not None:
        return None
    held_out = setup.data.held_out()
    examples = len(held_out[0]) if held_out is not None else 0
    evaluations = math.ceil(cfg.steps / cfg.eval_every)
    step = cfg.workers * (setup.profile.forward_s + setup.profile.backward_s)
    return runs * (cfg.steps * step + evaluations * examples / cfg.batch * setup.profile.forward_s)


def run_experiment(cfg: TrainConfig, out: Path, topology: str | None = None, engine: str = "analytic",
                   announce: Callable[[str], None] = print,
                   progress: Callable[[int, int], None] | None = None, gpu: str | None = None,
                   library: str | None = None) -> pd.DataFrame:
    """Train every (compressor, seed) not yet in ``out``; returns the whole history. ``gpu`` and ``library``
    override the topology's GPU ("cpu": as measured here) and communication library for pricing."""
    cfg.check()
    topo: Topology | None = None
    if topology:
        topo = load_topology(topology).with_overrides(library=library, gpu=gpu.lower() if gpu else None)
    setup = prepare(cfg)  # every check before the directory is touched
    done = open_dir(out, run_key(cfg, topology, engine, gpu, library), cfg.steps)
    todo = [(c, s) for s in cfg.seeds for c in cfg.compressors if (c, s) not in done]
    if len(todo) < len(cfg.seeds) * len(cfg.compressors):
        announce(f"resuming: {len(cfg.seeds) * len(cfg.compressors) - len(todo)} runs are already in "
                 f"{out / 'history.csv'}")
    if todo:
        compute = priced_on(setup, topo)[0] if topo is not None else compute_times(setup)
        where = (f"priced: {compute.source}" if topo is not None else
                 f"measured on this machine: {compute.source}")
        announce(f"{setup.source.label} on {cfg.dataset}: {setup.elements:,} parameters in "
                 f"{len(setup.buckets)} bucket(s), {cfg.workers} workers × batch {cfg.batch}; compute "
                 f"{(compute.forward_s + compute.backward_s) * 1e3:.2f} ms per step ({where})")
        took = estimate_seconds(cfg, setup, len(todo))
        if took is not None:
            announce(f"estimate: {len(todo)} run(s) × {cfg.steps} steps × {cfg.workers} workers at "
                     f"{setup.profile.forward_s + setup.profile.backward_s:.3g} s a worker's step here ≈ "
                     f"{format_duration(took)} with the held-out evaluations (--input-size, --batch, --workers, "
                     "--steps or fewer --compressors shorten it)")
        total, done_steps = len(todo) * cfg.steps, [0]

        def tick(n: int) -> None:
            done_steps[0] += n
            if progress:
                progress(done_steps[0], total)

        for i, (compressor, seed) in enumerate(todo):
            hist = train(cfg, setup, compressor, seed, tick)
            collective, step_s = price(hist, setup, topo, engine) if topo is not None else (None, None)
            append_history(out, history_rows(hist, step_s, collective))
            done_steps[0] = (i + 1) * cfg.steps  # a diverged run ends early
            tick(0)
    history = load_history(out)
    wanted = {(c, s) for c in cfg.compressors for s in cfg.seeds}
    keep = [(c, int(s)) in wanted for c, s in history[["compressor", "seed"]].itertuples(index=False)]
    return history[keep]
