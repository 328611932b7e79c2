"""The time-to-target estimator and the switching bound, on cases whose answers are known by hand."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from arcsim.network_schedule import NetworkSchedule, Phase
from arcsim.run.target import Target
from arcsim.train.bound import Curve, Segment, best_sequence, curve_of, segments_after
from arcsim.train.estimate import Progress, descent_ratio, expected_time, fit_progress, time_over_schedule
from arcsim.train.policies import KEEP_MARGIN, Controller


def test_the_descent_ratio_of_a_top_k_of_the_mean_is_the_energy_it_keeps():
    g = torch.tensor([3.0, -4.0, 1.0, 0.5])
    kept = torch.tensor([3.0, -4.0, 0.0, 0.0])
    assert descent_ratio(g, g) == pytest.approx(1.0)
    assert descent_ratio(g, kept) == pytest.approx(25 / 26.25)
    assert descent_ratio(g, -g) == pytest.approx(-1.0)


def test_the_progress_fit_recovers_an_exponential_law_in_effective_steps():
    """b = 0.9 · exp(−0.02 E), descent 0.5 a step, evaluated every 10 steps: κ = 0.02 exactly; from b_now to the
    target a candidate with descent d needs log(b_now / b*) / (κ d) steps."""
    descents = [0.5] * 40
    steps = [10, 20, 30, 40]
    acc = [1 - 0.9 * math.exp(-0.02 * 0.5 * s) for s in steps]
    target = Target(0.8)
    progress = fit_progress(steps, acc, descents, target)
    assert progress is not None and progress.kappa == pytest.approx(0.02)
    b_now = 0.9 * math.exp(-0.02 * 20)
    assert progress.b_now == pytest.approx(b_now) and progress.b_target == pytest.approx(0.2)
    assert progress.steps_needed(0.25) == pytest.approx(math.log(b_now / 0.2) / (0.02 * 0.25))
    assert progress.steps_needed(0.0) == math.inf
    assert fit_progress([10], [0.5], descents, target) is None  # one evaluation: no slope
    assert fit_progress([10, 20], [0.5, 0.4], descents, target) is None  # getting worse: no progress to fit


def test_the_spread_is_the_fit_noise_read_through_the_gap_to_the_target():
    """log b = 0, −1, −1.5 at E = 10, 20, 30 (descent 1): by hand the least-squares slope is −0.075, the residuals
    (1/12, −1/6, 1/12) give s = √(1/24) and se(κ) = s/√200; Δ = log(e^−1.5 / 0.1)."""
    target = Target(0.9)
    steps = [10, 20, 30]
    acc = [1 - math.exp(x) for x in (0.0, -1.0, -1.5)]
    progress = fit_progress(steps, acc, [1.0] * 30, target)
    assert progress is not None and progress.kappa == pytest.approx(0.075)
    s = math.sqrt(1 / 24)
    gap = math.log(math.exp(-1.5) / 0.1)
    assert progress.spread == pytest.approx(math.hypot(s / gap, s / math.sqrt(200) / 0.075))
    assert progress.steps_needed(0.5) == pytest.approx(gap / (0.075 * 0.5))


def test_with_no_progress_lately_the_second_half_of_the_run_is_fitted():
    """The last four evaluations are flat (no slope to fit): the fit falls back to those of steps ≥ 40 of 80,
    which still fall from 0.5 to 0.3."""
    steps = [10, 20, 30, 40, 50, 60, 70, 80]
    bad = [0.9, 0.8, 0.6, 0.5, 0.3, 0.3, 0.3, 0.3]
    progress = fit_progress(steps, [1 - b for b in bad], [1.0] * 80, Target(0.9))
    e, y = np.array([40, 50, 60, 70, 80.0]), np.log([0.5, 0.3, 0.3, 0.3, 0.3])
    assert progress is not None and progress.kappa == pytest.approx(-np.polyfit(e, y, 1)[0])
    assert fit_progress([*steps[:4], 50, 60], [0.1, 0.2, 0.3, 0.4, 0.3, 0.2], [1.0] * 60, Target(0.9)) is None


def test_the_expected_time_charges_the_chance_of_landing_in_a_slow_phase():
    """A median of 50 steps at 10 ms with a slow phase (1 s a step) from step 60, 10 steps away: without spread
    the time is 0.5 s; with σ = 0.5 a third of the cases run past step 60, and the expectation equals the
    Gauss–Hermite sum over the lognormal by hand."""
    schedule = NetworkSchedule("s", (Phase(0, 1e-3, 1e9), Phase(60, 5e-2, 1e8)))
    seconds = [0.0, 0.01, 1.0]
    sure = Progress(kappa=math.log(4) / 50, b_now=0.4, b_target=0.1, spread=0.0)
    assert sure.steps_needed(1.0) == pytest.approx(50)
    assert expected_time(sure, 1.0, 10, seconds, schedule, 300) == pytest.approx(0.5)
    unsure = dataclasses.replace(sure, spread=0.5)
    z, w = np.polynomial.hermite_e.hermegauss(9)
    by_hand = sum(wi / w.sum() * time_over_schedule(10, 50 * math.exp(0.5 * zi), seconds, schedule, 300)
                  for zi, wi in zip(z, w, strict=True))
    assert expected_time(unsure, 1.0, 10, seconds, schedule, 300) == pytest.approx(by_hand)
    assert by_hand > 3 * 0.5  # the slow tail dominates
    assert sum(w for _, w in unsure.outcomes(1.0)) == pytest.approx(1.0)
    assert unsure.outcomes(0.0) == [(math.inf, 1.0)]


def test_a_loss_target_fits_the_loss_itself():
    steps = [5, 10, 15]
    loss = [4.0 * math.exp(-0.01 * s) for s in steps]
    progress = fit_progress(steps, loss, [1.0] * 15, Target(3.0, "loss"))
    assert progress is not None and progress.kappa == pytest.approx(0.01)
    assert progress.steps_needed(1.0) == pytest.approx(math.log(loss[-1] / 3.0) / 0.01)


def test_time_over_the_schedule_prices_each_step_on_the_network_in_force():
    schedule = NetworkSchedule("s", (Phase(0, 1e-3, 1e9), Phase(50, 5e-2, 1e8)))
    seconds = [9.0, 0.1, 2.0]  # slot 0 unused (the first phase starts at 0)
    assert time_over_schedule(40, 5, seconds, schedule, 100) == pytest.approx(0.5)
    assert time_over_schedule(40, 20, seconds, schedule, 100) == pytest.approx(10 * 0.1 + 10 * 2.0)
    assert time_over_schedule(90, 30, seconds, schedule, 100) == pytest.approx(30 * 2.0)  # past the end: the last
    assert time_over_schedule(40, 0, seconds, schedule, 100) == 0.0
    assert time_over_schedule(40, math.inf, seconds, schedule, 100) == math.inf


def _decide(rows, running=("topk", 0.1), step=40, schedule=None):
    """Controller._soonest on hand-made candidate rows and a run whose progress is known."""
    schedule = schedule or NetworkSchedule("s", (Phase(0, 1e-3, 1e9),))
    steps = [10, 20, 30, 40]
    hist = SimpleNamespace(eval_steps=steps, accuracy=[1 - 0.9 * math.exp(-0.01 * s) for s in steps],
                           val_loss=[math.nan] * 4, descent=[1.0] * 40)
    run = SimpleNamespace(hist=hist, bc=SimpleNamespace(compressor=running[0], density=running[1],
                                                                  hierarchy="flat"))
    ctx = SimpleNamespace(target=Target(0.8), pricing=SimpleNamespace(schedule=schedule),
                          cfg=SimpleNamespace(steps=300))
    controller = Controller("adaptive", 10)
    return rows[controller._soonest(step, rows, run, ctx)], controller


def _row(name, density, descent, slot_s):
    return {"compressor": name, "density": density, "hierarchy": "flat", "descent": descent, "time_s": slot_s[1],
            "slot_s": slot_s}


def test_on_a_steady_network_the_most_progress_per_second_wins():
    """κ = 0.01 per effective step: 1 − acc at step 40 is 0.9·e^−0.4 ≈ 0.603, target 0.2: log(3.02)/0.01 ≈ 110.5
    effective steps. topk@0.1: descent 0.8, 60 ms → 138 steps, 8.3 s; topk@0.033: 0.4, 26 ms → 276 steps, 7.2 s."""
    fast = _row("topk", 0.033, 0.4, [0, 0.026])
    slow = _row("topk", 0.1, 0.8, [0, 0.060])
    chosen, controller = _decide([slow, fast])
    assert chosen is fast and controller.progress_seen["kappa"] == pytest.approx(0.01)
    assert fast["steps_to_target"] == pytest.approx(math.log(0.9 * math.exp(-0.4) / 0.2) / 0.01 / 0.4)


def test_a_slow_network_to_come_turns_the_choice():
    """The same candidates, but from step 100 every step costs 400 ms: the low ratio's extra steps land there."""
    schedule = NetworkSchedule("s", (Phase(0, 1e-3, 1e9), Phase(100, 5e-2, 1e8)))
    fast = _row("topk", 0.033, 0.4, [0, 0.026, 0.40])
    slow = _row("topk", 0.1, 0.8, [0, 0.060, 0.42])
    chosen, _ = _decide([slow, fast], schedule=schedule)
    assert chosen is slow
    assert slow["time_to_target_s"] == pytest.approx(60 * 0.060 + (slow["steps_to_target"] - 60) * 0.42)


