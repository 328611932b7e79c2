"""arcsim's collectives against published NCCL timings nobody here produced (benchmarks/published/nccl_tests.csv).

Every row is a size of a published nccl-tests table (or an NCCL maintainer's stated bus bandwidth) with the
topology arcsim prices it on. The NCCL model has one fitted constant per transport (RDMA with the receiver's flush,
EFA, TCP), the cost of a network crossing that NCCL's tuning constants leave out
(arcsim.collectives.libraries.nccl.NET_STEP_US); it is fitted on the 64 KiB – 64 MiB rows of the multi-node tables.
Printed per source and size band: the MAPE of `ideal`, of NCCL's terms alone (crossing cost 0), of the committed
model, and of the model with that source HELD OUT (its constants fitted on the other sources only; a kind no other
source has takes the others' pooled value).

    python benchmarks/published_collectives.py          # the tables
    python benchmarks/published_collectives.py --rows   # and every row
    python benchmarks/published_collectives.py --fit    # the constants fitted on every source, to commit
    python benchmarks/published_collectives.py --write-errors  # and the held-out MAPE per transport and band
                                     # into arcsim/data/speedup_errors.json (arcsim run's speed-up intervals)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
from collections import defaultdict
from functools import cache
from pathlib import Path

import numpy as np

from arcsim.collectives.libraries import get_library
from arcsim.collectives.libraries.nccl import NET_STEP_US, PROTOCOLS, proxy_crossings, transport
from arcsim.collectives.libraries.nccl_tuning import SOCKET_PROXY_GBPS
from arcsim.pricing import price_collective
from arcsim.topology import Topology, load_topology

DATA = Path(__file__).resolve().parent / "published" / "nccl_tests.csv"
BANDS = ("< 64 KiB", "64 KiB – 64 MiB", "≥ 64 MiB")
BAND_EDGES = (2**16, 2**26)  # bytes: where each band but the last ends
GRID_US = np.arange(0.0, 150.5, 0.5)
# not fitted: RDMA without the flush is 0 by NCCL's own latencies on nccl-tests#309 (the 2 x 8 H100 and B200 tables
# of dstack-nebius and -lambda want 4.5-13 µs, #309 0: one constant does not serve both, calibrate per cluster);
# sockets: too few mid-band rows
UNFITTED = ("rdma", "tcp")
SOCKET_FITTED_ON = "nccl#398"  # the one source SOCKET_PROXY_GBPS is fitted on


def band(nbytes: float) -> str:
    return BANDS[0] if nbytes < BAND_EDGES[0] else BANDS[1] if nbytes < BAND_EDGES[1] else BANDS[2]


# the transports pooled over every source (transport() of each row's topology)
POOLS = (("all", lambda t: True), ("RDMA and EFA", lambda t: t.startswith(("rdma", "efa"))),
         ("TCP sockets", lambda t: t == "tcp"), ("GPUDirect-TCPX", lambda t: t == "tcpx"))


@dataclasses.dataclass(frozen=True)
class Row:
    source: str
    setting: str
    topology: str
    op: str
    algo: str
    bytes: float
    measured_us: float
    note: str

    @property
    def kind(self) -> str:
        return transport_of(self.topology)

    @property
    def fitted(self) -> bool:
        """Rows the crossing cost is fitted on: the mid band of tables over a network."""
        return not self.note and band(self.bytes) == BANDS[1] and topo(self.topology).nodes > 1


def rows() -> list[Row]:
    with DATA.open() as f:
        return [Row(r["source"], r["setting"], r["topology"], r["op"], r["algo"], float(r["bytes"]),
                    float(r["measured_us"]), r["note"]) for r in csv.DictReader(f)]


@cache
def topo(spec: str) -> Topology:
    return load_topology(spec)


@cache
def transport_of(spec: str) -> str:
    return transport(topo(spec))


@cache
def per_algorithm(row: Row) -> tuple[tuple[str, float, int, str], ...]:
    """(algorithm, µs without the crossing cost, network crossings × channel share, protocol) of each algorithm NCCL
    may run the row by: the crossing cost is added per algorithm, so NCCL's choice at any cost is the least of these
    (the protocol within an algorithm is taken as chosen at the committed cost)."""
    t = topo(row.topology)
    algos = get_library("nccl").available(row.op, t) if row.algo == "auto" else tuple(row.algo.split("|"))
    out = []
    for algo in algos:
        res = price_collective(t, row.op, algo, row.bytes, ("analytic",))[0]
        hops = proxy_crossings(row.op, algo, PROTOCOLS.index(res.protocol), t, row.bytes)
        out.append((algo, res.time_s * 1e6 - hops * NET_STEP_US[transport(t)], hops,
                    res.protocol))
    return tuple(out)


def predict(row: Row, step_us: dict[str, float]) -> tuple[float, str]:
    """(µs, algorithm and protocol) with ``step_us`` per transport."""
    c = step_us.get(row.kind, 0.0)
    algo, us, hops, proto = min(per_algorithm(row), key=lambda a: a[1] + a[2] * c)
    return us + hops * c, f"{algo} {proto}"


def ideal(row: Row) -> float:
    t = dataclasses.replace(topo(row.topology), library="ideal")
    algo = "auto" if row.algo == "auto" or "|" in row.algo else row.algo  # ideal: the cheapest of its own
    return price_collective(t, row.op, algo, row.bytes, ("analytic",))[0].time_s * 1e6


def error(row: Row, step_us: dict[str, float]) -> float:
    return predict(row, step_us)[0] / row.measured_us - 1


def fit(training: list[Row]) -> dict[str, float]:
    """Per transport, the crossing cost minimising the mean |log error| of the kind's fitted rows; a kind with
    none takes the value fitted on all of them pooled (RDMA without the flush: 0, NCCL's own latencies)."""
    by_kind: dict[str, list[Row]] = defaultdict(list)
    for r in training:
        if r.fitted and r.kind not in UNFITTED:
            by_kind[r.kind].append(r)

    def best(rs: list[Row]) -> float:
        if not rs:
            return 0.0
        loss = np.zeros_like(GRID_US)
        for r in rs:  # predict(r, {r.kind: c}) at every c of the grid at once
            us = np.array([a[1] for a in per_algorithm(r)])[:, None]
            hops = np.array([a[2] for a in per_algorithm(r)])[:, None]
            loss += np.abs(np.log((us + hops * GRID_US).min(axis=0) / r.measured_us))
        return float(GRID_US[int(np.argmin(loss / len(rs)))])

    pooled = best([r for rs in by_kind.values() for r in rs])  # one value for every kind
    return {k: best(by_kind[k]) if by_kind.get(k) else 0.0 if k in UNFITTED else pooled for k in NET_STEP_US}


def mape(values: list[float]) -> float:
    return 100 * sum(abs(v) for v in values) / len(values) if values else math.nan


def report(show_rows: bool) -> dict[str, dict[str, dict[str, float]]]:
    """Print and return {source: {band: {model: MAPE}}} (models: ideal, terms, committed, held_out)."""
    data = rows()
    committed = dict(NET_STEP_US)
    held: dict[str, dict[str, float]] = {}
    for source in dict.fromkeys(r.source for r in data):
        held[source] = fit([r for r in data if r.source != source])
    errors: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    if show_rows:
        print(f"{'source':15} {'topology':20} {'bytes':>14} {'measured':>10} {'arcsim':>9} {'err':>5}  chosen")
    for r in data:
        if r.note:
            continue
        key = (r.source, band(r.bytes))
        errors[key]["ideal"].append(ideal(r) / r.measured_us - 1)
        errors[key]["terms"].append(error(r, {}))
        errors[key]["committed"].append(error(r, committed))
        errors[key]["held_out"].append(error(r, held[r.source]))
        errors[key]["transport"].append(r.kind)
        if show_rows:
            us, how = predict(r, committed)
            print(f"{r.source:15} {r.topology:20} {int(r.bytes):>14,} {r.measured_us:>10.1f} {us:>9.1f} "
                  f"{100 * (us / r.measured_us - 1):>+4.0f}%  {how}")
    print(f"\ncrossing cost per transport (µs), committed: {committed}")
    print(f"socket path per node and direction: {SOCKET_PROXY_GBPS} GB/s, fitted on {SOCKET_FITTED_ON} alone (every "
          "other TCP source is held out of it)")
    for source, values in held.items():
        print(f"  fitted without {source:15}: {values}")
    print(f"\n{'source':15} {'band':16} {'rows':>4}  {'ideal':>6} {'terms':>6} {'model':>6} {'held out':>8}   (MAPE %)")
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (source, b), models in sorted(errors.items(), key=lambda kv: (kv[0][0], BANDS.index(kv[0][1]))):
        out[source][b] = {m: mape(v) for m, v in models.items() if m != "transport"}
        print(f"{source:15} {b:16} {len(models['ideal']):>4}  " +
              " ".join(f"{mape(models[m]):>6.1f}" for m in ("ideal", "terms", "committed")) +
              f" {mape(models['held_out']):>8.1f}")
    for name, keep in POOLS:
        for b in BANDS:
            pooled = {m: [e for (s, bb), ms in errors.items() if bb == b for e, t in zip(ms[m], ms["transport"],
                                                                                          strict=True) if keep(t)]
                      for m in ("ideal", "terms", "committed", "held_out")}
            out[name][b] = {**{m: mape(v) for m, v in pooled.items()}, "rows": len(pooled["held_out"])}
            print(f"{name:15} {b:16} {len(pooled['ideal']):>4}  " +
                  " ".join(f"{mape(pooled[m]):>6.1f}" for m in ("ideal", "terms", "committed")) +
                  f" {mape(pooled['held_out']):>8.1f}")
    left = [r for r in data if r.note]
    if left:
        print(f"\nleft out of the errors: {len(left)} rows ({'; '.join(dict.fromkeys(r.note for r in left))})")
    return out


def errors_section(table: dict[str, dict[str, dict[str, float]]]) -> dict:
    """What `arcsim run`'s speed-up intervals read (arcsim.run.doubt): per pooled transport (its transport() kinds)
    and size band, the held-out MAPE and its rows."""
    return {"script": "benchmarks/published_collectives.py", "data": "benchmarks/published/nccl_tests.csv",
            "date": datetime.date.today().isoformat(),
            "statistic": "MAPE (%) of the NCCL model's time, each source held out of the fit of its constant",
            "bands": [{"name": b, "below_bytes": edge} for b, edge in zip(BANDS, (*BAND_EDGES, None), strict=True)],
            "transports": {name: {"kinds": [k for k in NET_STEP_US if keep(k)],
                                  "bands": {b: {"held_out_mape": round(v["held_out"], 2), "rows": int(v["rows"])}
                                            for b, v in table[name].items() if v["rows"]}}
                           for name, keep in POOLS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", action="store_true", help="print every row")
    parser.add_argument("--fit", action="store_true", help="print the constants fitted on every source")
    parser.add_argument("--write-errors", action="store_true",
                        help="write the held-out errors per transport and band for arcsim run's speed-up intervals")
    args = parser.parse_args()
    if args.fit:
        print("NET_STEP_US =", fit(rows()))
        return
    table = report(args.rows)
    if args.write_errors:
        from arcsim.run.doubt import write_section

        print(f"\nwrote {write_section('collectives', errors_section(table))}")


if __name__ == "__main__":
    main()
