"""One sweep point: the compressor measured on the trace (cached per process), priced on the point's cluster.

Measuring a compressor on a trace is the expensive part and does not depend on the cluster, so each
process keeps the measurements it made: a chunk of points that share (trace, bucket, compressor,
density) measures once and prices many topologies. ``evaluate_chunk`` is what local worker processes and
Dask workers run; it takes and returns plain data.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from arcsim.errors import ArcsimError
from arcsim.sweep.spec import SweepError
from arcsim.topology import Topology, load_topology

ANALYSES_KEPT = 2  # traces held in memory per process (each caches its steps)

# the results table's columns, in order: the point, then what arcsim predicts for it
POINT_COLUMNS = ("point_id", "topology", "bandwidth_Bps", "latency", "ranks", "trace", "compressor", "density",
                 "bucket_mb", "engine", "gpu", "library", "fusion", "hierarchy", "memory", "seed")
RESULT_COLUMNS = ("topology_name", "nodes", "gpus_per_node", "world", "nic_gbps", "latency_us", "model", "params",
                  "trace_workers", "collective", "op", "iteration_s", "compute_s", "compress_s", "comm_s",
                  "exposed_comm_s", "dense_iteration_s", "speedup_vs_dense", "rel_error", "compression_gain",
                  "density_achieved", "bytes_per_rank", "effects_s")  # effects_s: the cluster's, apart from compute
COLUMNS = POINT_COLUMNS + RESULT_COLUMNS
# a point column named with its unit → the axis it holds (tables written before it had the axis's own name)
UNIT_COLUMNS = {"bandwidth_Bps": "bandwidth"}
# what a point prices when the axis is unset (and so what a table written before the axis existed holds)
UNSET_AXES = {"fusion": "bucket", "hierarchy": "flat"}
# the candidate's fields a row takes, as run.Candidate has them
CANDIDATE_COLUMNS = ("collective", "op", "iteration_s", "compute_s", "compress_s", "comm_s", "exposed_comm_s",
                     "rel_error", "compression_gain", "density_achieved", "bytes_per_rank", "effects_s")

_analyses: OrderedDict[tuple, Any] = OrderedDict()


def point_topology(point: Mapping[str, Any]) -> Topology:
    """The point's topology with its overrides: per-NIC bandwidth, latency, library, GPU and ranks (whole nodes)."""
    topo = load_topology(point["topology"])
    nodes = topo.nodes
    ranks = point.get("ranks")
    if ranks is not None:
        g = topo.gpus_per_node
        if ranks % g:
            raise SweepError(f"ranks {ranks} is not a whole number of {topo.name}'s nodes ({g} GPUs each); "
                             f"use a multiple of {g}")
        nodes = ranks // g
        if topo.network.fabric == "fat-tree" and topo.network.nodes_per_leaf and nodes % topo.network.nodes_per_leaf:
            raise SweepError(f"ranks {ranks}: {topo.name} is a fat tree of {topo.network.nodes_per_leaf} nodes per "
                             "leaf; use a multiple of that many nodes")
    return topo.with_overrides(point.get("bandwidth"), point.get("latency"), point.get("library"), nodes,
                               point.get("gpu"))


def _analysis(point: Mapping[str, Any]):
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    gpu = point_topology(point).gpu or "cpu"  # the point's topology names the GPU compute is priced on
    fusion = point.get("fusion") or UNSET_AXES["fusion"]
    live = _live(point)
    key = (point["trace"], point.get("params"), repr(live), point["bucket_mb"], point["memory"], point["seed"],
           point.get("compute_profile"), gpu, fusion)
    if key in _analyses:
        _analyses.move_to_end(key)
        return _analyses[key]
    synthetic = point.get("params") is not None
    cfg = RunConfig(trace=None if synthetic else point["trace"], params=point.get("params"), compressors=("dense",),
                    memory=point["memory"],
                    bucket_mb=point["bucket_mb"], policy="none",
                    ratios=(1.0,), compute_profile=point.get("compute_profile"), seed=point["seed"],
                    allow_capture=False, gpu=None if live is not None and live.on_gpu else gpu,
                    fusion=fusion, live=live)
    analysis = Analysis(cfg, announce=lambda _: None)
    _analyses[key] = analysis
    while len(_analyses) > ANALYSES_KEPT:
        _analyses.popitem(last=False)
    return analysis


def _live(point: Mapping[str, Any]):
    """The live training a point asks for (None: a trace or a synthetic model)."""
    from arcsim.traces.training import live_config

    if point.get("live") is None:
        return None
    return live_config(point["live"], point["live_workers"], point["live_steps"], point["live_device"], point["seed"],
                       dataset=point.get("live_dataset"))


def evaluate_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the results table."""
    from arcsim.pricing import Pricer
    from arcsim.run.candidates import candidates_for

    analysis = _analysis(point)
    topo = point_topology(point)
    ctx = dataclasses.replace(analysis.ctx, topo=topo, engine=point["engine"])
    pricer = Pricer(topo, point["engine"])
    hierarchy = point.get("hierarchy") or UNSET_AXES["hierarchy"]
    try:
        measured = analysis.measurement(point["compressor"], point["density"], hierarchy=hierarchy, topo=topo)
    except ArcsimError as exc:
        raise SweepError(f"hierarchy {hierarchy} on {topo.name}: {exc}") from None
    best = min(candidates_for(measured, ctx, pricer), key=lambda c: c.iteration_s)
    dense = min(candidates_for(analysis.measurement("dense", 1.0), ctx, pricer), key=lambda c: c.iteration_s)
    meta = analysis.trace.meta
    row = {k: point.get(UNIT_COLUMNS.get(k, k)) for k in POINT_COLUMNS}
    row["memory"] = best.memory
    row["gpu"] = topo.gpu or "cpu"
    row["library"] = topo.library
    row["fusion"] = point.get("fusion") or UNSET_AXES["fusion"]
    row["hierarchy"] = hierarchy
    if point.get("live") is not None:  # the trace column names the gradients' source
        dataset = f" on {point['live_dataset']}" if point.get("live_dataset") else ""
        row["trace"] = (f"live:{meta.get('model')}{dataset} ({point['live_workers']} workers × "
                        f"{point['live_steps']} steps, {point['live_device']})")
    row.update(topology_name=topo.name, nodes=topo.nodes, gpus_per_node=topo.gpus_per_node, world=topo.ranks,
               nic_gbps=topo.network.bandwidth_per_nic * 8 / 1e9, latency_us=topo.network.latency * 1e6,
               model=meta.get("model"), params=int(meta["params"]), trace_workers=analysis.trace.workers)
    # the candidate's own fields, written through (its speed-up is against a different baseline: not copied)
    row.update({k: v for k, v in best.to_dict().items() if k in CANDIDATE_COLUMNS})
    row.update(dense_iteration_s=dense.iteration_s, speedup_vs_dense=dense.iteration_s / best.iteration_s)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def evaluate_chunk(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for a chunk of points (run in a worker process or on a Dask worker)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several workers share the machine's cores
    try:
        return [evaluate_point(p) for p in points]
    finally:
        torch.set_num_threads(threads)  # in-process (-j 1) the caller's setting comes back
