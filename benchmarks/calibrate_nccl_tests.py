"""`arcsim calibrate --nccl-tests` on the published nccl-tests tables (benchmarks/published/nccl_tests.csv): fitted on
every other size, priced on the sizes between.

Each source table (one run: its source, setting, topology, op and algorithm; rows without a note) is written out as
nccl-tests prints it (out-of-place times from the CSV; the CSV keeps no in-place times, so those columns say N/A),
read back by arcsim.testbed.nccl_tests, and fitted by arcsim.testbed.nccl_fit on the topology the CSV prices it on,
with only its even-indexed sizes (0, 2, 4 …; the fit takes those from 64 KiB up). Printed per table and size band:
the MAPE on the odd-indexed sizes of the topology alone and of the fit, and the constants fitted. Tables within
one node have no network to fit and are listed as such.

    python benchmarks/calibrate_nccl_tests.py                    # the table
    python benchmarks/calibrate_nccl_tests.py --rows             # and every held-out size
    python benchmarks/calibrate_nccl_tests.py --base-latency     # and a third constant tried: µs on every size
    python benchmarks/calibrate_nccl_tests.py --write-logs DIR   # the tables as nccl-tests logs (tests/nccl_tests)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arcsim.collectives import busbw_factor
from arcsim.pricing import plan
from arcsim.testbed.nccl_fit import (
    BANDS,
    CROSSING_US,
    MIN_FITTED_SIZES,
    Constants,
    Terms,
    band,
    fit,
    rows_of,
    search,
)
from arcsim.testbed.nccl_tests import BINARIES, parse
from arcsim.topology import load_topology

DATA = Path(__file__).resolve().parent / "published" / "nccl_tests.csv"
BINARY = {op: f"{name}_perf" for name, op in BINARIES.items()}
NCCL_ALGO = {"ring": "Ring", "tree": "Tree"}


@dataclass(frozen=True)
class Table:
    source: str
    url: str
    setting: str
    topology: str
    op: str
    algo: str
    sizes: tuple[str, ...]  # as the CSV writes them
    times_us: tuple[str, ...]
    label: str = ""  # source, topology and binary, the algorithm where pinned, and a number where that repeats

    @property
    def file_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9.-]+", "_", self.label).strip("_") + ".log"


def tables() -> list[Table]:
    """The CSV's runs of several sizes, in its order (rows with a note left out, as the published check does)."""
    runs: dict[tuple[str, ...], list[dict[str, str]]] = {}
    with DATA.open() as f:
        for r in csv.DictReader(f):
            if not r["note"]:
                runs.setdefault((r["source"], r["url"], r["setting"], r["topology"], r["op"], r["algo"]), []).append(r)
    out: list[Table] = []
    for (source, url, setting, topology, op, algo), rs in runs.items():
        if len(rs) >= 4:
            label = f"{source} {topology} {BINARY[op]}" + (f" {algo}" if algo != "auto" else "")
            repeats = sum(t.label.startswith(label) for t in out)
            out.append(Table(source, url, setting, topology, op, algo, tuple(str(int(float(r["bytes"]))) for r in rs),
                             tuple(r["measured_us"] for r in rs), label + (f" ({repeats + 1})" if repeats else "")))
    return out


def log_text(table: Table) -> str:
    """``table`` as nccl-tests ≥ 2.11 prints it: a rank line per GPU (hosts node0, node1 …), the table of float
    sizes with algbw and busbw from the time, the average bus bandwidth; NCCL_ALGO's INFO line where the run pinned
    it."""
    topo = load_topology(table.topology)
    gpu = f"NVIDIA {(topo.gpu or 'GPU').upper()}"
    ranks, count_per = topo.ranks, (topo.ranks if table.op in ("allgather", "reducescatter") else 1)
    lines = [f"# arcsim test log: out-of-place times of {table.source} ({table.url}) from "
             f"benchmarks/published/nccl_tests.csv; its in-place times are not kept (N/A)",
             f"# Collective test starting: {BINARY[table.op]}",
             f"# nThread 1 nGpus 1 minBytes {table.sizes[0]} maxBytes {table.sizes[-1]} step: 2(factor)",
             "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {0:6d} on {f'node{r // topo.gpus_per_node}':>10} device "
              f"{r % topo.gpus_per_node:2d} [0000:00:00] {gpu}" for r in range(ranks)]
    if table.algo in NCCL_ALGO:
        lines.append(f"node0:0:0 [0] NCCL INFO NCCL_ALGO set by environment to {NCCL_ALGO[table.algo]}")
    lines += ["#", f"# {'':10}  {'':12}  {'':8}  {'':6}  {'':6}           out-of-place                       in-place",
              f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  "
              f"{'busbw':>6} {'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6} {'#wrong':>6}",
              f"# {'(B)':>10}  {'(elements)':>12}  {'':8}  {'':6}  {'':6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  "
              f"{'':6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}"]
    redop, root = ("sum", -1) if table.op in ("allreduce", "reducescatter") else ("none", 0 if table.op == "broadcast"
                                                                                 else -1)
    bus = []
    for size, time in zip(table.sizes, table.times_us, strict=True):
        algbw = int(size) / float(time) / 1e3
        bus.append(algbw * busbw_factor(table.op, ranks))
        lines.append(f"{int(size):12d}  {int(size) // 4 // count_per:12d}  {'float':>8}  {redop:>6}  {root:6d}  "
                     f"{time:>7}  {algbw:6.2f}  {bus[-1]:6.2f}  {'N/A':>5}  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  "
                     f"{'N/A':>5}")
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {np.mean(bus):.3f} ", "#", ""]
    return "\n".join(lines)


