"""Compression's end-to-end speed-up over dense: published (benchmarks/published/e2e.csv) against arcsim.

    python benchmarks/published_e2e.py                       # every row arcsim can express (a few minutes)
    python benchmarks/published_e2e.py --source Espresso     # the rows whose source contains this
    python benchmarks/published_e2e.py --rows 3              # the first 3 expressible rows
    python benchmarks/published_e2e.py --write-errors        # every row, and the errors per framework into
                                                             # arcsim/data/speedup_errors.json (arcsim run's intervals)

Each expressible row names its arcsim setup: a stand-in model's trace (captured once here: 4 workers × 1 step
after 1 of training, under --traces), the topology, GPU, batch per GPU, framework, compressor and density. It is
priced as ``arcsim run`` prices it (arcsim.run.analysis), dense fp32 and the compressor on their fastest
collectives, and the predicted speed-up is dense's iteration time over the compressor's. The Espresso and BytePS
rows ran on BytePS (parameter servers; the systems compress between machines): arcsim has DDP and Horovod, so each
is priced as DDP with node-aware compression (dense inside a node, compressed between nodes: --hierarchy node), flat
where the row is one machine, and between machines on BytePS's own TCP, not NCCL's socket transport
(byteps_topology). That is an approximation of BytePS's placement, not BytePS. DeepSpeed's 1-bit Adam rows compress
across every rank (flat), under arcsim's ``deepspeed`` framework (every collective after the backward pass), and are
priced on NCCL as the topology names it. A row may add ``arcsim_options``, space-separated ``key=value`` (OPTIONS):
``baseline`` the compressor it is measured against (DeepSpeed's FP16 runs all-reduce fp16, not fp32), ``fusion`` and
``scope`` as ``arcsim run``'s, ``precision`` the compute's (``arcsim run --precision``: DeepSpeed's rows trained in
fp16) and ``bucket_mb`` the framework's cap in MiB (``--bucket-mb``: DeepSpeed's rows are measured in 25 MiB buffers,
where DeepSpeed sends one of up to 500 M elements: one 368 M-element vector measured whole takes some 50 GB of
memory, as ``fusion=model`` would). A density-free compressor (the signs, onebit) leaves ``arcsim_density`` empty.
The rows arcsim cannot express stay in the CSV with a ``skip`` reason, printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

CSV = Path(__file__).parent / "published" / "e2e.csv"
BYTEPS_MIN_COMPRESS_BYTES = 1_024_000  # BytePS compresses only tensors this large (fp32 bytes); the rest go dense
# the stand-in traces: zoo model and image side (None: the model's own input)
TRACES: dict[str, tuple[str, int | None]] = {"gpt2_small": ("gpt2_small", None), "resnet50": ("resnet50", None),
                                             "resnet18_cifar": ("resnet18", 32), "cnn": ("cnn", None),
                                             "llama_350m": ("llama_350m", 128)}
WORKERS, STEPS, WARMUP = 4, 1, 1  # 4 workers: node-aware compression groups them as 2 nodes × 2
# arcsim_options' keys and the values each takes (empty: dense, DDP buckets, k per tensor, as arcsim run's defaults)
OPTIONS = {"baseline": ("dense", "fp16", "bf16"), "fusion": ("bucket", "model"), "scope": ("tensor", "bucket"),
           "precision": ("fp32", "bf16", "fp16"), "bucket_mb": ()}  # bucket_mb: a number of MiB (--bucket-mb)


def rows(source: str | None = None) -> list[dict[str, str]]:
    with CSV.open() as f:
        table = list(csv.DictReader(f))
    return [r for r in table if source is None or source.lower() in r["source"].lower()]


def source_name(row: dict[str, str]) -> str:
    return row["source"].split(" (")[0].split(" docs")[0]


def trace_path(name: str, traces: Path) -> Path:
    """The stand-in's trace under ``traces``, captured here the first time (resnet50: ~30 s on two cores)."""
    path = traces / f"{name}_w{WORKERS}s{STEPS}.npz"
    if not path.exists():
        from arcsim.traces.capture import CaptureConfig, capture

        model, size = TRACES[name]
        traces.mkdir(parents=True, exist_ok=True)
        cfg = CaptureConfig(model=model, out=path, workers=WORKERS, steps=STEPS, warmup=WARMUP, input_size=size)
        print(f"  capturing {name}: {cfg.command()}", file=sys.stderr, flush=True)
        capture(cfg)
    return path


