"""`arcsim train` with the user's model, optimizer and precision, and a held-out loss target."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli

from arcsim.models import loss_fn, model_entry
from arcsim.run.target import Target
from arcsim.train import scheduled
from arcsim.train.loop import TrainConfig, evaluate, prepare, train
from arcsim.train.outcome import summarise
from arcsim.train.scheduled import ScheduledConfig, ScheduledExperiment

SMALL = {"dataset": "digits", "workers": 4, "batch": 8, "steps": 12, "eval_every": 4}

# the zoo's MLP on digits, layer for layer (same creation order: the same weights from the same seed)
MLP_COPY = """
from torch import nn

def build(hidden=128):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))
"""

# a model that returns only its loss, as a HuggingFace model given labels does
LOSS_ONLY = """
import torch
from torch import nn

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)).logsumexp(dim=1).mean()

def build():
    return Head()
"""


@pytest.fixture
def mlp_copy(tmp_path):
    path = tmp_path / "my_mlp.py"
    path.write_text(MLP_COPY)
    return f"{path}:build"


def test_a_model_from_a_file_trains_exactly_as_the_zoo_model_it_copies(mlp_copy):
    """Same layers, seed, batches, optimizer and compressor: the same losses, accuracies and held-out losses."""
    runs = []
    for model in ("mlp", mlp_copy):
        cfg = TrainConfig(model=model, **SMALL, optimizer="sgd", lr=0.05)
        runs.append(train(cfg, prepare(cfg), "topk", seed=1))
    zoo, mine = runs
    assert mine.loss == pytest.approx(zoo.loss, rel=1e-6)
    assert mine.accuracy == zoo.accuracy and mine.val_loss == pytest.approx(zoo.val_loss, rel=1e-6)
    assert mine.loss[-1] < mine.loss[0]


def test_dense_training_with_adamw_is_adamw_on_the_global_batch():
    cfg = TrainConfig(model="mlp", **SMALL, compressors=("dense",), optimizer="adamw", lr=3e-3, betas=(0.8, 0.99),
                      weight_decay=0.01)
    setup = prepare(cfg)
    hist = train(cfg, setup, "dense", seed=2)
    torch.manual_seed(2)
    model = model_entry("mlp").build(setup.data.spec)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.99), weight_decay=0.01)
    gen = torch.Generator().manual_seed(2)
    for step in range(cfg.steps):
        x, y = setup.data.draw(cfg.workers * cfg.batch, gen)
        loss = torch.stack([loss_fn("image", model(xw), yw) for xw, yw in zip(x.chunk(4), y.chunk(4), strict=True)
                            ]).mean()
        assert hist.loss[step] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x_test, y_test = setup.data.held_out()  # type: ignore[misc]
    with torch.no_grad():
        logits = model(x_test)
    assert hist.val_loss[-1] == pytest.approx(F.cross_entropy(logits, y_test).item(), rel=1e-4)
    assert hist.accuracy[-1] == pytest.approx(float((logits.argmax(1) == y_test).float().mean()))


def test_a_model_that_returns_only_its_loss_has_a_held_out_loss_and_no_accuracy(tmp_path):
    path = tmp_path / "head.py"
    path.write_text(LOSS_ONLY)
    cfg = TrainConfig(model=f"{path}:build", **SMALL)
    setup = prepare(cfg)
    model = setup.source.build(setup.data.spec)
    acc, loss = evaluate(model, setup.source, setup.data)
    assert math.isnan(acc) and math.isfinite(loss)


def test_a_nanogpt_is_evaluated_on_its_logits_at_every_position(tmp_path):
    """nanoGPT returns every position's logits only when given targets: held-out accuracy is then the next token's
    (it had been NaN, from the last position's logits), and the held-out loss the model's own."""
    from test_user_models import NANOGPT

    from arcsim.models.datasets import make_dataset
    from arcsim.models.source import ModelSource

    (tmp_path / "my_gpt.py").write_text(NANOGPT)
    source, data = ModelSource(f"{tmp_path / 'my_gpt.py'}:build"), make_dataset("python-text", 16)
    torch.manual_seed(0)
    model = source.build(data.spec)
    acc, loss = evaluate(model, source, data)
    x, y = data.held_out()
    with torch.no_grad():
        logits, own = model(x, targets=y)
    assert acc == pytest.approx(float((logits.argmax(-1) == y).float().mean()))
    assert loss == pytest.approx(float(own), rel=1e-5)


def test_bf16_autocast_trains_close_to_fp32_but_not_equal():
    runs = [train(c, prepare(c), "dense", seed=0) for c in (TrainConfig(model="mlp", **SMALL, precision=p)
                                                           for p in ("fp32", "bf16"))]
    fp32, bf16 = runs
    assert bf16.loss != fp32.loss
    assert bf16.loss == pytest.approx(fp32.loss, rel=0.05)


def test_a_loss_target_is_met_at_the_first_evaluation_at_or_below_it():
    rows = [{"compressor": "topk", "seed": s, "memory": "ef14", "step": step, "loss": 0.0, "accuracy": math.nan,
             "val_loss": v, "time_s": step * 0.5, "collective": "", "diverged": False}
            for s, losses in enumerate(([3.0, 2.4, 1.9, 1.7], [3.0, 2.6, 2.2, 2.1]))
            for step, v in zip((5, 10, 15, 20), losses, strict=True)]
    table = summarise(pd.DataFrame(rows), Target(2.0, "loss")).set_index("compressor")
    assert table.loc["topk", "reached"] == "1/2" and table.loc["topk", "steps_to_target"] == 15
    assert table.loc["topk", "final_loss_mean"] == pytest.approx(1.9)
    assert Target(2.0, "loss").label == "held-out loss 2 (perplexity 7.39)"


def test_a_scheduled_run_stops_at_a_loss_target(tmp_path):
    from arcsim.network_schedule import NetworkSchedule, Phase, parse_duration, parse_rate

    schedule = NetworkSchedule("t", (Phase(0, parse_duration("1ms"), parse_rate("10Gbps")),))
    cfg = TrainConfig(model="mlp", steps=40, eval_every=4, seeds=(0,))
    scfg = ScheduledConfig(cfg, schedule, "8x1-eth10", policies=("static",), candidates=("topk",), ratios=(0.1,),
                           target=Target(1.9, "loss"), warmup=2, stop_at_target=True)
    history = ScheduledExperiment(scfg, tmp_path / "s", announce=lambda _: None).run()
    evals = history.dropna(subset=["val_loss"])
    assert evals["val_loss"].iloc[-1] <= 1.9 < evals["val_loss"].iloc[:-1].min()
    assert history["step"].max() < 40
    assert scheduled.load_history(tmp_path / "s")["val_loss"].notna().sum() == len(evals)


def test_cli_trains_a_file_model_with_adamw_to_a_loss_target(tmp_path, mlp_copy):
    out = tmp_path / "t"
    r = run_cli("train", "--model", mlp_copy, "--model-arg", "hidden=32", "--dataset", "digits", "-c", "dense,topk",
                "--steps", "16", "--eval-every", "4", "-w", "2", "--batch", "16", "--optimizer", "adamw",
                "--lr", "0.02", "--target-loss", "2.0", "--topology", "8x1-eth1", "--json", "-", "-o", str(out),
                timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rows = {row["compressor"]: row for row in result["summary"]}
    assert result["target_loss"] == 2.0 and set(rows) == {"dense", "topk"}
    assert rows["dense"]["reached"] == "1/1" and rows["dense"]["time_to_target_s"] > 0
    assert (out / "loss_vs_time.png").exists()
    assert json.loads((out / "config.json").read_text())["optimizer"] == "adamw"
    history = pd.read_csv(out / "history.csv")
    assert history["val_loss"].notna().sum() == 2 * 4


@pytest.mark.parametrize(("args", "fragment"), [
    (("--target", "0.9", "--target-loss", "2"), "not both"),
    (("--data", "x.py:batches"), "drop --data"),
    (("--model", "mlp", "--optimizer", "sgd", "--betas", "0.9,0.95"), "--betas are AdamW's"),
    (("--model", "mlp", "--optimizer", "adamw", "--momentum", "0.5"), "--momentum is SGD's"),
    (("--model", "nowhere.py:build"), "nowhere.py"),
    (("--objective", "asf"), "--objective goes with --network-schedule"),
])
def test_bad_requests_are_one_line_exit_2(args, fragment, tmp_path):
    r = run_cli("train", *args, "-o", str(tmp_path / "t"), timeout=120)
    assert r.returncode == 2 and fragment in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "t").exists()


def test_a_model_of_ones_own_needs_a_dataset(tmp_path, mlp_copy):
    r = run_cli("train", "--model", mlp_copy, "-o", str(tmp_path / "t"), timeout=120)
    assert r.returncode == 2 and "give --dataset" in r.stderr, r.stderr


TOKENS = """
from torch import nn

def build(vocab=32000):
    return nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab))
"""


def test_train_takes_an_input_size_and_says_how_long_it_will_take(tmp_path):
    (tmp_path / "tokens.py").write_text(TOKENS)
    out = tmp_path / "t"
    r = run_cli("train", "--model", f"{tmp_path / 'tokens.py'}:build", "--dataset", "python-text", "--input-size",
                "16", "-c", "dense", "--steps", "2", "--eval-every", "2", "-w", "2", "--batch", "2", "-o", str(out),
                "--json", "-", timeout=300)
    assert r.returncode == 0, r.stderr
    estimate = [line for line in r.stderr.splitlines() if line.startswith("estimate:")]
    assert len(estimate) == 1 and "1 run(s) × 2 steps × 2 workers at" in estimate[0], r.stderr
    assert json.loads((out / "config.json").read_text())["input_size"] == 16
    assert len(pd.read_csv(out / "history.csv")) == 2
