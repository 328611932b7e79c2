"""arcsim collective against published NCCL timings nobody here produced (benchmarks/published/nccl_tests.csv).

Prints every row (measured, predicted with the topology's library and with `ideal`, error) and the MAPE
per source; then the whole A3 Mega table (benchmarks/published/a3mega_all_reduce.csv, 8 B – 8 GiB), of which
only the rows of 512 MiB and more are in the comparison: below them the source's GPUDirect-TCPXO settings
(protocols, buffer and chunk sizes, not shown in it) and the transport's own per-chunk costs decide, which
no specification gives. Run: python benchmarks/published_collectives.py [--library nccl]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from collections import defaultdict
from pathlib import Path

from arcsim.pricing import price_collective
from arcsim.topology import load_topology

PUBLISHED = Path(__file__).resolve().parent / "published"
DATA = PUBLISHED / "nccl_tests.csv"
A3MEGA = PUBLISHED / "a3mega_all_reduce.csv"


def rows() -> list[dict[str, str]]:
    with DATA.open() as f:
        return list(csv.DictReader(f))


def topology(spec: str) -> str:
    """A topology named in the CSV: a file beside it (a cluster no grammar name describes), else a name."""
    return str(PUBLISHED / spec) if (PUBLISHED / spec).is_file() else spec


def predict(row: dict[str, str], library: str) -> tuple[float, str]:
    """(predicted µs, the algorithm and protocol used) for one published row."""
    topo = dataclasses.replace(load_topology(topology(row["topology"])), library=library)
    res = price_collective(topo, row["op"], row["algo"], float(row["bytes"]), ("analytic",))[0]
    return res.time_s * 1e6, f"{res.algo} {res.protocol}".strip()


def errors(library: str) -> dict[str, list[float]]:
    """Relative error of each row, grouped by source."""
    out: dict[str, list[float]] = defaultdict(list)
    for row in rows():
        measured = float(row["measured_us"])
        out[row["source"]].append(predict(row, library)[0] / measured - 1)
    return out


def mape(values: list[float]) -> float:
    return 100 * sum(abs(v) for v in values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--library", default="nccl")
    lib = parser.parse_args().library
    print(f"{'source':15} {'bytes':>12} {'measured µs':>12} {lib + ' µs':>10} {'err':>6}  {'ideal µs':>10} {'err':>6}  "
          "chosen")
    for row in rows():
        m = float(row["measured_us"])
        p, how = predict(row, lib)
        i, _ = predict(row, "ideal")
        print(f"{row['source']:15} {int(row['bytes']):>12,} {m:>12.1f} {p:>10.1f} {100 * (p / m - 1):>+5.0f}%  "
              f"{i:>10.1f} {100 * (i / m - 1):>+5.0f}%  {how}")
    by_lib, by_ideal = errors(lib), errors("ideal")
    print("\nMAPE per source")
    for source in by_lib:
        print(f"  {source:15} {len(by_lib[source]):>2} rows: {lib} {mape(by_lib[source]):5.1f} %   "
              f"ideal {mape(by_ideal[source]):5.1f} %")
    every = [e for v in by_lib.values() for e in v]
    every_ideal = [e for v in by_ideal.values() for e in v]
    print(f"  {'all':15} {len(every):>2} rows: {lib} {mape(every):5.1f} %   ideal {mape(every_ideal):5.1f} %")
    a3mega(lib)


def a3mega(lib: str) -> None:
    """The whole A3 Mega table, with the error per size band."""
    with A3MEGA.open() as f:
        table = list(csv.DictReader(f))
    print(f"\nA3 Mega, whole table ({lib}; only ≥ 512 MiB is in the comparison above)")
    bands: dict[str, list[float]] = defaultdict(list)
    for row in table:
        nbytes, measured = int(row["bytes"]), float(row["measured_us"])
        p, how = predict({"topology": "2x8-a3mega-tcpxo.yaml", "op": "allreduce", "algo": "auto",
                          "bytes": row["bytes"]}, lib)
        err = p / measured - 1
        band = "< 64 KiB" if nbytes < 2**16 else "64 KiB – 64 MiB" if nbytes < 2**26 else "≥ 64 MiB"
        bands[band].append(err)
        print(f"  {nbytes:>13,} {measured:>10.1f} {p:>10.1f} {100 * err:>+5.0f}%  {how}")
    for band, errs in bands.items():
        print(f"  {band:16} {len(errs):>2} rows: MAPE {mape(errs):5.1f} %")


if __name__ == "__main__":
    main()