def options_of(row: dict[str, str]) -> dict[str, str]:
    """The row's ``arcsim_options`` (``key=value`` separated by spaces), each key one of OPTIONS with one of its
    values; refused otherwise, so a typo is not priced as the default."""
    out = {}
    for item in row.get("arcsim_options", "").split():
        key, _, value = item.partition("=")
        if key == "bucket_mb" and _positive(value):
            out[key] = value
            continue
        if value not in OPTIONS.get(key, ()):
            raise ValueError(f"arcsim_options {item!r}: give one of " + "; ".join(
                f"{k}={'|'.join(v) or 'MiB'}" for k, v in OPTIONS.items()))
        out[key] = value
    return out


def _positive(value: str) -> bool:
    try:
        return 0 < float(value) < math.inf
    except ValueError:
        return False


def density_of(row: dict[str, str], layers) -> float:
    """The row's density; ``kN``: BytePS's N elements per tensor of BYTEPS_MIN_COMPRESS_BYTES or more, the smaller
    tensors sent whole, as the density sending the same number of elements; empty for a density-free compressor
    (measured as arcsim run measures it, at 1)."""
    from arcsim.catalog import INFO

    d = row["arcsim_density"]
    if INFO[row["arcsim_compressor"]].density_free:
        if d:
            raise ValueError(f"{row['arcsim_compressor']} does not depend on the density: leave arcsim_density empty")
        return 1.0
    if not d.startswith("k"):
        return float(d)
    k = int(d[1:])
    total = sum(la.numel for la in layers)
    sent = sum(k if la.numel * 4 >= BYTEPS_MIN_COMPRESS_BYTES else la.numel for la in layers)
    return sent / total


@dataclass
class Priced:
    speedup: float
    dense_s: float
    compressed_s: float
    density: float


_analyses: dict[tuple, object] = {}


def byteps_topology(name: str, folder: Path) -> str:
    """``name`` as BytePS runs on it: between machines its own TCP (ps-lite: every worker's flows to every server,
    no NCCL proxy between the GPU and the socket), so not NCCL's socket transport, whose boundary proxy caps a node
    (arcsim.collectives.libraries.nccl_tuning.socket_bandwidth): the NICs at NCCL's per-channel speed, as RDMA is.
    Inside a machine, NCCL as ever. Returns the path of that topology's file."""
    import dataclasses as dc

    from arcsim.collectives.libraries.nccl_tuning import sockets
    from arcsim.topology import load_topology, topology_yaml

    topo = load_topology(name)
    if not sockets(topo):
        return name
    path = folder / f"byteps-{name}.yaml"
    own = dc.replace(topo, network=dc.replace(topo.network, kind="byteps-tcp"))
    path.write_text(topology_yaml(own, f"{name} as BytePS's own TCP runs on it (benchmarks/published_e2e.py)"))
    return str(path)


