"""NSGA-II (Deb, Pratap, Agarwal & Meyarivan 2002) over integer decision vectors, seeded — pymoo's.

`arcsim run --policy paper` searches each bucket's (compressor, ratio index) with it, as Tyagi & Swany search
the compression ratio with pymoo. Integer variables: random integer sampling, SBX crossover and polynomial
mutation rounded to integers, duplicates eliminated; a decision ``evaluate`` calls infeasible (None) carries a
violated constraint, so it ranks after every feasible one. Deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Objectives = tuple[float, ...]


def nsga2(evaluate: Callable[[tuple[int, ...]], Objectives | None], upper: Sequence[int], seed: int,
          population: int = 24, generations: int = 30) -> list[tuple[tuple[int, ...], Objectives]]:
    """The non-dominated (decision, objectives) pairs NSGA-II ends with, each decision once, sorted by the first
    objective. ``upper``: each variable's largest value (variables run from 0)."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import ElementwiseProblem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.optimize import minimize

    memo: dict[tuple[int, ...], Objectives | None] = {}

    def objectives(x: np.ndarray) -> Objectives | None:
        key = tuple(int(np.rint(v)) for v in x)
        if key not in memo:
            memo[key] = evaluate(key)
        return memo[key]

    probe = objectives(np.zeros(len(upper)))
    n_obj = len(probe) if probe is not None else 2

    class Problem(ElementwiseProblem):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(n_var=len(upper), n_obj=n_obj, n_ieq_constr=1, xl=0, xu=np.asarray(upper), vtype=int)

        def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            found = objectives(x)
            out["F"] = np.full(n_obj, 1e30) if found is None else np.asarray(found, dtype=float)
            out["G"] = [1.0 if found is None else -1.0]

    algorithm = NSGA2(pop_size=population, sampling=IntegerRandomSampling(),
                      crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=20, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    result = minimize(Problem(), algorithm, ("n_gen", generations), seed=seed, verbose=False)
    xs = np.atleast_2d(result.X) if result.X is not None else np.zeros((0, len(upper)))
    found = {tuple(int(np.rint(v)) for v in x) for x in xs}
    front = [(x, memo[x]) for x in found if memo.get(x) is not None]
    return sorted(((x, f) for x, f in front if f is not None), key=lambda p: (p[1][0], p[0]))
