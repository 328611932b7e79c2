"""One answer (issue 49): the headline is the policy's choice; a per-bucket mix ships as a plan the DDP hook runs
(arcsim.hooks.MixedState, each bucket its own compressor); the sweep's heatmap picks each cell as `arcsim run` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import rank_reports, run_cli

from arcsim.errors import ArcsimError
from arcsim.hooks import MixedState
from arcsim.strategy.plan import FORMAT, BucketPlan, PlannedBucket

HERE = Path(__file__).parent
# 1 Gbit/s Ethernet, L40S, DDP buckets of 0.02 MiB (3 on the shipped digits-CNN trace): auto's mix (fp16, and
# Top-K 0.1 in the last bucket) reaches the target 10.7 % sooner than the best single choice, fp16
MIXED = ("-c", "dense,fp16,topk,star,arctopk", "-t", "8x1-eth1", "--gpu", "l40s", "--ratios", "0.01,0.1",
         "--bucket-mb", "0.02")
SWEPT = "dense,fp16,topk,arctopk,star,randk"


def _run(where: Path, *args: str) -> tuple[str, dict, Path]:
    out, plan = where / "r.json", where / "plan.json"
    r = run_cli("run", *args, "--json", str(out), "--write-plan", str(plan), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split()), json.loads(out.read_text()), plan


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict, Path]]:
    return {p: _run(tmp_path_factory.mktemp(p), *MIXED, "--policy", p) for p in ("auto", "paper", "none")}


def test_the_headline_is_the_policys_per_bucket_mix_with_its_plan(runs):
    for name in ("auto", "paper"):
        text, res, plan_file = runs[name]
        pol, rec = res["policy"], res["recommendation"]
        assert pol["deploy"] == "mix" and rec["compressor"] == "mix", name
        assert rec["iteration_s"] == pytest.approx(pol["iteration_s"])
        assert rec["time_to_target_s"] == pytest.approx(pol["time_to_target_s"])
        plan = rec["plan"]
        assert [(b["bucket"], b["compressor"], b["density"], b["op"], b["collective"]) for b in plan["buckets"]] == \
            [(c["bucket"], c["compressor"], c["density"], c["op"], c["collective"]) for c in pol["choices"]]
        assert [b["elements"] for b in plan["buckets"]] == [b["elements"] for b in res["buckets"]]
        assert json.loads(plan_file.read_text()) == plan  # --write-plan writes the JSON's plan
        head = f"Recommended: per-bucket mix — {BucketPlan.load(plan_file).summary()}:"
        assert text.index(head) < text.index("Iteration time per compressor") and "MixedState.load" in text
    _, auto, _ = runs["auto"]
    single = min((e for e in auto["policy"]["estimates"] if e["excluded"] is None),
                 key=lambda e: e["time_to_target_s"])
    assert auto["recommendation"]["time_to_target_s"] <= 0.95 * single["time_to_target_s"]


def test_without_a_policy_the_fronts_pick_is_planned_in_every_bucket(runs):
    _, res, _ = runs["none"]
    rec, chosen = res["recommendation"], res["pareto"]["chosen"]
    assert (rec["compressor"], rec["collective"], rec["density"]) == \
        (chosen["compressor"], chosen["collective"], chosen["density"])
    plan = BucketPlan.from_dict(rec["plan"])
    assert not plan.is_mix and len(plan.buckets) == len(res["buckets"])
    assert {(b.compressor, b.collective, b.density) for b in plan.buckets} == \
        {(rec["compressor"], rec["collective"], rec["density"])}


def test_write_plan_needs_ddp_buckets(tmp_path):
    r = run_cli("run", "--framework", "horovod", "--write-plan", str(tmp_path / "plan.json"))
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "--write-plan" in r.stderr, r.stderr
    assert not (tmp_path / "plan.json").exists()


def _plan(**change: object) -> dict:
    bucket = {"bucket": 0, "elements": 10, "compressor": "topk", "density": 0.1, "memory": "ef14", **change}
    return {"format": FORMAT, "seed": 0, "scope": "tensor", "buckets": [bucket]}


@pytest.mark.parametrize(("data", "fragment"), [
    ({"buckets": []}, "is not a bucket plan"), (_plan(compressor="zipk"), "unknown compressor"),
    (_plan(density=2), "density must be in (0, 1]"), (_plan(bucket=3), "numbered 0, 1"),
    (_plan(memory="ef99"), "memory must be one of"), ({"format": FORMAT, "buckets": [{"bucket": 0}]}, "lacks a field"),
])
def test_a_bad_plan_is_refused_with_the_reason(data, fragment):
    with pytest.raises(ArcsimError, match="the plan") as err:
        BucketPlan.from_dict(data)
    assert fragment in str(err.value)


def test_the_hook_refuses_a_plan_it_cannot_run_and_buckets_that_are_not_the_plans():
    with pytest.raises(ArcsimError, match="node-aware: give nodes="):
        MixedState(BucketPlan.from_dict(_plan(hierarchy="node")))
    state = MixedState(BucketPlan((PlannedBucket(0, 10, "topk", 0.1, "ef14"),)), step=1)
    with pytest.raises(ArcsimError, match="bucket 0 holds 12 elements, the plan's 10"):
        state.for_bucket(0, 12)
    with pytest.raises(ArcsimError, match="bucket 1 holds 5 elements, the plan's none"):
        state.for_bucket(1, 5)


def test_the_mixed_hook_equals_each_buckets_own_compressor_and_trains(tmp_path):
    """2 gloo ranks: DDP's buckets (after its first iteration) are arcsim's, each runs its planned compressor, and
    its aggregate equals the in-process simulation of that compressor; training with the plan converges."""
    for rep in rank_reports(HERE / "_mixed_ddp.py", 2, tmp_path):
        assert rep["rel_diff"] <= 1e-6, rep["rel_diff"]
        assert rep["ddp"]["1"] == rep["ddp"]["2"] == rep["planned"]  # DDP's rebuilt buckets are the plan's
        ddp, ours = rep["at_0.02_MiB"]  # a cap several parameters share: a bucket ends with the one reaching it
        assert ddp == ours == [17802, 8320], (ddp, ours)
        assert [name for name, _ in rep["ran"].values()] == ["topk", "arctopk", "fp16", "dense", "topk", "arctopk"]
        assert all(made == 1 for _, made in rep["ran"].values())
        assert rep["ops"] == ["allgather", "allreduce"] and rep["steps"] == 3
        assert rep["train"]["last"] < 0.2 * rep["train"]["first"] and rep["train"]["accuracy"] >= 0.8


def test_the_heatmap_picks_each_cell_as_run_recommends(tmp_path):
    """The same trace, topology and density: the sweep's pick (auto: the soonest to the target; none: the front's
    knee) is `arcsim run`'s recommendation, collective included; where Rand-K is fastest it is never picked."""
    from arcsim.sweep.plots import fastest_by_cell, run_pick
    from arcsim.sweep.store import load_results

    done = run_cli("sweep", "-t", "8x1-eth1", "--gpu", "l40s", "-c", SWEPT, "-d", "0.01,0.1", "-b", "100Mbit,1Gbit",
                   "-j", "1", "-o", str(tmp_path / "s"), "--no-plots", timeout=300)
    assert done.returncode == 0, done.stderr
    df = load_results(tmp_path / "s")
    assert set(fastest_by_cell(df, None)[2].ravel()) == {"randk"}  # the fastest is unusable (error 0.99)
    assert fastest_by_cell(df)[2].tolist() == [["topk", "fp16"], ["fp16", "fp16"]]
    for policy, rate, density in (("auto", "100Mbit", 0.01), ("auto", "1Gbit", 0.1), ("none", "100Mbit", 0.01)):
        gbps = {"100Mbit": 0.1, "1Gbit": 1.0}[rate]
        cell = df[(df["nic_gbps"] == gbps) & ((df["density"] == density) | df["compressor"].isin(["dense", "fp16"]))]
        pick = cell.loc[run_pick(cell, policy)]
        _, res, _ = _run(tmp_path, "-t", "8x1-eth1", "--gpu", "l40s", "-c", SWEPT, "--bandwidth", rate, "--density",
                         str(density), "--ratios", str(density), "--policy", policy)
        rec = res["recommendation"]
        assert (pick["compressor"], pick["collective"]) == (rec["compressor"], rec["collective"]), (policy, rate)