def analysis(row: dict[str, str], traces: Path):
    """One arcsim Analysis per (trace, topology, GPU, batch, framework, hierarchy, fusion, scope, precision, bucket
    cap), the trace and measurements shared; a new stand-in lets the last one's go (its measurements stay in
    arcsim's cache on disk)."""
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    options = options_of(row)
    key = (row["arcsim_trace"], row["arcsim_topology"], row["arcsim_gpu"], row["arcsim_batch"],
           row["arcsim_framework"], row["arcsim_hierarchy"], options.get("fusion", "bucket"),
           options.get("scope", "tensor"), options.get("precision"), options.get("bucket_mb"))
    if key in _analyses:
        return _analyses[key]
    if not any(k[0] == key[0] for k in _analyses):  # another stand-in: its gradients take GB, the last one's go
        _analyses.clear()
        gc.collect()
    topology = row["arcsim_topology"]
    if row["framework"].startswith("BytePS"):
        topology = byteps_topology(topology, traces)
    given = dict(topology=topology, trace=str(trace_path(row["arcsim_trace"], traces)),
                 compressors=(row["arcsim_compressor"],), policy="none", ratios=(1.0,), allow_capture=False,
                 gpu=row["arcsim_gpu"], batch=int(row["arcsim_batch"]), framework=row["arcsim_framework"],
                 hierarchy=row["arcsim_hierarchy"], fusion=key[6], options={"scope": key[7]})
    if key[8] is not None:
        given["precision"] = key[8]
    if key[9] is not None:
        given["bucket_mb"] = float(key[9])
    if given["framework"] == "ddp" and "framework" not in {f.name for f in dataclasses.fields(RunConfig)}:
        del given["framework"]  # an arcsim from before --framework (to compare against it) priced DDP only
    cfg = RunConfig(**given)  # type: ignore[arg-type]
    # measurements are shared only where the buckets and the options are the same (the trace, the framework and its
    # cap, fusion and scope: DeepSpeed groups otherwise than DDP)
    same = (0, 4, 6, 7, 9)
    earlier = next((a for k, a in _analyses.items() if all(k[i] == key[i] for i in same)), None)
    a = Analysis(cfg, announce=lambda _: None, source=None if earlier is None else earlier.trace)  # type: ignore
    if earlier is not None:
        a.share_measurements(earlier)  # type: ignore[arg-type]
    _analyses[key] = a
    return a


def price(row: dict[str, str], traces: Path) -> Priced:
    """arcsim's speed-up of the row's compressor over its baseline (dense fp32 unless ``arcsim_options`` names
    another), each on its fastest collective."""
    from arcsim.run.candidates import candidates_for

    a = analysis(row, traces)
    density = density_of(row, a.trace.layers)

    def best(meas):
        return min(candidates_for(meas, a.ctx, a.pricer), key=lambda c: c.iteration_s)

    dense = best(a.measurement(options_of(row).get("baseline", "dense"), 1.0))
    comp = best(a.measurement(row["arcsim_compressor"], density, hierarchy=row["arcsim_hierarchy"]))
    return Priced(dense.iteration_s / comp.iteration_s, dense.iteration_s, comp.iteration_s, density)


def where(row: dict[str, str]) -> str:
    w = row["where"]
    return w.split(" (")[0] if w.startswith("Figure") else ("slow network" if "Slow" in w else "e2e table")


def verdict(speedup: float) -> str:
    return "faster" if speedup > 1.0 else "slower"


Result = tuple[str, str, float, float]  # framework, source, measured speed-up, arcsim's


def framework_errors(results: list[Result]) -> dict[str, dict]:
    """Per framework: the rows, the share whose verdict agrees, the median |predicted − measured| speed-up and the
    median |ln(predicted / measured)| (what arcsim run's intervals take, arcsim.run.doubt), with the rows."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(fw for fw, _, _, _ in results):
        mine = [(source, m, p) for fw, source, m, p in results if fw == name]
        out[name] = {"framework": name, "rows": len(mine),
                     "verdict_agrees": sum(verdict(m) == verdict(p) for _, m, p in mine) / len(mine),
                     "median_abs_speedup_error": statistics.median(abs(p - m) for _, m, p in mine),
                     "median_abs_log_error": statistics.median(abs(math.log(p / m)) for _, m, p in mine),
                     "pairs": [{"source": source, "measured": m, "predicted": p} for source, m, p in mine]}
    return out


def summary(results: list[Result], compressors: list[str]) -> str:
    """Per source, then per source and compressor, then every source per framework: the rows, the share whose
    verdict agrees, the median |predicted − measured| speed-up and the median of that relative to the measured."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _, source, m, p in results:
        groups[source].append((m, p))
    for (_, source, m, p), c in zip(results, compressors, strict=True):
        groups[f"{source} {c}"].append((m, p))
    for fw, _, m, p in results:
        groups[f"every source ({fw})"].append((m, p))
    width = max(map(len, groups)) + 2
    lines = [f"{'source':<{width}}{'rows':>5}{'verdict agrees':>16}{'median |err|':>14}{'median |err|/measured':>23}"]
    for name, pairs in groups.items():
        agree = 100 * sum(verdict(m) == verdict(p) for m, p in pairs) / len(pairs)
        err = statistics.median(abs(p - m) for m, p in pairs)
        rel = 100 * statistics.median(abs(p - m) / m for m, p in pairs)
        lines.append(f"{name:<{width}}{len(pairs):>5}{agree:>15.0f}%{err:>14.3f}{rel:>22.0f}%")
    return "\n".join(lines)