def test_the_running_choice_is_kept_unless_another_is_clearly_sooner():
    running = _row("topk", 0.1, 0.8, [0, 0.060])
    barely = _row("arctopk", 0.1, 0.8, [0, 0.060 / (1 + KEEP_MARGIN / 2)])
    chosen, _ = _decide([barely, running])
    assert chosen is running
    clearly = _row("arctopk", 0.1, 0.8, [0, 0.060 / (1 + 2 * KEEP_MARGIN)])
    chosen, _ = _decide([clearly, running])
    assert chosen is clearly


def test_without_a_fit_the_rate_on_the_network_now_decides():
    rows = [_row("topk", 0.1, 0.8, [0, 0.060]), _row("topk", 0.033, 0.4, [0, 0.026])]
    hist = SimpleNamespace(eval_steps=[10], accuracy=[0.3], val_loss=[math.nan], descent=[1.0] * 10)
    run = SimpleNamespace(hist=hist, bc=SimpleNamespace(compressor="topk", density=0.1, hierarchy="flat"))
    ctx = SimpleNamespace(target=Target(0.8), pricing=SimpleNamespace(schedule=None), cfg=SimpleNamespace(steps=100))
    controller = Controller("adaptive", 5)
    picked = controller._soonest(10, rows, run, ctx)
    assert controller.progress_seen is None and rows[picked]["density"] == 0.033  # 0.065 s vs 0.075 s per unit
    assert rows[1]["time_to_target_s"] == pytest.approx(0.026 / 0.4)