BASE_US = np.arange(-20.0, 200.5, 1.0)  # the third constant tried (--base-latency): µs added to every size


@dataclass(frozen=True)
class HeldOut:
    """A table fitted on its even-indexed sizes, priced on all: the topology alone, the fit, and (``base_latency``)
    the fit with a third constant, µs added to every size, fitted on every even size."""

    table: Table
    sizes: tuple[int, ...]
    measured: np.ndarray
    base_us: np.ndarray
    constants: Constants | None = None  # None: nothing to fit (``why``)
    fit_us: np.ndarray | None = None
    why: str = ""
    base_latency: tuple[Constants, float, np.ndarray] | None = None

    def bands(self, predicted: np.ndarray) -> dict[str, tuple[int, float]]:
        """Per band with odd-indexed sizes: (sizes, MAPE % of ``predicted`` on them)."""
        out = {}
        for b in BANDS:
            sel = np.array([i for i in range(1, len(self.sizes), 2) if band(self.sizes[i]) == b], dtype=int)
            if len(sel):
                out[b] = (len(sel), float(100 * np.mean(np.abs(predicted[sel] / self.measured[sel] - 1))))
        return out


def held_out(table: Table, base_latency: bool = False) -> HeldOut:
    log = parse(log_text(table), table.file_name)
    base, rows = load_topology(table.topology), rows_of([log])
    result = HeldOut(table, log.sizes, np.array(log.times_us),
                     np.array([1e6 * plan(base, log.op, log.algo, n).analytic_s for n in log.sizes]))
    even = np.array([i for i in range(0, len(rows), 2) if rows[i].fitted], dtype=int)
    if base.nodes < 2 or len(even) < MIN_FITTED_SIZES:
        return dataclasses.replace(result, why="one node: no network to fit" if base.nodes < 2 else
                                   f"{len(even)} even size(s) from 64 KiB: nothing to fit on")
    terms, everything = Terms(base, rows), np.arange(len(rows))
    constants = fit(terms, even)
    result = dataclasses.replace(result, constants=constants,
                                 fit_us=terms.predict(constants.k, constants.crossing_us, everything))
    if base_latency:
        three, b = fit_base_latency(terms, np.arange(0, len(rows), 2))
        result = dataclasses.replace(result, base_latency=(three, b, terms.predict(three.k, three.crossing_us,
                                                                                    everything) + b))
    return result


def fit_base_latency(terms: Terms, which: np.ndarray) -> tuple[Constants, float]:
    """Efficiency, crossing cost and µs added to every size (a base latency), by the mean |log| error over ``which``."""
    measured = terms.measured[which]

    def score(k: int) -> tuple[float, tuple[Constants, float]]:
        base, crossings = terms.arrays(k, which)
        predicted = (base[None] + crossings[None] * CROSSING_US[:, None, None]).min(axis=2)  # crossing × size
        shifted = predicted[:, None, :] + BASE_US[None, :, None]  # crossing × base latency × size
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.where(shifted > 0, np.abs(np.log(shifted / measured)), np.inf).mean(axis=2)
        j, b = np.unravel_index(int(np.argmin(loss)), loss.shape)
        return float(loss[j, b]), (Constants(k, float(CROSSING_US[j])), float(BASE_US[b]))

    return search(score)


def cells(bands: dict[str, tuple[int, float]], before: dict[str, tuple[int, float]]) -> str:
    return "   ".join(f"{bands[b][0]:>2} {before[b][1]:5.1f} → {bands[b][1]:4.1f}" if b in bands else f"{'':>18}"
                       for b in BANDS)


def report(show_rows: bool, base_latency: bool = False) -> list[HeldOut]:
    """Print and return each table's fit on its even sizes, priced on its odd ones."""
    out = []
    print(f"{'table (fitted on even sizes, MAPE % on odd)':50} {'eff.':>5} {'cross':>6}   "
          + "   ".join(f"{b:>18}" for b in BANDS))
    print(f"{'':50} {'':>5} {'µs':>6}   " + "   ".join(f"{'n  base →  fit':>18}" for _ in BANDS))
    for table in tables():
        result = held_out(table, base_latency)
        out.append(result)
        if result.constants is None or result.fit_us is None:
            print(f"{table.label:50} {result.why}")
            continue
        before = result.bands(result.base_us)
        edge = result.constants.at_edge()
        print(f"{table.label:50} {result.constants.efficiency:5.3f} {result.constants.crossing_us:6.1f}   "
              + cells(result.bands(result.fit_us), before) + (f"   (at the edge: {'; '.join(edge)})" if edge else ""))
        if result.base_latency is not None:
            three, b, predicted = result.base_latency
            print(f"{'  + base latency ' + format(b, 'g') + ' µs (all even sizes)':50} {three.efficiency:5.3f} "
                  f"{three.crossing_us:6.1f}   " + cells(result.bands(predicted), before))
        if show_rows:
            for i in range(1, len(result.sizes), 2):
                m, f = result.measured[i], result.fit_us[i]
                print(f"    {result.sizes[i]:>14,} B  measured {m:10.1f} µs  fit {f:10.1f} µs  "
                      f"{100 * (f / m - 1):+6.1f} %")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", action="store_true", help="print every held-out size")
    parser.add_argument("--base-latency", action="store_true",
                        help="also fit a third constant, µs added to every size, on every even size")
    parser.add_argument("--write-logs", type=Path, metavar="DIR", help="write each table as an nccl-tests log")
    args = parser.parse_args()
    if args.write_logs:
        args.write_logs.mkdir(parents=True, exist_ok=True)
        for table in tables():
            (args.write_logs / table.file_name).write_text(log_text(table))
        return
    report(args.rows, args.base_latency)


if __name__ == "__main__":
    main()
