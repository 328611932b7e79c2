"""Networks that change during training: schedules, the policies that follow them, resuming, and the CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_cli

from arcsim.network_schedule import NetworkSchedule, Phase, ScheduleError, load_schedule
from arcsim.run.measure import BucketedCompression
from arcsim.run.target import Target
from arcsim.topology import load_topology
from arcsim.train import scheduled
from arcsim.train.estimate import Progress, time_over_schedule
from arcsim.train.loop import TrainConfig, prepare
from arcsim.train.policies import KEEP_MARGIN, Pricing, asf, warmup_density
from arcsim.train.scheduled import (
    ScheduledConfig,
    ScheduledExperiment,
    decisions,
    headline,
    load_bounds,
    summarise,
)
from arcsim.units import parse_duration, parse_rate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_shipped_schedules_load_in_steps():
    c1, c2 = load_schedule(EXAMPLES / "schedule-c1.yaml"), load_schedule(EXAMPLES / "schedule-c2.yaml")
    assert [p.start for p in c1.phases] == [0, 72, 144, 216]  # epochs 0, 12, 24, 36 of 6 steps
    assert [(p.latency_s, p.bandwidth) for p in c1.phases] == [
        (1e-3, parse_rate("25Gbps")), (1e-3, parse_rate("1Gbps")), (50e-3, parse_rate("1Gbps")),
        (50e-3, parse_rate("25Gbps"))]
    assert len(c2.phases) == 6 and c2.phases[0].bandwidth != c2.phases[1].bandwidth
    c1.check_steps(300)
    assert (c1.index_at(0), c1.index_at(71), c1.index_at(72), c1.index_at(299)) == (0, 0, 1, 3)
    assert NetworkSchedule("late", (Phase(5, 0.0, 1.0),)).index_at(4) is None


BAD = {
    "unsorted": ("phases:\n  - {start: 10, latency: 1ms, bandwidth: 1Gbps}\n"
                 "  - {start: 5, latency: 1ms, bandwidth: 1Gbps}\n", "phase 2 starts at step 5, not after phase 1"),
    "overlap": ("phases:\n  - {start: 0, latency: 1ms, bandwidth: 1Gbps}\n"
                "  - {start: 0, latency: 5ms, bandwidth: 1Gbps}\n", "must be sorted and must not overlap"),
    "zero": ("phases:\n  - {start: 0, latency: 1ms, bandwidth: 0Gbps}\n", "bandwidth must be positive"),
    "negative": ("phases:\n  - {start: 0, latency: 1ms, bandwidth: -1Gbps}\n", "cannot read bandwidth '-1Gbps'"),
    "latency": ("phases:\n  - {start: 0, latency: soon, bandwidth: 1Gbps}\n", "cannot read duration 'soon'"),
    "late": ("phases:\n  - {start: 0, latency: 1ms, bandwidth: 1Gbps}\n"
             "  - {start: 40, latency: 1ms, bandwidth: 9Gbps}\n", "phase 2 starts at step 40, past the run's 20 steps"),
    "epoch": ("unit: epoch\nphases:\n  - {start: 0, latency: 1ms, bandwidth: 1Gbps}\n", "needs steps_per_epoch"),
    "keys": ("phases:\n  - {start: 0, bandwidth: 1Gbps}\n", "phase 1 lacks latency"),
    "empty": ("name: x\n", "non-empty 'phases' list"),
    "yaml": ("phases: [\n", "is malformed YAML"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_schedules_are_one_line_exit_2_before_any_training(tmp_path, kind):
    text, fragment = BAD[kind]
    (tmp_path / "s.yaml").write_text(text)
    out = tmp_path / "out"
    r = run_cli("train", "--model", "mlp", "--steps", "20", "--network-schedule", str(tmp_path / "s.yaml"),
                "--target", "0.5", "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (("--policy", "greedy", "--target", "0.5"), "unknown policy 'greedy'"),
    (("--policy", "static,bound"), "--policy bound needs a target"),
    (("--candidates", "zip", "--target", "0.5"), "unknown candidate compressor 'zip'"),
    (("--ratios", "0.1,2", "--target", "0.5"), "'--ratios': value 2 of '0.1,2': must lie in (0, 1]"),
    (("--warmup", "25", "--target", "0.5"), "--warmup must lie in [0, 20) steps"),
    (("--policy", "static", "--stop-at-target"), "--stop-at-target needs a target"),
])
def test_bad_policy_requests(tmp_path, args, fragment):
    (tmp_path / "s.yaml").write_text("phases:\n  - {start: 0, latency: 1ms, bandwidth: 1Gbps}\n"
                                     "  - {start: 10, latency: 9ms, bandwidth: 1Gbps}\n")
    r = run_cli("train", "--model", "mlp", "--steps", "20", "--network-schedule", str(tmp_path / "s.yaml"),
                *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_a_missing_schedule_file_is_named(tmp_path):
    r = run_cli("train", "--network-schedule", str(tmp_path / "nope.yaml"), "--target", "0.5")
    assert r.returncode == 2 and r.stderr.strip() == f"error: network schedule {tmp_path / 'nope.yaml'} does not exist"


def test_policy_flags_need_a_schedule():
    r = run_cli("train", "--policy", "adaptive", "--steps", "5")
    assert r.returncode == 2 and "--policy goes with --network-schedule" in r.stderr


def test_warmup_and_asf():
    assert warmup_density(0, 10) == pytest.approx(1.0) and warmup_density(9, 10) == pytest.approx(0.1)
    ramp = [warmup_density(s, 10) for s in range(10)]
    assert all(a > b for a, b in itertools.pairwise(ramp))
    # times 1, 2, 3 and gains 0.2, 0.6, 0.9: t̂ = 0, .5, 1; ĝ = 1, 3/7, 0 → max(.6t̂, .4ĝ) = .4, .3, .6
    assert asf([1, 2, 3], [0.2, 0.6, 0.9], (0.6, 0.4)) == pytest.approx([0.4, 0.3, 0.6])


def test_switching_compressors_keeps_what_error_feedback_owes():
    setup = prepare(TrainConfig(model="mlp", steps=2))
    bc = BucketedCompression(setup.buckets, "topk", 0.01, "ef14")
    g = torch.randn(8, setup.elements)
    bc.step(0, g)
    owed = bc.mems[0].error.clone()
    bc.switch("arctopk", 0.05)
    assert bc.compressor == "arctopk" and bc.mems[0].error is not None and torch.equal(bc.mems[0].error, owed)


SCHEDULE = NetworkSchedule("test", (Phase(0, parse_duration("1ms"), parse_rate("25Gbps")),
                                    Phase(12, parse_duration("50ms"), parse_rate("1Gbps"))))


def _config(steps: int = 24, policies=("static", "adaptive", "bound"), objective="time-to-target") -> ScheduledConfig:
    cfg = TrainConfig(model="mlp", steps=steps, eval_every=4, seeds=(0,))
    return ScheduledConfig(cfg, SCHEDULE, "8x1-eth10", policies=policies, candidates=("topk", "arctopk"),
                           ratios=(0.1, 0.01), target=Target(0.3), warmup=4, objective=objective)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    out = tmp_path_factory.mktemp("schedule")
    history = ScheduledExperiment(_config(), out).run()
    return out, history


def test_each_step_is_priced_on_the_network_in_force(experiment):
    _out, history = experiment
    static = history[(history["policy"] == "static") & (history["choice"] == "topk@0.1")].sort_values("step")
    per_step = np.diff(np.concatenate([[0.0], static["time_s"].to_numpy()]))
    slow, fast = per_step[12:], per_step[4:12]  # after warm-up: 1 ms / 25 Gbit/s, then 50 ms / 1 Gbit/s
    assert slow.min() > 10 * fast.max()  # 50 ms latency dominates
    assert set(static["phase"]) == {1, 2} and (static["step"] <= 12).sum() == (static["phase"] == 1).sum()
    assert static["collective"].iloc[4:].nunique() == 1  # static: one collective after warm-up


def test_adaptive_decides_at_warmup_end_and_at_the_network_change_by_estimated_time_to_target(experiment):
    out, history = experiment
    log = decisions(out)
    assert [d["reason"] for d in log][:2] == ["warm-up over", "network changed"]
    assert [d["step"] for d in log][:2] == [4, 12]
    assert log[1]["progress"] is not None and log[1]["progress"]["kappa"] > 0  # fitted on evaluations 4, 8, 12
    for d in log:
        assert d["objective"] == "time-to-target" and len(d["candidates"]) == 4  # topk, arctopk × 0.1, 0.01
        soonest = min(c["time_to_target_s"] for c in d["candidates"])
        # the chosen one is the soonest, or the running one kept within the margin
        assert d["chosen"]["time_to_target_s"] <= soonest * (1 + KEEP_MARGIN)
        for c in d["candidates"]:  # each estimate: its steps over their spread, priced on the networks to come
            if math.isfinite(c["steps_to_target"]):
                progress = Progress(**d["progress"])
                assert c["steps_to_target"] == pytest.approx(progress.steps_needed(c["descent"]))
                assert c["time_to_target_s"] == pytest.approx(sum(
                    w * time_over_schedule(d["step"], n, c["slot_s"], SCHEDULE, 24)
                    for n, w in progress.outcomes(c["descent"])))
        # exploring compresses every candidate on this step: that local work is charged to the step
        assert d["exploration_s"] > 0
        assert d["exploration_s"] == pytest.approx(sum(c["compress_s"] for c in d["candidates"]))
    adaptive = history[history["policy"] == "adaptive"].sort_values("step")
    # the step a decision is taken on costs what the chosen candidate was priced at, plus the exploration
    per_step = np.diff(np.concatenate([[0.0], adaptive["time_s"].to_numpy()]))
    for d in log:
        assert per_step[d["step"]] == pytest.approx(d["chosen"]["time_s"] + d["exploration_s"], rel=1e-9)
    after = adaptive[adaptive["step"] == 13].iloc[0]  # step 12 (0-based) is the first of phase 2
    assert (after["compressor"], after["density"], after["collective"]) == (
        log[1]["chosen"]["compressor"], log[1]["chosen"]["density"], log[1]["chosen"]["collective"])


def test_the_asf_objective_picks_the_lowest_scalarised_candidate(tmp_path):
    ScheduledExperiment(_config(policies=("adaptive",), objective="asf"), tmp_path).run()
    for d in decisions(tmp_path):
        best = min(d["candidates"], key=lambda c: (c["asf"], c["time_s"]))
        assert d["chosen"]["compressor"] == best["compressor"] and d["chosen"]["density"] == best["density"]
        assert d["chosen"]["asf"] == pytest.approx(min(c["asf"] for c in d["candidates"]))


def test_the_bound_is_at_or_ahead_of_every_static_choice(experiment):
    out, history = experiment
    bound = load_bounds(out)
    assert list(bound["seed"]) == [0]
    static = summarise(history[history["policy"] == "static"], Target(0.3))
    reached = static["time_to_target_s"].dropna()
    if not reached.empty:
        assert bound["time_to_target_s"].iloc[0] <= reached.min() + 1e-12
    by_phase = pd.read_csv(out / "by_phase.csv")
    assert set(by_phase["phase"]) == {0, 1, 2} and (by_phase["step_s"] > 0).all()


def test_summary_and_headline(experiment):
    _, history = experiment
    summary = summarise(history, Target(0.3), load_bounds(experiment[0]))
    assert set(summary["policy"]) == {"static", "adaptive", "bound"} and len(summary) == 6
    top = headline(summary, Target(0.3))
    assert list(top["policy"]) == ["static", "adaptive", "bound"]
    static = summary[summary["policy"] == "static"]
    assert top.iloc[0]["time_to_target_s"] == pytest.approx(static["time_to_target_s"].min(), nan_ok=True)


def test_an_interrupted_adaptive_run_resumes_with_its_decisions_intact(tmp_path, monkeypatch, experiment):
    """Stopped after a checkpoint, then run again: the history and the decision log equal an unbroken run's."""
    monkeypatch.setattr(scheduled, "CHECKPOINT_EVERY", 5)
    cfg = _config(policies=("adaptive",))
    steps = []

    def stop_at_17(done: int, total: int) -> None:
        steps.append(done)
        if done == 17:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ScheduledExperiment(cfg, tmp_path, progress=stop_at_17).run()
    assert (tmp_path / "checkpoints" / "adaptive-adaptive-s0.pt").exists() and not (tmp_path / "history.csv").exists()
    said: list[str] = []
    resumed = ScheduledExperiment(cfg, tmp_path, announce=said.append).run()
    assert any("going on from the checkpoint at step 15" in s for s in said)
    assert not (tmp_path / "checkpoints" / "adaptive-adaptive-s0.pt").exists()
    out, whole = experiment
    ref = whole[whole["policy"] == "adaptive"].reset_index(drop=True)
    pd.testing.assert_frame_equal(resumed.reset_index(drop=True), ref, check_dtype=False)
    assert [d for d in decisions(tmp_path)] == [d for d in decisions(out) if d["policy"] == "adaptive"]


