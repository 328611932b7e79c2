"""`arcsim run --live`: gradients from data-parallel training fed straight to the compressors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from arcsim.run import analysis as analysis_module
from arcsim.run.analysis import Analysis
from arcsim.run.config import RunConfig
from arcsim.traces.capture import CaptureConfig, capture
from arcsim.traces.live import LiveSource
from arcsim.traces.training import TrainingConfig

LIVE = TrainingConfig(model="mlp", dataset="mnist1d", workers=3, steps=2, warmup=1, batch=8, seed=3)
COMPRESSORS = ("topk", "arctopk", "powersgd")


def _run(tmp_path: Path, **kw) -> dict[str, tuple[float, float]]:
    cfg = RunConfig(compressors=COMPRESSORS, ratios=(0.01, 0.1), policy="none", gpu="cpu", **kw)
    result = Analysis(cfg, announce=lambda _: None).run()
    return {c.compressor: (c.rel_error, c.bytes_per_rank) for c in [result.dense, *result.candidates]}


def test_live_gradients_are_the_ones_a_capture_of_the_same_training_stores(tmp_path):
    """Live and trace share one training loop: fp32 trace and live run give every compressor the same
    gradients, so the same error and bytes."""
    trace = capture(CaptureConfig(**{**vars(LIVE)}, out=tmp_path / "same.npz", dtype="fp32"))
    assert _run(tmp_path, live=LIVE) == _run(tmp_path, trace=str(trace))


def test_one_pass_per_group_or_one_per_measurement_gives_the_same_numbers(tmp_path, monkeypatch):
    """A pass trains again from the seed: measuring one compressor per pass reproduces the single pass."""
    together = Analysis(RunConfig(compressors=COMPRESSORS, ratios=(0.01,), policy="none", gpu="cpu", live=LIVE),
                        announce=lambda _: None)
    one = {c.compressor: c.rel_error for c in together.run().candidates}
    assert together.trace.passes == 1
    monkeypatch.setattr(analysis_module, "LIVE_MEMORY_BYTES", 1)
    apart = Analysis(RunConfig(compressors=COMPRESSORS, ratios=(0.01,), policy="none", gpu="cpu", live=LIVE),
                     announce=lambda _: None)
    many = {c.compressor: c.rel_error for c in apart.run().candidates}
    assert apart.trace.passes == 1 + len(COMPRESSORS)  # dense, then each compressor on its own
    assert many == one


def test_a_live_source_holds_one_step_whatever_the_number_of_steps():
    source = LiveSource(TrainingConfig(model="mlp", dataset="mnist1d", workers=2, steps=4, batch=4))
    pointers = {g.data_ptr() for _, g in source.steps_iter()}
    steps = [s for s, _ in source.steps_iter()]
    assert len(pointers) == 1 and steps == [0, 1, 2, 3] and source.passes == 2


def test_live_run_on_the_command_line_says_where_its_numbers_come_from(tmp_path):
    out = tmp_path / "live.json"
    r = run_cli("run", "--live", "--model", "mlp", "--dataset", "mnist1d", "--workers", "2", "--steps", "2",
                "-c", "dense,topk", "--ratios", "0.01", "--policy", "none", "--gpu", "cpu", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["trace"]["live"] is True and data["trace"]["path"] is None and data["trace"]["workers"] == 2
    notes = " ".join(data["assumptions"])
    assert "measured in live training on cpu" in notes and "compression time: measured on this CPU" in notes


@pytest.mark.parametrize(("args", "message"), [
    (["--live", "--model", "nosuch"], "unknown model 'nosuch'"),
    (["--live", "--model", "mlp", "--steps", "0"], "'--steps': must be at least 1"),
    (["--live", "--model", "mlp", "--workers", "1"], "'--workers' / '-w': must be at least 2"),
    (["--live"], "--live needs --model"),
    (["--model", "mlp"], "add --live"),
    (["--live", "--model", "mlp", "--params", "1M"], "without --trace or --params"),
    pytest.param(["--live", "--model", "mlp", "--device", "cuda"], "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_live_requests_get_one_line_and_exit_2(args, message):
    r = run_cli("run", *args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("error:") == 1, r.stderr


def test_a_sweep_over_live_training_names_the_source(tmp_path):
    r = run_cli("sweep", "--live", "mlp", "--live-workers", "2", "--live-steps", "1", "-c", "dense,topk",
                "-t", "8x8-ib{25,100}", "-j", "1", "--out", str(tmp_path / "s"), "--no-plots", "--gpu", "cpu")
    assert r.returncode == 0, r.stderr
    import pandas as pd

    df = pd.read_csv(tmp_path / "s" / "results.csv")
    assert len(df) == 4 and set(df["trace"]) == {"live:mlp (2 workers × 1 steps, cpu)"}
    assert (df["iteration_s"] > 0).all()
    bad = run_cli("sweep", "--live", "mlp", "--trace", "x.npz", "--out", str(tmp_path / "t"))
    assert bad.returncode == 2 and "not trace and live" in bad.stderr


def test_a_second_pricing_of_a_live_run_reuses_its_gradients(tmp_path):
    """--compare-gpu and --fusion both price the same live training again: they share its source (a new
    source was refused as 'another trace' by share_measurements)."""
    r = run_cli("run", "--live", "--model", "mlp", "--dataset", "mnist1d", "--workers", "2", "--steps", "1",
                "-c", "dense,topk", "--ratios", "0.01", "--policy", "none", "--plot", str(tmp_path),
                "--compare-gpu", "h100", "--fusion", "both")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "breakdown-gpus.png").read_bytes()[:4] == b"\x89PNG"
    assert "whole model as one vector" in " ".join(r.stdout.split())


def test_a_sweep_over_live_training_takes_a_model_of_ones_own(tmp_path):
    """A model from a file beside the zoo's MLP on the same data; a model of one's own without live_dataset is
    refused before any work."""
    (tmp_path / "my_mlp.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), "
        "nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))\n")
    mine = f"{tmp_path / 'my_mlp.py'}:build"
    r = run_cli("sweep", "--live", f"mlp,{mine}", "--live-dataset", "digits", "--live-workers", "2", "--live-steps",
                "1", "-c", "topk", "-d", "0.05", "-j", "1", "--out", str(tmp_path / "s"), "--no-plots", "--gpu", "cpu")
    assert r.returncode == 0, r.stderr
    import pandas as pd

    df = pd.read_csv(tmp_path / "s" / "results.csv").set_index("trace")
    assert sorted(df.index) == ["live:mlp on digits (2 workers × 1 steps, cpu)",
                                "live:my_mlp:build on digits (2 workers × 1 steps, cpu)"]
    assert ((df["rel_error"] > 0) & (df["rel_error"] < 1)).all()  # SGD for the zoo's, AdamW for one's own
    bad = run_cli("sweep", "--live", mine, "--out", str(tmp_path / "t"))
    assert bad.returncode == 2 and "live_dataset" in bad.stderr and not (tmp_path / "t").exists(), bad.stderr
