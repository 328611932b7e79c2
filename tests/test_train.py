"""`arcsim train`: real data-parallel training through compressors, priced per step, resumable, judged."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_cli

from arcsim.errors import ArcsimError
from arcsim.models import loss_fn, model_entry
from arcsim.run.target import Target
from arcsim.train import experiment
from arcsim.train.experiment import load_history, run_experiment
from arcsim.train.loop import TrainConfig, prepare, train
from arcsim.train.outcome import claims, summarise

SMALL = {"model": "mlp", "dataset": "digits", "workers": 4, "batch": 8, "steps": 12, "eval_every": 4}


def test_dense_training_is_sgd_on_the_global_batch():
    cfg = TrainConfig(**SMALL, compressors=("dense",))
    setup = prepare(cfg)
    hist = train(cfg, setup, "dense", seed=3)
    # the same steps by hand: one model, the whole global batch, plain torch
    entry = model_entry("mlp")
    torch.manual_seed(3)
    model = entry.build(setup.data.spec)
    opt = torch.optim.SGD(model.parameters(), lr=entry.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(3)
    for step in range(cfg.steps):
        x, y = setup.data.draw(cfg.workers * cfg.batch, gen)
        # the mean of equal shards' mean losses is the global mean loss, so its gradient is the workers' mean
        per_worker = [loss_fn("image", model(xw), yw) for xw, yw in zip(x.chunk(4), y.chunk(4), strict=True)]
        loss = torch.stack(per_worker).mean()
        assert hist.loss[step] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert hist.eval_steps == [4, 8, 12]
    assert len(hist.measurement.records) == cfg.steps


def test_sparsifiers_send_what_their_density_says_and_keep_training_finite():
    cfg = TrainConfig(**SMALL, density=0.05)
    setup = prepare(cfg)
    for name in ("topk", "arctopk", "randk"):
        hist = train(cfg, setup, name, seed=0)
        assert hist.diverged_at is None and all(np.isfinite(hist.loss))
        assert hist.measurement.density_achieved() == pytest.approx(0.05, rel=0.5)
        assert 0 < hist.measurement.rel_error() < 1


def test_steps_are_priced_on_the_topology_slower_network_costs_more(tmp_path):
    cfg = TrainConfig(**SMALL, compressors=("dense", "topk"))
    # the same GPU on both (8x1-ib400 names none: its compute would be timed on this machine, and move with its load)
    fast = run_experiment(cfg, tmp_path / "fast", "8x1-ib400", announce=lambda _: None, gpu="l40s")
    slow = run_experiment(cfg, tmp_path / "slow", "8x1-eth1", announce=lambda _: None, gpu="l40s")
    for name in ("dense", "topk"):
        f = fast[fast["compressor"] == name]["time_s"].to_numpy()
        s = slow[slow["compressor"] == name]["time_s"].to_numpy()
        assert (np.diff(f) > 0).all() and (s > f).all()
        pd.testing.assert_series_equal(fast[fast["compressor"] == name]["loss"].reset_index(drop=True),
                                       slow[slow["compressor"] == name]["loss"].reset_index(drop=True))
    assert all(c.startswith("AG") for c in slow[slow["compressor"] == "topk"]["collective"])


def test_resume_adds_only_missing_runs_and_refuses_other_settings(tmp_path, monkeypatch):
    out = tmp_path / "t"
    cfg = TrainConfig(**SMALL, compressors=("dense", "topk"), seeds=(0,))
    run_experiment(cfg, out, announce=lambda _: None)
    calls = []
    real = experiment.train
    monkeypatch.setattr(experiment, "train", lambda *a, **k: calls.append(a[2:4]) or real(*a, **k))
    with (out / "history.csv").open("a") as fh:  # a third run cut off mid-write by a kill
        fh.write("randk,0,ef14,1,2.3,,,AR rhd,False\nrandk,0,ef14,2,2.2")
    more = TrainConfig(**SMALL, compressors=("dense", "topk"), seeds=(0, 1))
    history = run_experiment(more, out, announce=lambda _: None)
    assert sorted(calls) == [("dense", 1), ("topk", 1)]
    assert set(map(tuple, history[["compressor", "seed"]].drop_duplicates().to_numpy())) == {
        ("dense", 0), ("topk", 0), ("dense", 1), ("topk", 1)}
    assert "randk" not in set(load_history(out)["compressor"])  # the partial run was dropped
    with pytest.raises(ArcsimError, match="steps differ"):
        run_experiment(TrainConfig(**{**SMALL, "steps": 13}), out, announce=lambda _: None)


def _summary_row(name: str, accs: list[float]) -> list[dict]:
    return [{"compressor": name, "seed": s, "memory": "ef14", "step": 10, "loss": 0.1, "accuracy": a,
             "val_loss": 1 - a, "time_s": 1.0, "collective": "", "diverged": False} for s, a in enumerate(accs)]


def test_claims_are_judged_against_the_seed_noise():
    close = pd.DataFrame(_summary_row("topk", [0.90, 0.92, 0.91]) + _summary_row("arctopk", [0.91, 0.90, 0.92])
                         + _summary_row("randk", [0.50, 0.55, 0.52]))
    lines = claims(summarise(close, None), None)
    assert lines[0].startswith("ARC-Top-K matches Top-K accuracy: reproduced")
    assert lines[1].startswith("Rand-K at the same density converges worse than Top-K: reproduced")
    apart = pd.DataFrame(_summary_row("topk", [0.90, 0.91, 0.90]) + _summary_row("arctopk", [0.70, 0.71, 0.69]))
    assert "NOT reproduced" in claims(summarise(apart, None), None)[0]
    one_seed = pd.DataFrame(_summary_row("topk", [0.9]) + _summary_row("arctopk", [0.9]))
    assert "not judged" in claims(summarise(one_seed, None), None)[0]


def test_target_never_reached_is_reported_not_an_error():
    history = pd.DataFrame(_summary_row("topk", [0.5, 0.6, 0.55]) + _summary_row("dense", [0.97, 0.96, 0.98]))
    table = summarise(history, Target(0.95)).set_index("compressor")
    assert table.loc["topk", "reached"] == "0/3" and math.isnan(table.loc["topk", "steps_to_target"])
    assert table.loc["dense", "reached"] == "3/3" and table.loc["dense", "steps_to_target"] == 10


@pytest.mark.parametrize(("args", "fragment"), [
    (("--target", "1.5"), "'--target': must lie in (0, 1]"),
    (("-c", "topk,zip"), "unknown compressor zip"),
    (("--dataset", "synthetic-images"), "no held-out split"),
    (("--workers", "200", "--batch", "16"), "exceeds the"),
    (("--seeds", "a"), "'--seeds': value 1 of 'a': 'a' is not a number"),
    (("--topology", "moon"), "unknown topology"),
    (("--hierarchy", "node"), "give --topology with two or more GPUs per node"),
    (("--hierarchy", "node", "-t", "8x1-eth10"), "give --topology with two or more GPUs per node"),
    (("--hierarchy", "node", "-t", "2x8-ib100", "-w", "3"), "cannot be grouped"),
    (("--hierarchy", "both", "-t", "2x2-eth10"), "train runs one hierarchy"),
])
def test_bad_requests_are_one_line_exit_2(args, fragment, tmp_path):
    r = run_cli("train", *args, "-o", str(tmp_path / "t"), timeout=120)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr
    assert not (tmp_path / "t").exists()


def test_node_aware_training_dense_is_flat_dense_and_topk_sends_only_between_nodes(tmp_path):
    """Node-aware dense is the flat mean (the same run, step for step); node-aware Top-K's records are the node's
    reduce-scatter and all-gather and one rail's all-gather, and its steps are priced on the 2 × 2 topology."""
    flat = TrainConfig(**SMALL, compressors=("dense",))
    node = TrainConfig(**SMALL, compressors=("dense", "topk"), hierarchy="node", gpus_per_node=2)
    setup = prepare(flat)
    np.testing.assert_allclose(train(node, setup, "dense", seed=1).loss, train(flat, setup, "dense", seed=1).loss,
                               rtol=1e-5)
    hist = train(node, setup, "topk", seed=1)
    assert hist.measurement.hierarchy == "node" and all(np.isfinite(hist.loss))
    groups = [(r.op, r.group) for bucket in hist.measurement.records[0] for r in bucket]
    assert groups == [("reducescatter", "node"), ("allgather", "inter"), ("allgather", "node")] * len(setup.buckets)
    out = tmp_path / "t"
    r = run_cli("train", "--model", "mlp", "-c", "dense,topk", "--steps", "8", "--eval-every", "4", "--workers", "4",
                "--batch", "8", "-t", "2x2-eth10", "--hierarchy", "node", "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "node-aware (2 nodes × 2)" in r.stderr
    history = load_history(out)
    assert np.isfinite(history["time_s"]).all() and set(history["compressor"]) == {"dense", "topk"}
    assert '"hierarchy": "node"' in (out / "config.json").read_text()


def test_cli_end_to_end_with_seeds_topology_and_target(tmp_path):
    out = tmp_path / "t"
    r = run_cli("train", "--model", "mlp", "-c", "dense,topk,arctopk,randk", "--steps", "20", "--eval-every", "5",
                "--workers", "4", "--batch", "8", "--seeds", "0,1,2", "--topology", "8x1-eth1", "--target", "0.99",
                "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    assert "ARC-Top-K matches Top-K accuracy:" in r.stdout and "Rand-K at the same density" in r.stdout
    summary = pd.read_csv(out / "summary.csv").set_index("compressor")
    assert list(summary.index) == ["dense", "topk", "arctopk", "randk"] and (summary["seeds"] == 3).all()
    assert "not reached" in r.stdout  # 99% in 20 steps is out of reach: reported, not an error
    for png in ("accuracy_vs_step.png", "accuracy_vs_time.png"):
        assert (out / png).stat().st_size > 10_000
    again = run_cli("train", "--model", "mlp", "-c", "dense,topk,arctopk,randk", "--steps", "20", "--eval-every", "5",
                    "--workers", "4", "--batch", "8", "--seeds", "0,1,2", "--topology", "8x1-eth1", "-o", str(out),
                    timeout=600)
    assert again.returncode == 0 and "resuming: 12 runs are already" in again.stderr


def test_model_fusion_trains_one_bucket_and_each_library_prices_it(tmp_path):
    """--fusion model: the whole gradient is one bucket (compressed and sent once per step); the library
    changes the price, never the training."""
    fused = TrainConfig(**SMALL, compressors=("topk",), bucket_mb=0.001, fusion="model")
    assert len(prepare(fused).buckets) == 1
    assert len(prepare(TrainConfig(**SMALL, compressors=("topk",), bucket_mb=0.001)).buckets) > 1
    runs = {lib: run_experiment(fused, tmp_path / lib, "8x1-eth10", announce=lambda _: None, library=lib)
            for lib in ("nccl", "gloo")}
    assert runs["nccl"]["loss"].tolist() == runs["gloo"]["loss"].tolist()
    assert runs["gloo"]["time_s"].iloc[-1] > runs["nccl"]["time_s"].iloc[-1]  # a round trip + software per step
    with pytest.raises(ArcsimError, match="unknown fusion"):
        TrainConfig(**SMALL, fusion="layer").check()