def test_train_cli_under_a_schedule_writes_table_json_decisions_and_chart(tmp_path):
    (tmp_path / "s.yaml").write_text("name: two\nphases:\n  - {start: 0, latency: 1ms, bandwidth: 25Gbps}\n"
                                     "  - {start: 8, latency: 50ms, bandwidth: 1Gbps}\n")
    r = run_cli("train", "--model", "mlp", "--steps", "16", "--eval-every", "4", "--network-schedule",
                str(tmp_path / "s.yaml"), "--candidates", "topk,arctopk", "--ratios", "0.1,0.01", "--target", "0.3",
                "--warmup", "2", "--out", str(tmp_path / "o"), "--json", "-")
    assert r.returncode == 0, r.stderr
    payload = json.loads(r.stdout)
    assert [p["start_step"] for p in payload["phases"]] == [0, 8]
    assert [h["policy"] for h in payload["headline"]] == ["static", "adaptive", "bound"]
    first = payload["decisions"][0]
    assert {"step", "network", "reason", "chosen", "candidates"} <= set(first)
    assert (tmp_path / "o" / "accuracy_vs_time.png").stat().st_size > 10_000


def test_run_with_a_schedule_gives_each_phase_its_choice(tmp_path):
    (tmp_path / "s.yaml").write_text("name: two\nphases:\n  - {start: 0, latency: 5us, bandwidth: 100Gbps}\n"
                                     "  - {start: 8, latency: 50ms, bandwidth: 100Mbps}\n")
    r = run_cli("run", "--compressors", "topk,arctopk,randk", "--ratios", "0.01,0.1", "--network-schedule",
                str(tmp_path / "s.yaml"), "--json", "-")
    assert r.returncode == 0, r.stderr
    phases = json.loads(r.stdout)["phases"]
    assert [p["phase"] for p in phases] == [1, 2] and phases[1]["network"] == "50 ms / 100 Mbit/s"
    for p in phases:
        assert {"compressor", "collective", "density", "iteration_s"} <= set(p["chosen"])
    assert phases[1]["dense_iteration_s"] > 10 * phases[0]["dense_iteration_s"]
    bad = run_cli("run", "--network-schedule", str(tmp_path / "s.yaml"), "--bandwidth", "1Gbit")
    assert bad.returncode == 2 and "without --bandwidth and --latency" in bad.stderr


