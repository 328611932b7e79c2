"""Dense data-parallel scaling efficiency against published series (benchmarks/published/dense_scaling.csv).

    python benchmarks/published_scaling.py            # each row: published, arcsim without and with effects
    python benchmarks/published_scaling.py --fit      # grid-fit the ethernet effects on the rows marked fit=1

Each row is priced as a dense fp32 step (arcsim.run.scaling) of the model's modelled compute on the GPU (scaled
to the run's own one-GPU throughput where the row gives it), on ``<nodes>x<gpus>-<fabric><gbps>-<gpu>-nvlink``
(PCIe where the row's setup says so), under the row's framework. Efficiency as the row defines it: against one
GPU (``baseline`` gpu) or one node of the same cluster (``baseline`` node).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import statistics
import sys
from functools import cache
from pathlib import Path

from arcsim.devices.predict import predict_compute
from arcsim.run.scaling import dense_step
from arcsim.topology import ETH_EFFECTS, NO_EFFECTS, Effects, Topology, load_topology
from arcsim.traces.profile import ComputeProfile

CSV = Path(__file__).parent / "published" / "dense_scaling.csv"


@cache
def profile(model: str, gpu: str, batch: int, precision: str) -> ComputeProfile:
    return predict_compute(model, gpu, batch, precision).profile


def topology(row: dict[str, str], nodes: int, effects: Effects | None) -> Topology:
    link = "pcie" if "pcie" in row["setup"].lower() and "nvlink" not in row["setup"].lower() else "nvlink"
    topo = load_topology(f"{nodes}x{row['gpus_per_node']}-{row['fabric']}{row['gbps']}-{row['gpu']}-{link}")
    return topo if effects is None else dataclasses.replace(topo, effects=effects)


def predicted(row: dict[str, str], effects: Effects | None) -> float:
    prof = profile(row["model"], row["gpu"], int(row["batch"]), row["precision"])
    one = prof.forward_s + prof.backward_s + prof.after_backward_s
    scale = int(row["batch"]) / float(row["img_s_per_gpu"]) / one if row["img_s_per_gpu"] else 1.0

    def eff(nodes: int) -> float:
        if nodes * int(row["gpus_per_node"]) < 2:
            return 1.0
        return dense_step(prof, topology(row, nodes, effects), scale=scale, framework=row["framework"]).efficiency

    e = eff(int(row["nodes"]))
    return e / eff(1) if row["baseline"] == "node" else e


def rows() -> list[dict[str, str]]:
    with CSV.open() as f:
        return list(csv.DictReader(f))


def errors(table: list[dict[str, str]], effects: Effects | None) -> list[float]:
    return [predicted(r, effects if r["fabric"] == "eth" else None) - float(r["efficiency"]) for r in table]


def fit(table: list[dict[str, str]]) -> Effects:
    """The effects minimising the mean |error| on ``table`` over a grid."""
    best, best_err = NO_EFFECTS, float("inf")
    for cv, jit, kappa in itertools.product((0.0, 0.01, 0.02, 0.03, 0.04), (0.0, 25e-6, 50e-6, 100e-6, 200e-6),
                                            (0.0, 0.05, 0.1, 0.2)):
        e = Effects(cv, jit, kappa)
        err = statistics.fmean(abs(x) for x in errors(table, e))
        if err < best_err:
            best, best_err = e, err
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="fit the ethernet effects on the rows marked fit=1")
    args = ap.parse_args(argv)
    table = rows()
    effects = ETH_EFFECTS
    if args.fit:
        effects = fit([r for r in table if r["fit"] == "1"])
        print(f"fitted on the fit=1 rows: {effects}")
        held = [r for r in table if r["fit"] != "1" and r["fabric"] == "eth"]
        print(f"held out ({len(held)} ethernet rows): mean |error| "
              f"{statistics.fmean(abs(x) for x in errors(held, effects)) * 100:.1f} points")
    print(f"{'source':<36}{'fw':<8}{'nodes×gpus':<11}{'net':<8}{'published':>10}{'before':>8}{'after':>8}")
    before_err, after_err = [], []
    for r in table:
        b = predicted(r, NO_EFFECTS)
        a = predicted(r, effects if r["fabric"] == "eth" else None)
        pub = float(r["efficiency"])
        before_err.append(abs(b - pub))
        after_err.append(abs(a - pub))
        print(f"{r['source']:<36}{r['framework']:<8}{r['nodes'] + '×' + r['gpus_per_node']:<11}"
              f"{r['fabric'] + r['gbps']:<8}{pub:>10.1%}{b:>8.1%}{a:>8.1%}" + ("  (fit)" if r["fit"] == "1" else ""))
    print(f"mean |error|: before {statistics.fmean(before_err) * 100:.1f} points, "
          f"after {statistics.fmean(after_err) * 100:.1f} points; within 3 points: "
          f"{sum(e <= 0.03 for e in before_err)} → {sum(e <= 0.03 for e in after_err)} of {len(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
