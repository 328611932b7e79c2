"""`arcsim validate`: measured torchrun-style DDP runs on the emulated cluster against arcsim's prediction.

For every (ranks, bandwidth): build the emulated cluster; calibrate its collectives; run the validation
worker in every rank (compute as run with all ranks competing for the cores, then real DDP steps with
each compressor's comm hook); tear the cluster down; capture a trace of the same model with that many
workers (once per rank count); predict each compressor's iteration with `arcsim run` on the calibrated
topology with the measured compute profile. The training is repeated ``repeats`` times in fresh
processes: a case's measured iteration is the median over the repeats of each repeat's median, its
spread the repeats' min–max (run-to-run noise), and the MAPE is over these medians; a second figure
counts the predictions inside the spread. Finished cases are kept in ``validation/cases.jsonl`` and a
validation run again with the same settings resumes after them.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from arcsim.catalog import AG_FAMILY, COMPRESSORS, DDP_BUCKET_MB, DENSITY_FREE
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.plotting import save_png
from arcsim.run.tables import Column, read_table
from arcsim.testbed import VALIDATE_WORKER
from arcsim.testbed.cluster import PREFIX

if TYPE_CHECKING:
    from arcsim.pricing import Pricer
    from arcsim.run.measurement import Measurement


@dataclass
class ValidateConfig:
    ranks: tuple[int, ...] = (2, 4)
    bandwidths: tuple[str, ...] = ("1Gbit", "100Mbit")
    delay: str = "0s"  # one-way, added by the emulated cluster's forwarder
    compressors: tuple[str, ...] = ("dense", "topk", "arctopk", "star", "powersgd")
    model: str = "mlp_wide"
    dataset: str | None = "digits"
    density: float = 0.01
    memory: str = "ef14"
    steps: int = 30
    warmup: int = 5
    batch: int = 32
    bucket_mb: float = DDP_BUCKET_MB
    seed: int = 0
    out_dir: Path = Path("reports")
    calib_sizes: tuple[int, ...] = tuple(256 * 4**i for i in range(8))  # 256 B … 4 MiB: latency and bandwidth
    calib_repeats: int = 9
    repeats: int = 3  # DDP trainings per case, each in fresh processes
    ranks_per_node: int = 1  # >1: ranks share a node's namespace (loopback between them), one shaped link out
    hierarchies: tuple[str, ...] = ("flat",)  # flat and/or node (node-aware hooks over node and rail groups)
    prefix: str = PREFIX  # the emulated cluster's namespace names


def case_tag(cfg: ValidateConfig, ranks: int, bandwidth: str) -> str:
    """How a case's files are named: ranks (and ranks per node), link rate."""
    return f"{ranks}r{'' if cfg.ranks_per_node == 1 else f'x{cfg.ranks_per_node}'}-{bandwidth}"


