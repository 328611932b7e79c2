"""Run a sweep: check every point first, then evaluate chunks on local processes or a Dask cluster,
appending rows as chunks finish (resumable), with a progress bar."""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from arcsim.files import writable_cache_dir
from arcsim.processes import die_with_parent, forkserver, signals_interrupt
from arcsim.sweep.evaluate import evaluate_chunk, point_topology
from arcsim.sweep.spec import SweepError, SweepSpec
from arcsim.sweep.store import ResultStore

CHUNKS_PER_WORKER = 4  # enough chunks to balance the load; few enough that measurements are rarely repeated
POINT_NEEDS = ["torch", "arcsim.sweep.evaluate", "arcsim.run.analysis", "arcsim.run.config", "arcsim.pricing",
               "arcsim.run.candidates"]  # what evaluate_chunk imports: once, by the pool's forkserver


@dataclass
class SweepOutcome:
    total: int
    already_done: int
    computed: int
    interrupted: bool = False


def check_points(spec: SweepSpec, announce: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every point, checked before anything runs: topologies build, traces exist and open (known models
    are captured now, once), profiles exist."""
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    writable_cache_dir()
    points = spec.points()
    if not points:
        raise SweepError("the sweep has no points")
    for combo in {(p["topology"], p["bandwidth"], p["latency"], p["ranks"], p.get("hierarchy")) for p in points}:
        topo = point_topology(dict(zip(("topology", "bandwidth", "latency", "ranks"), combo[:4], strict=True)))
        if combo[4] == "node" and (topo.gpus_per_node < 2 or topo.nodes < 2):
            raise SweepError(f"hierarchy node on {topo.name}: node-aware compression needs two or more nodes of "
                             "two or more GPUs; drop node from the hierarchy axis or pick such a topology")
    for trace in spec.axes["trace"]:
        if trace is not None:
            open_trace(resolve_trace(trace, allow_capture=True, announce=announce))
    profile = spec.compute_profile
    if profile and not Path(profile).is_file():
        raise SweepError(f"compute_profile {profile} does not exist; write one with `arcsim trace profile`")
    return points


def chunk_points(points: list[dict[str, Any]], workers: int) -> list[list[dict[str, Any]]]:
    """Chunks of points that share a measurement (trace, bucket, compressor, density), split for balance."""
    def key(p: dict[str, Any]) -> tuple:
        return str(p["trace"]), p["bucket_mb"], p["compressor"], p["density"]

    size = max(1, math.ceil(len(points) / (workers * CHUNKS_PER_WORKER)))
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for p in sorted(points, key=key):
        groups.setdefault(key(p), []).append(p)
    return [g[i:i + size] for g in groups.values() for i in range(0, len(g), size)]


def _local(chunks: list[list[dict[str, Any]]], workers: int) -> Iterator[list[dict[str, Any]]]:
    if workers == 1:
        for c in chunks:
            yield evaluate_chunk(c)
        return
    # forked from a server that imported what a point needs once (spawned, each worker imported torch: 2 s of CPU)
    pool = forkserver(POINT_NEEDS).Pool(workers, initializer=_pool_worker, initargs=(os.getpid(), dict(os.environ)))
    try:
        yield from pool.imap_unordered(evaluate_chunk, chunks)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _pool_worker(sweep_pid: int, environ: dict[str, str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sweep decides; it terminates the pool
    die_with_parent(sweep_pid)  # and if the sweep is killed outright, the workers go with it
    os.environ.clear()  # the sweep's (ARCSIM_CACHE_DIR, …), not what its forkserver started with
    os.environ.update(environ)


def connect(address: str):
    """A Dask client for ``address``, or one clear error."""
    try:
        from distributed import Client
    except ImportError:
        raise SweepError("--scheduler needs dask.distributed; install arcsim with the 'dask' extra") from None
    try:
        return Client(address, timeout="5s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise SweepError(f"cannot reach the Dask scheduler at {address} ({exc.__class__.__name__}); start one "
                         "with `dask scheduler` (and workers), or drop --scheduler to run here") from None


def _dask(chunks: list[list[dict[str, Any]]], client) -> Iterator[list[dict[str, Any]]]:
    from distributed import as_completed

    try:
        futures = client.map(evaluate_chunk, chunks, pure=False)
        try:
            for fut in as_completed(futures):
                yield fut.result()
        finally:
            client.cancel(futures)
    finally:
        client.close()


def run_sweep(spec: SweepSpec, out: Path, scheduler: str | None = None, workers: int | None = None,
              announce: Callable[[str], None] = print, show_progress: bool = True,
              points: list[dict[str, Any]] | None = None) -> SweepOutcome:
    """Evaluate every point not yet in ``out``; rows land in ``out/results.csv`` as chunks finish (a progress
    bar on stderr when it is a terminal and ``show_progress``). ``points``: already checked."""
    points = check_points(spec, announce) if points is None else points
    client = connect(scheduler) if scheduler else None  # before anything is written
    store = ResultStore(out)
    try:
        done = store.open(spec)
    except BaseException:
        if client is not None:
            client.close()
        raise
    todo = [p for p in points if p["point_id"] not in done]
    outcome = SweepOutcome(total=len(points), already_done=len(points) - len(todo), computed=0)
    if outcome.already_done:
        announce(f"resuming: {outcome.already_done} of {len(points)} points are already in {store.results}")
    if not todo:
        if client is not None:
            client.close()
        return outcome
    if client is not None:
        workers = sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values())
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    chunks = chunk_points(todo, workers)
    source = _dask(chunks, client) if client is not None else _local(chunks, workers)
    bar = tqdm(total=len(points), initial=outcome.already_done, desc="sweep", unit="point",
               disable=None if show_progress else True,
               file=sys.stderr, smoothing=0.1)
    try:
        with signals_interrupt(signal.SIGTERM):
            for rows in source:
                store.append(rows)
                outcome.computed += len(rows)
                bar.update(len(rows))
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        bar.close()
        if hasattr(source, "close"):
            source.close()  # terminates the pool or cancels the Dask futures
    return outcome



