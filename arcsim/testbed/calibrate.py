"""`arcsim calibrate`: measure collectives where training will run, fit each one, write a topology.

gloo's collectives differ a lot on the same bytes (its all-gather is CPU-copy bound), so each collective
gets its own fit rather than one β for all. The fit minimises relative residuals — sizes span orders of
magnitude — weighted by 1/√t with non-negative latency and slope, and reports R² and the worst
relative residual; of two shapes (two α–β bands, or one line with a burst) the one that prices held-out
sizes best is kept, and the measured points go with it (priced at and between them, :class:`Calibrated`).
The written topology carries the fits
(``calibration:``, used by ``arcsim run`` for those collectives) and network parameters derived from the
all-reduce fit through the ring formula (2(p−1) latencies, 2(p−1)/p · n / B), so other algorithms and
operations still price sensibly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.testbed import MICROBENCH
from arcsim.testbed.cluster import PREFIX
from arcsim.topology import Band, Calibrated, load_topology
from arcsim.units import format_bits, format_duration, format_size

DEFAULT_SIZES = tuple(4**i * 1024 for i in range(0, 7))   # 1 KiB … 4 MiB per rank
SIZE_FACTOR = {"allreduce": lambda p: 1, "allgather": lambda p: p, "broadcast": lambda p: 1,
               "reducescatter": lambda p: 1}  # reduce-scatter: its input, as nccl-tests count it
MEASURED_LIBRARY = "gloo"  # the microbenchmark's process group
POOR_RESIDUAL = 0.25
HELD_OUT_LIMIT = 0.10  # a measured size priced without it, from the sizes around it
BURST_STEPS = 16  # candidate bursts per doubling of size
SMALL_BAND_BYTES = 65536.0  # collectives up to this size (nccl-tests counting) get their own line


@dataclass(frozen=True)
class Fit:
    op: str
    latency: float
    bandwidth: float
    r2: float
    worst_rel_residual: float
    points: list[tuple[float, float]]   # (collective size in bytes, median seconds)
    small: Fit | None = None            # the small-message band's own line (sizes ≤ SMALL_BAND_BYTES)
    burst: float = 0.0                  # bytes carried free before the line rises (a token bucket's burst)

    def calibrated(self, ranks: int, points: list[tuple[float, float]] | None = None) -> Calibrated:
        """The fit as a topology holds it: its lines and its measured points (``points`` instead, when given)."""
        band = None if self.small is None else Band(SMALL_BAND_BYTES, self.small.latency, self.small.bandwidth)
        return Calibrated(self.latency, self.bandwidth, self.r2, ranks, MEASURED_LIBRARY, band,
                          monotone(self.points if points is None else points), self.burst)

    def held_out_error(self) -> float:
        """The worst relative error at a measured size priced without it (from its neighbours and the lines):
        how far the model can be trusted between the sizes measured. 0 with fewer than three sizes."""
        pts = monotone(self.points)
        errors = [abs(self.calibrated(0, list(pts[:i] + pts[i + 1:])).time(n) / t - 1)
                  for i, (n, t) in enumerate(pts) if 0 < i < len(pts) - 1]
        return max(errors, default=0.0)

    def warnings(self, whole: bool = True) -> list[str]:
        """What makes this fit doubtful: a term pinned at zero, a point far off the line (priced by the points
        in between, but not beyond them), or (``whole``: the whole fit, not its small band) sizes too far apart
        to price those between them."""
        out, held_out = [], self.held_out_error() if whole else 0.0
        if held_out > HELD_OUT_LIMIT:
            out.append(f"{self.op}: a measured size priced from its neighbours is {held_out:.0%} off "
                       f"(over {HELD_OUT_LIMIT:.0%}): measure more sizes in between")
        if self.latency == 0:
            out.append(f"{self.op}: the fitted latency is pinned at 0 (the small sizes do not rise above the line); "
                       "measure smaller sizes or more repeats")
        if self.worst_rel_residual > POOR_RESIDUAL:
            out.append(f"{self.op}: a point lies {self.worst_rel_residual:.0%} off the fitted line (over "
                       f"{POOR_RESIDUAL:.0%}): small messages often cost more than the α–β line says; "
                       "do not trust this fit outside the measured sizes")
        return out + ([] if self.small is None else self.small.warnings(whole=False))


def monotone(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(size, seconds) by size, made non-decreasing the least-squares way (pool adjacent violators: a run of
    sizes whose medians fall gets their mean, since a larger collective never costs less and the dip is
    noise); the median of a size measured twice."""
    by_size: dict[float, list[float]] = {}
    for n, t in points:
        by_size.setdefault(float(n), []).append(float(t))
    blocks: list[list[float]] = []  # [sum of times, count]
    for n in sorted(by_size):
        blocks.append([float(np.median(by_size[n])), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    level = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return tuple(zip(sorted(by_size), level, strict=True))


def fit_bands(points: list[tuple[float, float]], op: str) -> Fit:
    """One line for sizes above SMALL_BAND_BYTES and its own for the small-message regime, when each side has
    at least two sizes and the small ones grow with size (small collectives cost more than the large
    messages' α–β line says); else one line."""
    small = [p for p in points if p[0] <= SMALL_BAND_BYTES]
    large = [p for p in points if p[0] > SMALL_BAND_BYTES]
    if len({n for n, _ in small}) < 2 or len({n for n, _ in large}) < 2:
        return fit_line(points, op)
    main = fit_line(large, op)
    try:
        band = fit_line(small, f"{op} (≤ {format_size(SMALL_BAND_BYTES)})")
    except ArcsimError:  # flat (latency-bound) or noisy small sizes: no line of their own, one line for all
        return fit_line(points, op)
    return dataclasses.replace(main, points=list(points), small=band)


def fit_burst(points: list[tuple[float, float]], op: str) -> Fit | None:
    """t ≈ α + (n − b)⁺ / B: a line whose first b bytes cost nothing more than α, as a token bucket (tbf's
    burst, a NIC's or switch's buffer) lets a message up to its burst leave at line speed. b is chosen from 0
    and a grid of BURST_STEPS per doubling below the second-largest size (two sizes must lie above it: the
    first of them, against the line through the others, places the knee between measured sizes); the fit
    with the least worst relative residual is kept; None when no b gives a rising line."""
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    w = 1 / np.sqrt(t)
    sizes = sorted(set(n))
    if len(sizes) < 3:
        return None
    steps = max(1, int(BURST_STEPS * math.log2(sizes[-2] / sizes[0])))
    best: Fit | None = None
    for b in [0.0, *np.geomspace(sizes[0], sizes[-2], steps, endpoint=False)]:
        over = np.maximum(n - b, 0.0)
        (alpha, beta), _ = nnls(np.column_stack([w, over * w]), t * w)
        if beta <= 0:
            continue
        pred = alpha + beta * over
        worst = float(np.max(np.abs(pred - t) / t))
        if best is None or worst < best.worst_rel_residual:
            r2 = 1 - float(np.sum((t - pred) ** 2) / np.sum((t - t.mean()) ** 2)) if np.ptp(t) > 0 else 1.0
            best = Fit(op, float(alpha), float(1 / beta), r2, worst, list(points), burst=float(b))
    return best


def fit_line(points: list[tuple[float, float]], op: str) -> Fit:
    """t ≈ α + n/B with α, 1/B ≥ 0, residuals weighted by 1/√t: large sizes set the bandwidth, small ones
    still pin the latency (a pure relative fit lets many small, burst-sized messages distort B)."""
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    if len(n) < 2 or np.ptp(n) == 0:
        raise ArcsimError(f"{op}: need at least two different sizes to fit latency and bandwidth")
    w = 1 / np.sqrt(t)
    (alpha, beta), _ = nnls(np.column_stack([w, n * w]), t * w)
    if beta <= 0:
        raise ArcsimError(f"{op}: measured times do not grow with size; measure larger sizes (--sizes)")
    pred = alpha + beta * n
    r2 = 1 - float(np.sum((t - pred) ** 2) / np.sum((t - t.mean()) ** 2)) if np.ptp(t) > 0 else 1.0
    return Fit(op, float(alpha), float(1 / beta), r2, float(np.max(np.abs(pred - t) / t)), list(zip(n, t, strict=True)))


def fits_from(measured: dict, world: int, group: str = "") -> dict[str, Fit]:
    """Per-collective fits from a microbenchmark result (median seconds by per-rank bytes); ``group`` names
    the group they were measured in, in messages."""
    return {op: best_fit([(float(size) * SIZE_FACTOR[op](world), t) for size, t in by.items()],
                         f"{group} {op}" if group else op)
            for op, by in measured["median_s"].items()}


def best_fit(points: list[tuple[float, float]], op: str) -> Fit:
    """The model whose shape prices held-out sizes best (each measured size from the others,
    :meth:`Fit.held_out_error`): two α–β bands, or one line with a burst; the first on a tie."""
    banded, burst = fit_bands(points, op), fit_burst(points, op)
    return banded if burst is None or banded.held_out_error() <= burst.held_out_error() else burst


def group_fits(measured: dict) -> dict[str, dict[str, Fit]]:
    """The node and rail groups' fits (microbench with GPUS_PER_NODE > 1), each at its group's size."""
    return {name: fits_from(m, m["ranks"], name) for name, m in measured.get("groups", {}).items()}


def _fit_lines(op: str, fit: Fit, ranks: int, indent: str) -> list[str]:
    lines = [f"{indent}{op}:", f"{indent}  latency: {fit.latency * 1e6:.6g}us",
             f"{indent}  bandwidth: {fit.bandwidth:.6g}B/s", f"{indent}  r2: {fit.r2:.6f}", f"{indent}  ranks: {ranks}",
             f"{indent}  library: {MEASURED_LIBRARY}"]
    if fit.small is not None:
        lines += [f"{indent}  small:", f"{indent}    up_to: {SMALL_BAND_BYTES:.0f}B",
                  f"{indent}    latency: {fit.small.latency * 1e6:.6g}us",
                  f"{indent}    bandwidth: {fit.small.bandwidth:.6g}B/s"]
    points = ", ".join(f"[{n:.0f}, {t:.6g}]" for n, t in monotone(fit.points))
    burst = [f"{indent}  burst: {fit.burst:.0f}B"] if fit.burst else []
    return [*lines, *burst, f"{indent}  measured: [{points}]"]


def topology_text(name: str, world: int, fits: dict[str, Fit], how: str, gpus_per_node: int = 1,
                  groups: dict[str, dict[str, Fit]] | None = None) -> str:
    """A topology YAML with every collective's fit. One rank per node: the network from the all-reduce fit
    through the ring formula (2(p−1) latencies, 2(p−1)/p · n / B). ``gpus_per_node`` > 1 (ranks numbered node
    by node, ``groups`` measured): the NIC from the rails' all-reduce (a ring over the nodes; G rails share a
    NIC, so it carries G times one rail), the link inside a node from the node's all-gather (a ring over G),
    and each group's fits under ``calibration_groups``."""
    g, groups = gpus_per_node, groups or {}
    nodes = world // g
    ar = groups["inter"]["allreduce"] if g > 1 else fits["allreduce"]
    latency = ar.latency / (2 * (nodes - 1))
    bandwidth = g * 2 * (nodes - 1) / nodes * ar.bandwidth
    intra = ["  kind: none", "  bandwidth: 1TB/s", "  latency: 0us"]
    if g > 1:
        ag = groups["node"]["allgather"]
        intra = ["  kind: loopback", f"  bandwidth: {(g - 1) / g * ag.bandwidth:.6g}B/s",
                 f"  latency: {ag.latency / (g - 1) * 1e6:.6g}us"]
    placement = "one per node" if g == 1 else f"{nodes} nodes of {g}"
    lines = [f"name: {name}",
             "description: >-",
             f"  Calibrated by arcsim calibrate ({how}): {world} ranks, {placement}. The network parameters come",
             "  from the all-reduce fit through the ring formula; the calibration section holds each",
             "  collective's measured fit and points (priced at and between them), which arcsim run uses directly.",
             f"nodes: {nodes}",
             f"gpus_per_node: {g}",
             "intra:", *intra,
             "network:",
             "  kind: ethernet",
             "  nics_per_node: 1",
             f"  bandwidth_per_nic: {bandwidth:.6g}B/s",
             f"  latency: {latency * 1e6:.6g}us",
             "  fabric: switch",
             "calibration:"]
    for op, f in fits.items():
        lines += _fit_lines(op, f, world, "  ")
    if groups:
        lines.append("calibration_groups:")
        for group, by_op in groups.items():
            size = g if group == "node" else nodes
            lines += [f"  {group}:", *(line for op, f in by_op.items() for line in _fit_lines(op, f, size, "    "))]
    return "\n".join(lines) + "\n"


def samples_text(fits: dict[str, Fit]) -> str:
    """The raw medians behind the fits, as CSV (kept beside the topology YAML)."""
    rows = ["op,bytes,median_s"] + [f"{op},{n:.0f},{t:.9g}" for op, f in fits.items() for n, t in f.points]
    return "\n".join(rows) + "\n"


def run_microbench(ranks: int, where: str, bandwidth: str | None, sizes: tuple[int, ...], repeats: int,
                   timeout: float = 1800, delay: str = "0s", burst: float | None = None,
                   announce: Callable[[str], None] = print, ranks_per_node: int = 1, gap_s: float = 0.0,
                   prefix: str = PREFIX) -> dict:
    """Start one process per rank on loopback or in a new emulated cluster; returns rank 0's medians.
    ``ranks_per_node`` > 1: the ranks as nodes of that many (sharing a namespace), the groups measured too."""
    from arcsim.testbed.cluster import EmulatedCluster

    if where == "loopback":
        return microbench(None, ranks, sizes, repeats, timeout, ranks_per_node, gap_s)
    if bandwidth is None:
        raise ArcsimError("--cluster emulated needs --bandwidth (e.g. 1Gbit)")
    with EmulatedCluster(ranks, bandwidth, delay, prefix=prefix, burst=burst, ranks_per_node=ranks_per_node) as cluster:
        announce(f"shaping: {cluster.knobs()}")
        return microbench(cluster, ranks, sizes, repeats, timeout, ranks_per_node, gap_s)


def microbench(cluster, ranks: int, sizes: tuple[int, ...], repeats: int, timeout: float = 1800,
               gpus_per_node: int = 1, gap_s: float = 0.0) -> dict:
    """Run the microbenchmark with one process per rank: in ``cluster`` (an EmulatedCluster) or on loopback;
    ``gpus_per_node`` > 1 measures the node and rail groups too; ``gap_s`` idle before each collective."""
    from arcsim.testbed.ranks import on_loopback, run_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        args = [str(out), ",".join(map(str, sizes)), str(repeats), str(gpus_per_node), str(gap_s)]
        if cluster is None:
            run_ranks(on_loopback(MICROBENCH, args, ranks), timeout)
        else:
            cluster.run(MICROBENCH, args, timeout)
        return json.loads(out.read_text())


def measure_in_job(sizes: tuple[int, ...], repeats: int, gpus_per_node: int = 1) -> dict | None:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_* set): measure here; rank 0 gets the medians, others None.
    ``gpus_per_node`` > 1 (torchrun's --nproc_per_node) measures the node and rail groups too."""
    import torch.distributed as dist

    from arcsim.testbed.microbench import results

    dist.init_process_group("gloo")
    try:
        measured = results(list(sizes), repeats, gpus_per_node)
        rank = dist.get_rank()
    finally:
        dist.destroy_process_group()
    return measured if rank == 0 else None


def write_topology(path: Path, text: str) -> None:
    """Write atomically, then check the file loads as a topology."""
    write_atomic(path, text, check=lambda tmp: load_topology(str(tmp)))


def describe(fit: Fit, whole: bool = True) -> str:
    size = f"(size − {format_size(fit.burst)})⁺" if fit.burst else "size"
    line = (f"{fit.op}: {format_duration(fit.latency)} + {size} / {format_bits(fit.bandwidth)}, "
            f"R² {fit.r2:.4f}, worst residual {fit.worst_rel_residual:.1%}")
    if fit.small is not None:
        line = f"{line}; {describe(fit.small, whole=False)}"
    return f"{line}; held out (each size from its neighbours) worst {fit.held_out_error():.1%}" if whole else line
