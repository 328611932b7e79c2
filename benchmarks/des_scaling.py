"""How the SimPy DES scales with rank count (printed table; not a test).

Goals (issue #2, on the 2-core dev machine): one 100 MB hierarchical all-reduce on 128x8-ib400x8
(1,024 ranks) in under 2 s, a flat ring all-reduce on 1,024 ranks in under 10 s.

Usage: python benchmarks/des_scaling.py [--size 100MB] [--full-up-to 256]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from arcsim.collectives import build
from arcsim.netsim import analytic, des
from arcsim.topology import from_name
from arcsim.units import parse_size

GOALS = {("hierarchical", 1024): 2.0, ("ring", 1024): 10.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100MB")
    ap.add_argument("--full-up-to", type=int, default=256,
                    help="also simulate every rank (no symmetry) up to this many ranks, for comparison")
    args = ap.parse_args()
    n = parse_size(args.size)
    table = Table(title=f"DES scaling: all-reduce of {args.size} on NNx8-ib400x8 (8 GPUs and 8 NICs per node)")
    for col in ("algorithm", "ranks", "messages", "simulated ranks", "events", "wall s", "DES/closed form",
                "every rank: events", "every rank: wall s", "goal"):
        table.add_column(col, justify="right")
    for algo in ("hierarchical", "ring", "rhd", "tree"):
        for nodes in (1, 2, 4, 8, 16, 32, 64, 128):
            topo = from_name(f"{nodes}x8-ib400x8")
            schedule = build("allreduce", algo, n, topo)
            t0 = time.perf_counter()
            result = des.simulate(schedule, topo)
            wall = time.perf_counter() - t0
            closed = analytic.schedule_time(schedule, topo)
            full_events, full_wall = "", ""
            if topo.ranks <= args.full_up_to and result.simulated_ranks < topo.ranks:
                t0 = time.perf_counter()
                every = des.simulate(schedule, topo, use_symmetry=False)
                full_wall = f"{time.perf_counter() - t0:.3f}"
                full_events = f"{every.events:,}"
                assert abs(every.time_s - result.time_s) <= 1e-9 * result.time_s
            goal = GOALS.get((algo, topo.ranks))
            verdict = "" if goal is None else f"< {goal:g} s: {'met' if wall < goal else 'MISSED'}"
            table.add_row(algo, str(topo.ranks), f"{schedule.message_count:,}", str(result.simulated_ranks),
                          f"{result.events:,}", f"{wall:.3f}", f"{result.time_s / closed:.4f}", full_events,
                          full_wall, verdict)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