def test_pricing_before_the_first_phase_uses_the_topologys_own_network():
    setup = prepare(TrainConfig(model="mlp", steps=2))
    topo = load_topology("8x1-eth10")
    late = NetworkSchedule("late", (Phase(5, 0.05, 1e8),))
    pricing = Pricing(setup, topo, late, "analytic", "tensor")
    assert pricing.slot(4) == 0 and pricing.slot(5) == 1
    assert pricing.contexts[0].topo.network.latency == topo.network.latency
    assert pricing.contexts[1].topo.network.latency == 0.05
    assert math.isclose(pricing.contexts[1].topo.network.bandwidth_per_nic, 1e8)
    with pytest.raises(ScheduleError, match="past the run's 5 steps"):
        late.check_steps(5)


def test_a_checkpoint_it_cannot_read_starts_that_run_over(tmp_path, experiment):
    cfg = _config(policies=("adaptive",))
    ScheduledExperiment(cfg, tmp_path)  # the directory, claimed
    ckpt = tmp_path / "checkpoints" / "adaptive-adaptive-s0.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"cut off mid-write")
    said: list[str] = []
    again = ScheduledExperiment(cfg, tmp_path, announce=said.append).run()
    assert any("is unreadable" in s and "starts over" in s for s in said)
    _, whole = experiment
    pd.testing.assert_frame_equal(again.reset_index(drop=True),
                                  whole[whole["policy"] == "adaptive"].reset_index(drop=True), check_dtype=False)


def test_train_under_a_schedule_takes_gpu_and_library_without_a_topology(tmp_path):
    """Under --network-schedule the steps are priced on the schedule's default topology, so --gpu and --library need
    no --topology there (an earlier check refused them): this run gets past them to the candidates' check."""
    r = run_cli("train", "--model", "cnn", "--network-schedule", str(EXAMPLES / "schedule-c1.yaml"),
                "--gpu", "h100", "--library", "gloo", "--steps", "1", "-w", "2", "--candidates", "bogus",
                "-o", str(tmp_path / "t"), cwd=str(tmp_path))
    assert r.returncode == 2 and "unknown candidate compressor 'bogus'" in r.stderr, r.stderr[-1000:]