def _case(cfg: ValidateConfig, ranks: int, bandwidth: str, work: Path,
          note: Callable[[str], None]) -> tuple[Path, dict[str, tuple[Path, list[dict[str, Any]]]]]:
    """Calibrate and measure one (ranks, bandwidth) case in every hierarchy; returns the topology and, per
    hierarchy, (compute profile, times of every repeat)."""
    from arcsim.testbed.calibrate import fits_from, group_fits, microbench, topology_text, write_topology
    from arcsim.testbed.cluster import EmulatedCluster

    tag, g = case_tag(cfg, ranks, bandwidth), cfg.ranks_per_node
    with EmulatedCluster(ranks, bandwidth, cfg.delay, prefix=cfg.prefix, ranks_per_node=g) as cluster:
        note(f"[{tag}] calibrating collectives{'' if g == 1 else ' (world, inside nodes, along rails)'} …")
        measured = microbench(cluster, ranks, cfg.calib_sizes, cfg.calib_repeats, gpus_per_node=g)
        for hierarchy in cfg.hierarchies:
            (work / f"{tag}-{hierarchy}.json").write_text(json.dumps(worker_config(cfg, hierarchy)))
            for k in range(cfg.repeats):
                note(f"[{tag}] training {cfg.model} with {', '.join(cfg.compressors)} ({cfg.steps} steps each"
                     f"{', node-aware' if hierarchy == 'node' else ''}), run {k + 1} of {cfg.repeats} …")
                cluster.run(VALIDATE_WORKER, [str(work / f"{tag}-{hierarchy}.json"),
                                              str(work / f"{tag}-{hierarchy}-r{k}-")], 1800)
    topo = cfg.out_dir / "validation" / f"topo-{tag}.yaml"
    write_topology(topo, topology_text(topo.stem, ranks, fits_from(measured, ranks),
                                       f"emulated cluster, {ranks} ranks, {link_label(cfg, bandwidth)}", g,
                                       group_fits(measured)))
    out = {}
    for hierarchy in cfg.hierarchies:
        stem = work / f"{tag}-{hierarchy}"
        times = [json.loads(Path(f"{stem}-r{k}-times.json").read_text()) for k in range(cfg.repeats)]
        profile = cfg.out_dir / "validation" / f"compute-{tag}{'' if hierarchy == 'flat' else '-node'}.json"
        profile.write_text(json.dumps(median_profile([json.loads(Path(f"{stem}-r{k}-profile.json").read_text())
                                                      for k in range(cfg.repeats)])))
        out[hierarchy] = (profile, times)
    return topo, out