def _curve(steps, bad, seconds):
    return Curve(tuple(steps), tuple(np.minimum.accumulate(bad).tolist()), seconds)


def test_the_switching_bound_finds_the_sequence_by_hand():
    """Two segments of 10 steps (networks 1 then 2). A: progress 0.05 a step, 1 s a step on network 1 and 10 s on
    network 2; B: 0.03 a step at 0.5 s on both. From badness 1.0 to 0.2 (0.8 of progress):
    A, A: 10 s + 6 steps × 10 s = 70 s; B, B: 5 s + 0.5 progress left > 10 steps × 0.03: not reached;
    A then B: 10 s (at 0.5), then 0.3 more = 10 steps × 0.5 s = 5 s → 15 s;  B then A: 5 s (at 0.7), then
    0.5 more = 10 steps on network 2 at 10 s → 100 s. The bound is A then B, 15 s plus the warm-up's 2 s."""
    steps = list(range(0, 41))
    a = _curve(steps, [1.0 - 0.05 * s for s in steps], {1: 1.0, 2: 10.0})
    b = _curve(steps, [1.0 - 0.03 * s for s in steps], {1: 0.5, 2: 0.5})
    segments = [Segment(5, 10, 1), Segment(15, 10, 2)]
    found = best_sequence({"A": a, "B": b}, segments, Target(0.8), 1.0, 5, 2.0)
    assert found.sequence == ("A", "B") and found.time_s == pytest.approx(17.0)
    assert found.steps == pytest.approx(5 + 20)


