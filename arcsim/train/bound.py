"""The best switching sequence over a schedule's phases, found by dynamic programming over the static runs.

Each static run of a seed gives a progress curve — the best value of the target's metric reached by each
evaluation — and, from ``by_phase.csv``, its mean step time on every phase's network. All of a seed's
static runs share the warm-up. After it, the run is cut at the phase boundaries into segments of known
length; in each segment a sequence may use any static choice. Progress carries over a switch by level:
a choice taken up at metric level m goes on as its own run did from the first evaluation at which it
reached m. Under that assumption (and the pricing of ``by_phase.csv``) no sequence of the candidates that
switches at phase boundaries reaches the target sooner than the value found here, which is at or below
every static choice's own time (each static choice is one such sequence; their measured times are taken
as candidates too). It is a bound on sequences of the candidates, not on what an adaptive run may do: a
run that switches inside a phase, or a choice that learns faster after another than alone, can beat it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from arcsim.run.target import Target


@dataclass(frozen=True)
class Curve:
    """One static choice: its evaluations (steps, and the best metric value so far in 'badness', lower better)
    and its mean step seconds on each network slot."""

    steps: tuple[int, ...]
    best: tuple[float, ...]            # running minimum of badness at each evaluation
    seconds_by_slot: Mapping[int, float]

    def first_at(self, level: float) -> int | None:
        """The first evaluation step at which this choice had reached ``level`` (None: never)."""
        i = int(np.searchsorted(-np.asarray(self.best), -level, side="left"))
        return self.steps[i] if i < len(self.steps) else None

    def level_at(self, step: int) -> float:
        """The best level reached by ``step`` (inf before the first evaluation)."""
        i = int(np.searchsorted(self.steps, step, side="right")) - 1
        return self.best[i] if i >= 0 else math.inf


@dataclass(frozen=True)
class Segment:
    start: int
    length: int
    slot: int


@dataclass(frozen=True)
class Bound:
    time_s: float                      # NaN when no sequence reaches the target
    steps: float
    sequence: tuple[str, ...]          # the choice of each segment used


def curve_of(steps: Sequence[int], values: Sequence[float], target: Target,
             seconds_by_slot: Mapping[int, float]) -> Curve:
    bad = [1.0 - v if target.metric == "accuracy" else v for v in values]
    bad = [b if math.isfinite(b) else math.inf for b in bad]
    return Curve(tuple(int(s) for s in steps), tuple(np.minimum.accumulate(bad).tolist()) if bad else (),
                 dict(seconds_by_slot))


def best_sequence(curves: Mapping[str, Curve], segments: Sequence[Segment], target: Target, start_level: float,
                  warmup: int, warmup_s: float) -> Bound:
    """The fastest sequence of choices, one per segment, from ``start_level`` at the end of the warm-up."""
    goal = 1.0 - target.value if target.metric == "accuracy" else target.value
    names = sorted(curves)

    @cache
    def value(j: int, level: float) -> tuple[float, float, tuple[str, ...]]:
        """(seconds, steps, choices) from segment j's start at ``level`` to the target."""
        if level <= goal:
            return 0.0, 0.0, ()
        if j == len(segments):
            return math.inf, math.inf, ()
        seg = segments[j]
        best: tuple[float, float, tuple[str, ...]] = (math.inf, math.inf, ())
        for name in names:
            curve = curves[name]
            at, hit = curve.first_at(level), curve.first_at(goal)
            seconds = curve.seconds_by_slot.get(seg.slot, math.nan)
            if at is None or not math.isfinite(seconds):
                continue
            option: tuple[float, float, tuple[str, ...]]
            if hit is not None and hit - at <= seg.length:
                option = ((hit - at) * seconds, float(hit - at), (name,))
            else:
                nxt = value(j + 1, min(level, curve.level_at(at + seg.length)))
                option = (seg.length * seconds + nxt[0], seg.length + nxt[1], (name, *nxt[2]))
            if option[0] < best[0]:
                best = option
        return best

    seconds, steps, sequence = value(0, start_level)
    if not math.isfinite(seconds):
        return Bound(math.nan, math.nan, ())
    return Bound(warmup_s + seconds, warmup + steps, sequence)


def segments_after(warmup: int, steps: int, starts: Sequence[int], slot_at) -> list[Segment]:
    """The run after its warm-up, cut at the phase ``starts``; ``slot_at(step)`` names each piece's network."""
    cuts = sorted({warmup, *(s for s in starts if warmup < s < steps), steps})
    return [Segment(a, b - a, slot_at(a)) for a, b in itertools.pairwise(cuts) if b > a]