def errors_section(results: list[Result]) -> dict:
    """What `arcsim run`'s speed-up intervals read (arcsim.run.doubt): the end-to-end errors per framework."""
    return {"script": "benchmarks/published_e2e.py", "data": "benchmarks/published/e2e.csv",
            "date": datetime.date.today().isoformat(),
            "statistic": "median |ln(predicted / measured)| of compressed-over-dense speed-ups (BytePS systems "
                         "priced as arcsim's framework with node-aware compression); nothing is fitted on them",
            "frameworks": framework_errors(results)}


def main(argv: list[str] | None = None) -> int:
    from arcsim.files import generated_traces_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="only the rows whose source contains this (e.g. Espresso, BytePS)")
    ap.add_argument("--rows", type=int, help="only the first N expressible rows")
    ap.add_argument("--traces", type=Path, help="where the stand-in traces are kept (default: arcsim's trace "
                    "cache, published_e2e/)")
    ap.add_argument("--write-errors", action="store_true",
                    help="write the errors per framework for arcsim run's speed-up intervals (every row)")
    args = ap.parse_args(argv)
    if args.write_errors and (args.source or args.rows):
        ap.error("--write-errors takes every row: give it without --source and --rows")
    traces = args.traces or generated_traces_dir() / "published_e2e"
    table = rows(args.source)
    todo = [r for r in table if not r["skip"]][:args.rows]
    print("Predicted (arcsim: each row's framework, DDP or DeepSpeed; node-aware compression; BytePS placement "
          "approximated) against measured speed-up of compression over dense")
    print(f"{'source':<10}{'where':<15}{'system / compressor':<28}{'nodes':>5}  {'arcsim':<34}"
          f"{'measured':>9}{'predicted':>10}{'|err|':>7}  agree")
    results: list[Result] = []
    compressors: list[str] = []
    started = time.perf_counter()
    for i, r in enumerate(todo, 1):
        p = price(r, traces)
        measured = float(r["speedup"])
        agree = verdict(measured) == verdict(p.speedup)
        err = abs(p.speedup - measured)
        results.append((r["arcsim_framework"], source_name(r), measured, p.speedup))
        compressors.append(r["arcsim_compressor"])
        density = "" if not r["arcsim_density"] else f"@{p.density:.2g}"
        setup = f"{r['arcsim_trace']} {r['arcsim_compressor']}{density} {r['arcsim_topology'].split('-')[1]}"
        print(f"{source_name(r)[:9]:<10}{where(r):<15}{r['compressor'][:27]:<28}{r['nodes']:>5}  "
              f"{setup:<34}{measured:>9.3f}{p.speedup:>10.3f}{err:>7.3f}  {'yes' if agree else 'NO'}", flush=True)
        print(f"  [{i}/{len(todo)} in {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    print()
    print(summary(results, compressors))
    for name, e in framework_errors(results).items():
        print(f"{name}, every source: median |ln(predicted/measured)| {e['median_abs_log_error']:.3f}")
    if args.write_errors:
        from arcsim.run.doubt import write_section

        print(f"wrote {write_section('frameworks', errors_section(results))}")
    skipped = [r for r in table if r["skip"]]
    if args.rows is None and skipped:
        print(f"\nnot priced ({len(skipped)} rows):")
        reasons: dict[tuple[str, str], int] = defaultdict(int)
        for r in skipped:
            reasons[(source_name(r), r["skip"])] += 1
        for (name, why), n in reasons.items():
            print(f"  {name}: {n} × {why}")
    return 0 if all(math.isfinite(p) for _, _, _, p in results) else 1


if __name__ == "__main__":
    sys.exit(main())
