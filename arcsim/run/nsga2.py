"""NSGA-II (Deb, Pratap, Agarwal & Meyarivan 2002) over integer decision vectors, seeded.

`arcsim run --policy paper` searches each bucket's (compressor, ratio index) with it, as Tyagi & Swany search
the compression ratio. pymoo is not one of arcsim's dependencies; this is the algorithm's plain form:
fast non-dominated sorting, crowding distance, binary tournament on (rank, crowding), uniform crossover and
a ±1 / random-reset mutation per variable, (μ + λ) elitist survival. Infeasible points (``evaluate`` returns
None) rank after every feasible one. Deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Objectives = tuple[float, ...]


def non_dominated_fronts(f: np.ndarray) -> list[list[int]]:
    """Indices of ``f``'s rows (minimisation) by front: the first is the non-dominated set."""
    n = len(f)
    dominates = [[j for j in range(n) if np.all(f[i] <= f[j]) and np.any(f[i] < f[j])] for i in range(n)]
    count = [sum(1 for j in range(n) if np.all(f[j] <= f[i]) and np.any(f[j] < f[i])) for i in range(n)]
    fronts, current = [], [i for i in range(n) if count[i] == 0]
    while current:
        fronts.append(current)
        nxt = []
        for i in current:
            for j in dominates[i]:
                count[j] -= 1
                if count[j] == 0:
                    nxt.append(j)
        current = sorted(nxt)
    return fronts


def crowding(f: np.ndarray) -> np.ndarray:
    """Crowding distance of each row of one front (the extremes infinite)."""
    n, m = f.shape
    d = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for k in range(m):
        order = np.argsort(f[:, k], kind="stable")
        span = f[order[-1], k] - f[order[0], k]
        d[order[0]] = d[order[-1]] = np.inf
        if span > 0:
            d[order[1:-1]] += (f[order[2:], k] - f[order[:-2], k]) / span
    return d


def nsga2(evaluate: Callable[[tuple[int, ...]], Objectives | None], upper: Sequence[int], seed: int,
          population: int = 24, generations: int = 30) -> list[tuple[tuple[int, ...], Objectives]]:
    """The non-dominated (decision, objectives) pairs NSGA-II ends with, each decision once, sorted by the first
    objective. ``upper``: each variable's largest value (variables run from 0)."""
    rng = np.random.default_rng(seed)
    upper_a = np.asarray(upper)
    memo: dict[tuple[int, ...], Objectives | None] = {}

    def objectives(x: np.ndarray) -> np.ndarray:
        key = tuple(int(v) for v in x)
        if key not in memo:
            memo[key] = evaluate(key)
        found = memo[key]
        return np.full(2, np.inf) if found is None else np.asarray(found, dtype=float)

    def ranked(pop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = np.array([objectives(x) for x in pop])
        rank, crowd = np.zeros(len(pop), dtype=int), np.zeros(len(pop))
        for r, front in enumerate(non_dominated_fronts(f)):
            rank[front] = r
            crowd[front] = crowding(f[front])
        return rank, crowd

    pop = np.column_stack([rng.integers(0, u + 1, population) for u in upper_a])
    rank, crowd = ranked(pop)
    for _ in range(generations):
        children = []
        for _ in range(population):
            a, b = (min(rng.integers(0, population, 2), key=lambda i: (rank[i], -crowd[i])) for _ in range(2))
            mask = rng.random(len(upper_a)) < 0.5
            child = np.where(mask, pop[a], pop[b])
            for v in range(len(upper_a)):
                if rng.random() < 1.0 / len(upper_a):
                    child[v] = rng.integers(0, upper_a[v] + 1) if rng.random() < 0.3 else \
                        int(np.clip(child[v] + rng.choice((-1, 1)), 0, upper_a[v]))
            children.append(child)
        both = np.vstack([pop, np.array(children)])
        r_all, c_all = ranked(both)
        keep = sorted(range(len(both)), key=lambda i: (r_all[i], -c_all[i], tuple(both[i])))[:population]
        pop, rank, crowd = both[keep], r_all[keep], c_all[keep]
    seen: dict[tuple[int, ...], Objectives] = {}
    for x in pop:
        key = tuple(int(v) for v in x)
        found = memo[key]
        if found is not None:
            seen[key] = found
    keys = list(seen)
    f = np.array([seen[k] for k in keys])
    first = non_dominated_fronts(f)[0] if keys else []
    return sorted(((keys[i], seen[keys[i]]) for i in first), key=lambda kv: kv[1])