def test_the_heatmap_no_longer_shows_what_run_calls_unusable(tmp_path):
    """The default topology at 1 Gbit/s and density 0.001: Top-K's own error (0.937) × 1.25 let Rand-K (0.997) into
    the old rule, which drew it; run recommends fp16 there, and so does the heatmap."""
    from arcsim.sweep.plots import fastest_by_cell
    from arcsim.sweep.store import load_results

    done = run_cli("sweep", "-c", SWEPT, "-d", "0.001,0.01", "-b", "1Gbit,10Gbit", "-j", "1", "-o",
                   str(tmp_path / "s"), "--no-plots", timeout=300)
    assert done.returncode == 0, done.stderr
    _, _, winners, _ = fastest_by_cell(load_results(tmp_path / "s"))
    _, res, _ = _run(tmp_path, "-c", SWEPT, "--bandwidth", "1Gbit", "--density", "0.001", "--ratios", "0.001")
    assert winners[0][0] == res["recommendation"]["compressor"] == "fp16"


def test_a_cell_with_nothing_run_would_recommend_is_no_heatmap():
    import pandas as pd

    from arcsim.sweep.plots import PlotUnsupported, fastest_by_cell

    df = pd.DataFrame([{"compressor": "randk", "density": d, "nic_gbps": 1.0, "iteration_s": 1.0, "rel_error": 0.99,
                        "dense_iteration_s": 2.0} for d in (0.01, 0.1)])
    assert fastest_by_cell(df, None)[2].tolist() == [["randk", "randk"]]
    for policy in ("auto", "none"):
        with pytest.raises(PlotUnsupported, match="add dense to the compressors"):
            fastest_by_cell(df, policy)