def test_a_curve_carries_progress_by_level_and_segments_cut_at_phases():
    curve = curve_of([5, 10, 15], [0.5, 0.4, 0.6], Target(0.9), {1: 1.0})
    assert curve.best == pytest.approx((0.5, 0.5, 0.4))  # 1 − accuracy, best so far
    assert curve.first_at(0.5) == 5 and curve.first_at(0.45) == 15 and curve.first_at(0.1) is None
    assert curve.level_at(12) == pytest.approx(0.5) and curve.level_at(3) == math.inf
    segs = segments_after(30, 300, [0, 72, 144, 216], lambda s: 1 + sum(s >= b for b in (72, 144, 216)))
    assert [(g.start, g.length, g.slot) for g in segs] == [(30, 42, 1), (72, 72, 2), (144, 72, 3), (216, 84, 4)]


def _history_dir(tmp_path, schedule: bool):
    """A trained directory by hand: topk@0.1 reaches 50 % at steps 10 and 20 (two seeds), dense at 5 and 5."""
    import json

    import pandas as pd

    rows = []
    for seed, (topk_at, dense_at) in enumerate(((10, 5), (20, 5))):
        for name, at in (("topk", topk_at), ("dense", dense_at)):
            for step in (5, 10, 15, 20):
                row = {"seed": seed, "step": step, "accuracy": 0.6 if step >= at else 0.3, "val_loss": 1.0,
                       "time_s": step * 0.1}
                if schedule:
                    row |= {"policy": "static", "choice": f"{name}@0.1" if name == "topk" else name}
                else:
                    row |= {"compressor": name}
                rows.append(row)
    pd.DataFrame(rows).to_csv(tmp_path / "history.csv", index=False)
    config = {"model": "cnn", "density": 0.1} | ({"target": 0.5} if schedule else {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    if not schedule:
        (tmp_path / "target.json").write_text(json.dumps({"target": 0.5}))
    return tmp_path


@pytest.mark.parametrize("schedule", [False, True])
def test_steps_to_target_are_read_from_a_trained_directory(tmp_path, schedule):
    from arcsim.run.convergence import load_trained, time_to_target
    from arcsim.run.decisions import ParetoPoint

    trained = load_trained(str(_history_dir(tmp_path, schedule)))
    assert trained.lookup("topk", 0.1) == (15.0, 2, 2) and trained.lookup("dense", None)[0] == 5.0
    assert trained.lookup("topk", 0.01) is None
    points = [ParetoPoint("dense", "ring", None, 0.010, 0.0, 1.0, 1.0, 0.0, 0.0),
              ParetoPoint("topk", "ring", 0.1, 0.002, 0.3, 0.5, 5.0, 0.0, 0.0),
              ParetoPoint("topk", "ring", 0.01, 0.001, 0.6, 0.2, 10.0, 0.0, 0.0)]
    found = time_to_target(points, points[2], trained)
    assert found["soonest"]["compressor"] == "topk" and found["soonest"]["time_to_target_s"] == pytest.approx(0.03)
    assert found["pick"] is None  # topk@0.01 was not trained there
    assert [r["time_to_target_s"] for r in found["points"]] == pytest.approx([0.05, 0.03])


def test_run_shows_the_soonest_candidate_beside_the_pick(tmp_path):
    import json

    from conftest import run_cli

    (tmp_path / "h").mkdir()
    directory = _history_dir(tmp_path / "h", False)
    r = run_cli("run", "-c", "dense,topk", "--ratios", "0.1", "--history", str(directory), "--json", "-")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    found = payload["time_to_target"]
    evaluated = {(p["compressor"], p["collective"], p["density"]): p["iteration_s"]
                 for p in payload["pareto"]["evaluated"]}
    for row in found["points"]:
        assert row["time_to_target_s"] == pytest.approx(
            row["steps"] * evaluated[(row["compressor"], row["collective"], row["density"])])
    assert found["soonest"]["time_to_target_s"] == min(row["time_to_target_s"] for row in found["points"])
    (directory / "target.json").unlink()
    bad = run_cli("run", "--history", str(directory))
    assert bad.returncode == 2 and "trained without a target" in bad.stderr
    bad = run_cli("run", "--history", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "not an arcsim train directory" in bad.stderr