def median_profile(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """One compute profile from every repeat's: the one whose compute (forward, backward and what follows) is the
    median, with each compressor's compression-as-run factor the median over the repeats."""
    from arcsim.traces.profile import ComputeProfile

    chosen = sorted(profiles, key=lambda p: ComputeProfile.from_json(p, "a repeat's profile").compute_s)[
        (len(profiles) - 1) // 2]
    scales = [p["extra"]["compress_scale"] for p in profiles if "compress_scale" in p["extra"]]
    if scales:
        chosen["extra"]["compress_scale"] = {c: float(np.median([s[c] for s in scales])) for c in scales[0]}
    return chosen


def _trace(cfg: ValidateConfig, ranks: int) -> Path:
    from arcsim.traces.capture import CaptureConfig, capture

    path = cfg.out_dir / "validation" / f"trace-{cfg.model}-{ranks}w.npz"
    capture(CaptureConfig(model=cfg.model, dataset=cfg.dataset, workers=ranks, steps=3, every=1, warmup=5,
                          batch=cfg.batch, dtype="fp32", seed=cfg.seed, out=path))
    return path


def core_sharing(ranks: int) -> float:
    """How much slower one rank's compression runs when all ranks of an emulated cluster compress at once
    on this machine's cores (1 where every rank has a core; a real cluster is 1)."""
    return max(1.0, ranks / (os.cpu_count() or 1))


@contextmanager
def ranks_priority(realtime: bool) -> Iterator[None]:
    """This thread under the scheduling the emulated ranks ran under (real-time, ``chrt -f 1``, where they did
    and it is allowed). Compression as run is the ranks' timing over rank 0's one-rank timing, both at that
    priority, so the prediction's own one-rank timing must be too: at normal priority other work on the machine
    inflates it (measured on this shared machine: one-rank Top-K 27.5 ms against 5.8–6.7 in quiet runs)."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        if realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        realtime = False
    try:
        yield
    finally:
        if realtime:
            os.sched_setscheduler(0, *before)


def _predict(cfg: ValidateConfig, topo: Path, trace: Path, profile: Path,
             compress_scale: float | dict[str, float] = 1.0, hierarchy: str = "flat",
             realtime: bool = False) -> dict[str, dict[str, float]]:
    """``arcsim run``'s prediction of every compressor, compression timed on one thread (``realtime``: at the
    emulated ranks' real-time priority, :func:`ranks_priority`)."""
    import torch

    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    run = RunConfig(topology=str(topo), trace=str(trace), compressors=tuple(cfg.compressors),
                    density=cfg.density, memory=cfg.memory, bucket_mb=cfg.bucket_mb, policy="none",
                    ratios=(cfg.density,), compute_profile=str(profile), seed=cfg.seed, allow_capture=False,
                    compress_scale=compress_scale, hierarchy=hierarchy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # time compression as a rank runs it (one thread, as torchrun sets)
    try:
        analysis = Analysis(run, announce=lambda _: None)
        with ranks_priority(realtime):
            result = analysis.run()
    finally:
        torch.set_num_threads(threads)
    # compute as the ranks' phases measure it: with the emulated cluster's effects (stragglers, interference)
    return {c.compressor: {"iteration_s": c.iteration_s, "compute_s": c.compute_stream_s, "compress_s": c.compress_s,
                           "comm_s": c.comm_s, "node_comm_s": in_node_seconds(c.measurement, analysis.pricer)}
            for c in result.candidates}


def in_node_seconds(meas: Measurement | None, pricer: Pricer) -> float:
    """What a step's collectives inside the node (node-aware: every bucket's reduce-scatter and all-gather)
    are priced at, the mean over the measured steps; 0 for flat compression."""
    if meas is None:
        return 0.0
    return float(np.mean([sum(p.time_s for recs in step for p in pricer.records([r for r in recs if r.group == "node"]))
                          for step in meas.records]))


def compare(cfg: ValidateConfig, ranks: int, label: str, topo: Path, trace: Path, profile: Path,
            runs: list[dict[str, Any]], sharing: float = 1.0, hierarchy: str = "flat",
            realtime: bool = False) -> list[dict[str, Any]]:
    """Predict every compressor of one measured case and pair it with the measurement: the median over the
    runs of each run's median iteration, the runs' min–max as the spread, and the pooled 10th–90th
    percentiles of single iterations. Compression is scaled by what the worker measured of it as run
    (``compress_scale`` in the profile); a profile without it by ``sharing`` (ranks ÷ cores). ``hierarchy``:
    how the runs compressed (flat, or node-aware), and so how they are predicted; ``realtime``: the ranks ran
    at real-time priority (:func:`ranks_priority`)."""
    extra = json.loads(profile.read_text()).get("extra", {})
    measured_scale, where = extra.get("compress_scale"), extra.get("machine", "unknown")
    compress_scale = {c: measured_scale.get(c, sharing) for c in cfg.compressors} if measured_scale else sharing
    predicted = _predict(cfg, topo, trace, profile, compress_scale, hierarchy, realtime)
    rows = []
    for name in cfg.compressors:
        medians = [float(np.median(run[name]["iteration_s"])) for run in runs]
        pooled = np.concatenate([np.asarray(run[name]["iteration_s"]) for run in runs])
        measured, lo, hi = float(np.median(medians)), min(medians), max(medians)
        p = predicted[name]
        rows.append({"ranks": ranks, "ranks_per_node": cfg.ranks_per_node, "hierarchy": hierarchy,
                     "bandwidth": label, "machine": where, "model": cfg.model, "compressor": name,
                     "density": cfg.density if name not in ("dense", "fp16", "bf16") else 1.0,
                     "collective": "allgather" if name in AG_FAMILY else "allreduce",
                     "measured": measured * 1e3, "predicted": p["iteration_s"] * 1e3,
                     "spread_min": lo * 1e3, "spread_max": hi * 1e3, "runs": len(runs),
                     "inside_spread": lo <= p["iteration_s"] <= hi,
                     "measured_s": measured, "measured_p10_s": float(np.percentile(pooled, 10)),
                     "measured_p90_s": float(np.percentile(pooled, 90)), "predicted_s": p["iteration_s"],
                     "error": p["iteration_s"] / measured - 1, "predicted_compute_s": p["compute_s"],
                     "predicted_compress_s": p["compress_s"], "predicted_comm_s": p["comm_s"],
                     "predicted_node_comm_s": p["node_comm_s"],
                     "steps": len(pooled) // len(runs),
                     "compress_scale": compress_scale if isinstance(compress_scale, float) else compress_scale[name],
                     "compress_scale_source": "measured as run" if measured_scale else "ranks ÷ cores",
                     "measured_hook_s": float(np.median([np.median(run[name]["hook_s"]) for run in runs])),
                     **measured_phases([run[name] for run in runs])})
    return rows


def measured_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Where a compressor's measured iterations went (median over runs, ranks and iterations of each phase the
    worker times; a phase it did not time yet — the collectives inside the node before they were timed — is
    left out), and the arrival skew at the hook's first collective: per iteration, the last rank's arrival at
    the hook minus the mean arrival."""
    from arcsim.testbed.validate_worker import PHASES

    runs = [run for run in runs if "phases" in run]  # measured before the worker timed phases: none
    if not runs:
        return {}
    out = {f"measured_{name}": float(np.median([np.median(run["phases"][name]) for run in runs]))
           for name in PHASES if all(name in run["phases"] for run in runs)}
    skews = [np.median(np.max(b, axis=0) - np.mean(b, axis=0)) for b in
             (np.asarray(run["phases"]["before_hook_s"]) for run in runs)]
    out["measured_arrival_skew_s"] = float(np.median(skews))
    return out


def worker_config(cfg: ValidateConfig, hierarchy: str = "flat") -> dict[str, Any]:
    """What every rank of the validation worker needs (written as JSON for torchrun on a real cluster)."""
    return {"model": cfg.model, "dataset": cfg.dataset, "batch": cfg.batch, "seed": cfg.seed, "steps": cfg.steps,
            "warmup": cfg.warmup, "bucket_mb": cfg.bucket_mb, "density": cfg.density, "memory": cfg.memory,
            "compressors": list(cfg.compressors), "gpus_per_node": cfg.ranks_per_node, "hierarchy": hierarchy}


def run_validation(cfg: ValidateConfig, note: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every (ranks, bandwidth) case on the emulated cluster; cases finished by an earlier run with the same
    settings (``validation/cases.jsonl``) are kept, not measured again."""
    from arcsim.testbed.cluster import check_available, check_prefix, realtime_allowed, refuse_if_up
    from arcsim.units import parse_duration

    check_available()
    check_prefix(cfg.prefix)
    done = finished_cases(cfg)
    todo = {ranks: [b for b in cfg.bandwidths if (ranks, link_label(cfg, b)) not in done] for ranks in cfg.ranks}
    if any(todo.values()):
        refuse_if_up(cfg.prefix)  # before the traces are captured, not after (and not where nothing is left)
    realtime = parse_duration(cfg.delay) == 0 and realtime_allowed()  # as the cluster runs its ranks
    (cfg.out_dir / "validation").mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in cfg.ranks:
            rows += [r for b in cfg.bandwidths if (ranks, link_label(cfg, b)) in done
                     for r in done[(ranks, link_label(cfg, b))]]
            if not todo[ranks]:
                note(f"{ranks} ranks: every link rate is in {cases_path(cfg)} already")
                continue
            note(f"capturing a {cfg.model} trace with {ranks} workers …")
            trace = _trace(cfg, ranks)
            for bandwidth in todo[ranks]:
                topo, by_hierarchy = _case(cfg, ranks, bandwidth, Path(tmp), note)
                case = [row for hierarchy, (profile, runs) in by_hierarchy.items()
                        for row in compare(cfg, ranks, link_label(cfg, bandwidth), topo, trace, profile, runs,
                                           core_sharing(ranks), hierarchy, realtime)]
                keep_case(cfg, case)
                rows += case
    order = {(r, link_label(cfg, b)): i for i, (r, b) in enumerate((r, b) for r in cfg.ranks for b in cfg.bandwidths)}
    return sorted(rows, key=lambda row: order[(row["ranks"], row["bandwidth"])])


def cases_path(cfg: ValidateConfig) -> Path:
    return cfg.out_dir / "validation" / "cases.jsonl"


def _settings(cfg: ValidateConfig) -> dict[str, Any]:
    """What a finished case depends on besides its ranks and link: a resumed run must match all of it."""
    return {**worker_config(cfg), "hierarchies": list(cfg.hierarchies), "delay": cfg.delay, "repeats": cfg.repeats,
            "calib_sizes": list(cfg.calib_sizes), "calib_repeats": cfg.calib_repeats}


def keep_case(cfg: ValidateConfig, rows: list[dict[str, Any]]) -> None:
    """Append one finished case (all its rows) as one JSON line: a kill between cases loses nothing."""
    line = json.dumps({"settings": _settings(cfg), "rows": rows}, default=float)
    with cases_path(cfg).open("a") as fh:
        fh.write(line + "\n")


def finished_cases(cfg: ValidateConfig) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """(ranks, link label) → rows of the cases an earlier run with these settings finished."""
    path, out = cases_path(cfg), {}
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        try:
            case = json.loads(line)
        except json.JSONDecodeError:  # a line cut off by a kill: that case is measured again
            continue
        if case.get("settings") == _settings(cfg) and case.get("rows"):
            first = case["rows"][0]
            out[(int(first["ranks"]), str(first["bandwidth"]))] = case["rows"]
    return out


def link_label(cfg: ValidateConfig, bandwidth: str) -> str:
    """How a case's link is named in the table: the rate, plus the one-way delay when one was added."""
    from arcsim.units import parse_duration

    return bandwidth if parse_duration(cfg.delay) == 0 else f"{bandwidth}+{cfg.delay}"


def validate_measured(cfg: ValidateConfig, measured: Path, topology: Path,
                      note: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """A case measured on a real cluster under torchrun (``measured/real-times.json``, ``real-profile.json``)."""
    times_path, profile = measured / "real-times.json", measured / "real-profile.json"
    for path in (times_path, profile, topology):
        if not path.exists():
            raise ArcsimError(f"{path} is missing; run the validation worker under torchrun first "
                              "(see docs/validation.md)")
    config = json.loads((measured / "config.json").read_text()) if (measured / "config.json").exists() else {}
    for key in ("model", "dataset", "batch", "density", "memory", "seed", "bucket_mb"):
        if key in config:
            setattr(cfg, key, config[key])
    times = json.loads(times_path.read_text())
    cfg.compressors = tuple(times)
    runs = [times]
    ranks = int(json.loads(profile.read_text())["extra"]["ranks"])
    (cfg.out_dir / "validation").mkdir(parents=True, exist_ok=True)
    note(f"capturing a {cfg.model} trace with {ranks} workers …")
    return compare(cfg, ranks, topology.stem, topology, _trace(cfg, ranks), profile, runs)


def setting(row: dict[str, Any]) -> tuple[int, str, str]:
    """A row's cluster setting: ranks, link and hierarchy (rows from before hierarchies were flat)."""
    return int(row["ranks"]), str(row["bandwidth"]), str(row.get("hierarchy", "flat"))


def what_ran(rows: list[dict[str, Any]]) -> str:
    """The model(s) and the density the compressors ran at, from the rows (dense's rows say density 1), e.g.
    'mlp_wide, density 0.01'."""
    models = ", ".join(dict.fromkeys(str(r["model"]) for r in rows))
    sparse = sorted({float(r["density"]) for r in rows if r["compressor"] not in DENSITY_FREE})
    if not sparse:
        return models
    return f"{models}, densit{'y' if len(sparse) == 1 else 'ies'} {', '.join(f'{d:g}' for d in sparse)}"


def setting_label(key: tuple[int, str, str], per_node: int = 1) -> str:
    ranks, bandwidth, hierarchy = key
    nodes = "" if per_node == 1 else f" ({per_node} per node)"
    return f"{ranks} ranks{nodes}, {bandwidth}" + ("" if hierarchy == "flat" else ", node-aware")


def _mape(rows: list[dict[str, Any]], field: str) -> dict[str, float]:
    return {v: float(np.mean([abs(r["error"]) for r in rows if str(r.get(field, "flat")) == v]))
            for v in dict.fromkeys(str(r.get(field, "flat")) for r in rows)}


TERMS = ("compute", "hook", "other")


def terms(row: dict[str, Any]) -> dict[str, tuple[float, float]] | None:
    """(measured, predicted) seconds of each term of a case's iteration, or None for rows measured before the
    worker timed phases. compute: forward and backward (the phases before and after the hook); hook: the
    compression and the collectives (inside the node too) together (a rank waiting in a collective for one still
    compressing on shared cores moves time between the two, so only their sum compares); other: the rest of
    the iteration (measured: the barrier and what no phase holds; predicted: minus what overlaps backward)."""
    if "measured_hook_local_s" not in row or not np.isfinite(float(row["measured_hook_local_s"])):
        return None
    compute = (float(row["measured_before_hook_s"]) + float(row["measured_after_hook_s"]),
               float(row["predicted_compute_s"]))
    in_node = float(row.get("measured_hook_node_s", 0.0))  # before it was timed: inside hook_local_s
    hook = (float(row["measured_hook_local_s"]) + (in_node if np.isfinite(in_node) else 0.0)
            + float(row["measured_hook_comm_s"]), float(row["predicted_compress_s"]) + float(row["predicted_comm_s"]))
    other = (float(row["measured_s"]) - compute[0] - hook[0], float(row["predicted_s"]) - compute[1] - hook[1])
    return dict(zip(TERMS, (compute, hook, other), strict=True))


def worst_term(row: dict[str, Any]) -> dict[str, Any] | None:
    """The term whose prediction is furthest from its measurement: its name, both times and the gap (s), the
    gap as a share of the measured iteration, and the case's whole error for comparison."""
    split = terms(row)
    if split is None:
        return None
    name = max(split, key=lambda t: abs(split[t][1] - split[t][0]))
    measured, predicted = split[name]
    return {"term": name, "measured_s": measured, "predicted_s": predicted, "gap_s": predicted - measured,
            "share": (predicted - measured) / float(row["measured_s"]), "error": float(row["error"])}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE over the cases' medians, the share of predictions inside the measured spread, the MAPE per
    compressor and per hierarchy, whether the predicted faster of all-gather and all-reduce matches the
    measured one, and for each case outside the spread the term furthest off (:func:`worst_term`)."""
    mape = float(np.mean([abs(r["error"]) for r in rows])) if rows else float("nan")
    inside = sum(bool(r.get("inside_spread")) for r in rows)
    checks = []
    for key in sorted({setting(r) for r in rows}):
        case = [r for r in rows if setting(r) == key]
        ag = [r for r in case if r["collective"] == "allgather"]
        ar = [r for r in case if r["collective"] == "allreduce" and r["compressor"] not in ("dense", "fp16", "bf16")]
        if not ag or not ar:
            continue
        best_ag = min(ag, key=lambda r: r["measured_s"])
        best_ar = min(ar, key=lambda r: r["measured_s"])
        gap = abs(best_ag["measured_s"] / best_ar["measured_s"] - 1)
        measured_ag = best_ag["measured_s"] < best_ar["measured_s"]
        predicted_ag = min(r["predicted_s"] for r in ag) < min(r["predicted_s"] for r in ar)
        checks.append({"ranks": key[0], "bandwidth": key[1], "hierarchy": key[2], "measured_gap": gap,
                       "measured_faster": "allgather" if measured_ag else "allreduce",
                       "predicted_faster": "allgather" if predicted_ag else "allreduce",
                       "counts": gap > 0.10, "agrees": measured_ag == predicted_ag})
    outside = [{"ranks": int(r["ranks"]), "bandwidth": str(r["bandwidth"]), "hierarchy": setting(r)[2],
                "compressor": str(r["compressor"]), **term}
               for r in rows if not bool(r.get("inside_spread")) and (term := worst_term(r)) is not None]
    return {"mape": mape, "cases": len(rows), "inside_spread": inside, "mape_by_compressor": _mape(rows, "compressor"),
            "mape_by_hierarchy": _mape(rows, "hierarchy"), "ag_ar": checks, "outside_by_term": outside}


_TIME, _NUMBER, _LATER = Column(float, positive=True), Column(float), Column(float, required=False)
REPORT_COLUMNS = {  # every column compare() writes; the optional ones were added after the first reports
    "ranks": Column(int, positive=True), "ranks_per_node": Column(int, positive=True, required=False),
    "hierarchy": Column(str, required=False), "bandwidth": Column(str), "machine": Column(str, required=False),
    "model": Column(str), "compressor": Column(str), "density": Column(float, positive=True),
    "collective": Column(str), "measured": _TIME, "predicted": _TIME, "spread_min": _TIME, "spread_max": _TIME,
    "runs": Column(int, positive=True), "inside_spread": Column(bool), "measured_s": _TIME,
    "measured_p10_s": _LATER, "measured_p90_s": _LATER, "predicted_s": _TIME, "error": _NUMBER,
    "predicted_compute_s": _LATER, "predicted_compress_s": _LATER, "predicted_comm_s": _LATER,
    "steps": Column(int, positive=True, required=False), "compress_scale": _LATER,
    "compress_scale_source": Column(str, required=False), "measured_hook_s": _LATER, "predicted_node_comm_s": _LATER,
    **{f"measured_{phase}_s": _LATER for phase in ("before_hook", "hook_local", "hook_node", "hook_comm",
                                                   "after_hook", "arrival_skew")}}


REPORT_FILLED = ("ranks_per_node", "hierarchy", "machine", "steps")  # later columns: absent in old reports, never empty


def read_report(path: Path) -> list[dict[str, Any]]:
    """The rows of a validation CSV that :func:`write_outputs` wrote, every column parsed by its type and every
    row's values checked against their domain (:func:`row_problem`)."""
    what = "the validation.csv that arcsim validate wrote"
    frame = read_table(path, REPORT_COLUMNS, what)
    if frame.empty:
        raise ArcsimError(f"{path} holds no rows; give {what}")
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in frame.to_dict("records")]
    for line, row in enumerate(rows, start=2):
        problem = row_problem(row)
        if problem is not None:
            raise ArcsimError(f"{path} line {line}, column {problem[0]}: {problem[1]}")
    return rows


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def row_problem(row: dict[str, Any]) -> tuple[str, str] | None:
    """The first column of a report row outside its domain and what to give instead; None for a sound row."""
    empty = next((c for c in REPORT_FILLED if c in row and _empty(row[c])), None)
    if empty is not None:
        return empty, "is empty; fill it in (every row has one where the column exists) or drop the column"
    ranks, per_node, hierarchy = row["ranks"], row.get("ranks_per_node", 1), row.get("hierarchy", "flat")
    lo, mid, hi = row["spread_min"], row["measured"], row["spread_max"]
    p10, p90, scale = (row.get(c, math.nan) for c in ("measured_p10_s", "measured_p90_s", "compress_scale"))
    checks = (
        ("ranks", ranks >= 2, f"{ranks}; give 2 or more (a collective needs peers)"),
        ("ranks_per_node", per_node <= ranks and ranks % per_node == 0,
         f"{per_node} does not divide the row's {ranks} ranks into whole nodes; give a divisor of ranks"),
        ("hierarchy", hierarchy in ("flat", "node"), f"{hierarchy!r}; give flat or node"),
        ("hierarchy", hierarchy != "node" or per_node >= 2, "node with one rank per node; give flat, or the "
                                                             "ranks_per_node (2 or more) the case ran with"),
        ("density", 0 < row["density"] <= 1, f"{row['density']:g} lies outside (0, 1]; give the k/d the case ran "
                                             "at (1 for dense)"),
        ("spread_min", lo <= mid <= hi, f"spread_min {lo:g}, measured {mid:g} and spread_max {hi:g} are out of "
                                        "order; the runs' min, median and max give spread_min ≤ measured ≤ "
                                        "spread_max"),
        ("measured_p10_s", _empty(p10) or _empty(p90) or p10 <= p90, f"{p10} is above measured_p90_s {p90}; "
                                                                     "give p10 ≤ p90"),
        ("compress_scale", _empty(scale) or scale > 0, f"{scale}; give a factor above 0"),
        ("collective", row["collective"] in ("allgather", "allreduce"),
         f"{row['collective']!r}; give allgather or allreduce"),
        ("compressor", row["compressor"] in COMPRESSORS,
         f"unknown compressor {row['compressor']!r}; give one of {', '.join(COMPRESSORS)}"),
    )
    return next(((column, why) for column, ok, why in checks if not ok), None)


def write_outputs(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    import pandas as pd
    from matplotlib.figure import Figure

    if not rows:
        raise ArcsimError("no validation cases ran")
    csv = out_dir / "validation.csv"
    write_atomic(csv, pd.DataFrame(rows).to_csv(index=False))
    fig = Figure(figsize=(6.5, 6), layout="constrained")
    ax = fig.subplots()
    from matplotlib.lines import Line2D

    from arcsim.plotting import MARKERS, PALETTE

    names = sorted({r["compressor"] for r in rows})
    settings = sorted({setting(r) for r in rows})  # bandwidth: a label (1Gbit, cluster)
    per_node = int(rows[0].get("ranks_per_node", 1))
    for i, name in enumerate(names):  # colour: compressor; marker: cluster setting (ranks, link rate, hierarchy)
        for j, key in enumerate(settings):
            pts = [r for r in rows if r["compressor"] == name and setting(r) == key]
            if pts:
                ax.errorbar([r["measured"] for r in pts], [r["predicted"] for r in pts],
                            xerr=[[r["measured"] - r["spread_min"] for r in pts],
                                  [r["spread_max"] - r["measured"] for r in pts]],
                            fmt=MARKERS[j % len(MARKERS)], ms=6, capsize=2, color=PALETTE[i % len(PALETTE)])
    colour_keys = [Line2D([], [], color=PALETTE[i % len(PALETTE)], marker="o", ls="", label=n)
                   for i, n in enumerate(names)]
    marker_keys = [Line2D([], [], color="k", marker=MARKERS[j % len(MARKERS)], ls="", mfc="none",
                          label=setting_label(key, per_node)) for j, key in enumerate(settings)]
    lo = min(min(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 0.8
    hi = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="prediction = measurement")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15, label="±10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured iteration time (ms; median of {rows[0]['runs']} runs, bars: their min–max)")
    ax.set_ylabel("arcsim's predicted iteration time (ms)")
    s = summary(rows)
    ax.set_title(f"Validation: {rows[0]['model']}, {len(settings)} cluster "
                 f"settings on {rows[0].get('machine', 'an unnamed machine')}\nMAPE {s['mape']:.1%} "
                 f"over {s['cases']} cases' medians; {s['inside_spread']} of {s['cases']} inside the measured spread",
                 fontsize=10)
    lines = ax.legend(loc="upper left", fontsize=8)
    ax.add_artist(lines)
    ax.legend(handles=colour_keys + marker_keys, loc="lower right", fontsize=8, title="colour: compressor; "
              "marker: setting", title_fontsize=8)
    return csv, save_png(fig, out_dir / "validation.png")
