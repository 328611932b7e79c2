"""How the SimPy DES scales with rank count (printed table; not a test).

Goals on the 2-core dev machine: a 100 MB all-reduce on NNx8-ib400x8 in under 2 s at 1,024 ranks
(hierarchical) and 10 s (ring); every algorithm at 10,240 ranks in under 30 s, the tree at 10,240 and ring and
hierarchical at 102,400 ranks in under 10 s (issue 51). Prints ranks, messages, simulated ranks, events and CPU
seconds per algorithm, then each algorithm's growth exponent: the slope of log(CPU s) against log(ranks) from
1,024 ranks up. Times are the process's CPU time (time.process_time), not wall time: the dev machine's two cores
are shared, and CPU time is what the simulation itself costs.

Usage: python benchmarks/des_scaling.py [--size 100MB] [--full-up-to 256] [--max-ranks 102400]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from arcsim.collectives import build, limits
from arcsim.netsim import analytic, des
from arcsim.topology import from_name
from arcsim.units import parse_size

NODES = (1, 4, 16, 64, 128, 256, 640, 1280, 12800)  # × 8 GPUs: 8 … 102,400 ranks
LARGEST = {"hierarchical": 12800, "ring": 12800, "rhd": 1280, "tree": 1280}  # nodes: the sizes
GOALS = {("hierarchical", 1024): 2.0, ("ring", 1024): 10.0, **{(a, 10240): 30.0 for a in LARGEST},
         ("tree", 10240): 10.0, ("hierarchical", 102400): 10.0, ("ring", 102400): 10.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100MB")
    ap.add_argument("--full-up-to", type=int, default=256,
                    help="also simulate every rank (no symmetry) up to this many ranks, for comparison")
    ap.add_argument("--max-ranks", type=int, default=102400, help="stop at this many ranks")
    args = ap.parse_args()
    n = parse_size(args.size)
    table = Table(title=f"DES scaling: all-reduce of {args.size} on NNx8-ib400x8 (8 GPUs and 8 NICs per node)")
    for col in ("algorithm", "ranks", "messages", "simulated ranks", "events", "CPU s", "DES/closed form",
                "every rank: events", "every rank: CPU s", "goal"):
        table.add_column(col, justify="right")
    walls: dict[str, list[tuple[int, float]]] = {}
    for algo, largest in LARGEST.items():
        for nodes in (m for m in NODES if m <= largest and m * 8 <= args.max_ranks):
            topo = from_name(f"{nodes}x8-ib400x8")
            with limits.allow_any():
                schedule = build("allreduce", algo, n, topo)
                t0 = time.process_time()
                result = des.simulate(schedule, topo)
                wall = time.process_time() - t0
                closed = analytic.schedule_time(schedule, topo)
            walls.setdefault(algo, []).append((topo.ranks, wall))
            full_events, full_wall = "", ""
            if topo.ranks <= args.full_up_to and result.simulated_ranks < topo.ranks:
                t0 = time.process_time()
                every = des.simulate(schedule, topo, use_symmetry=False)
                full_wall = f"{time.process_time() - t0:.3f}"
                full_events = f"{every.events:,}"
                assert abs(every.time_s - result.time_s) <= 1e-9 * result.time_s
            goal = GOALS.get((algo, topo.ranks))
            verdict = "" if goal is None else f"< {goal:g} s: {'met' if wall < goal else 'MISSED'}"
            table.add_row(algo, f"{topo.ranks:,}", f"{schedule.message_count:,}", f"{result.simulated_ranks:,}",
                          f"{result.events:,}", f"{wall:.3f}", f"{result.time_s / closed:.4f}", full_events,
                          full_wall, verdict)
    console = Console(width=200)
    console.print(table)
    for algo, points in walls.items():
        big = [(r, w) for r, w in points if r >= 1024]
        if len(big) >= 2:
            slope = float(np.polyfit([math.log(r) for r, _ in big], [math.log(w) for _, w in big], 1)[0])
            console.print(f"{algo}: CPU time grows as ranks^{slope:.2f} from 1,024 to {big[-1][0]:,} ranks")


if __name__ == "__main__":
    main()
