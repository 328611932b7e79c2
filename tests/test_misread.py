"""Issue 37 §2 "never misread": a table arcsim wrote is read back by its columns' types, or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_bad_input_classes import invoke

REPORT = Path(__file__).resolve().parents[1] / "reports" / "validation.csv"


def _changed(path: Path, row: int, column: str, value: object) -> Path:
    frame = pd.read_csv(REPORT)
    frame[column] = frame[column].astype(object)
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(("make", "phrase"), [
    (lambda p: _changed(p, 0, "inside_spread", "no"), "column inside_spread: 'no' is not True or False"),
    (lambda p: _changed(p, 1, "ranks", "two"), "line 3, column ranks: 'two' is not a whole number"),
    (lambda p: _changed(p, 0, "measured_s", 0), "column measured_s: '0' is not a number above 0"),
    (lambda p: _changed(p, 0, "error", None), "column error: '' is not a number"),
    (lambda p: p.write_text(""), "is empty"),
    (lambda p: p.write_text(REPORT.read_text().splitlines()[0] + "\n"), "no rows"),
    (lambda p: p.write_text("\n".join([REPORT.read_text().splitlines()[0]] * 2 + REPORT.read_text().splitlines()[1:])),
     "line 2, column ranks: 'ranks' is not a whole number"),
    (lambda p: p.write_text("ranks,ranks," + REPORT.read_text()[len("ranks,"):]), "the column ranks twice"),
    (lambda p: p.write_text(REPORT.read_text() + "2,1,flat\n"), "cells where the header has 32 (cut off"),
])
def test_a_damaged_validation_report_is_one_error_line(tmp_path: Path, make, phrase: str):
    path = tmp_path / "validation.csv"
    make(path)
    code, _, err = invoke(["validate", "--report", str(path)], tmp_path)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err[-2000:]
    assert phrase in err, err


def test_the_committed_reports_still_read(tmp_path: Path):
    from arcsim.testbed.validate import read_report, summary

    rows = read_report(REPORT)
    assert all(isinstance(r["inside_spread"], bool) for r in rows)
    assert summary(rows)["inside_spread"] == sum(pd.read_csv(REPORT)["inside_spread"])


def test_plot_refuses_a_text_cell_in_a_number_column(tmp_path: Path):
    from arcsim.sweep.evaluate import COLUMNS

    folder = tmp_path / "sweep"
    folder.mkdir()
    row = {c: "" for c in COLUMNS} | {"point_id": "0a", "compressor": "topk", "iteration_s": "0.1", "world": "many"}
    pd.DataFrame([row]).to_csv(folder / "results.csv", index=False)
    code, _, err = invoke(["plot", str(folder)], tmp_path)
    assert code == 2 and "column world: 'many' is not a whole number" in err and "Traceback" not in err, err


@pytest.mark.parametrize(("args", "env", "phrase"), [
    (["train", "--optimizer", "adamw", "--betas", "1,1", "--steps", "1"], {}, "--betas must each lie in [0, 1)"),
    (["trace", "capture", "--model", "mlp", "--optimizer", "adamw", "--betas", "0.9,1", "-o", "t.npz"], {},
     "--betas must each lie in [0, 1)"),
    (["train", "--lr", "1e300", "--steps", "1"], {}, "--lr must lie in (0, 100]"),
    (["trace", "capture", "--model", "mlp", "--lr", "1e300", "-o", "t.npz"], {}, "--lr must lie in (0, 100]"),
    (["train", "--optimizer", "sgd", "--momentum", "1", "--steps", "1"], {}, "--momentum must lie in [0, 1)"),
    (["calibrate", "--out", "c.yaml"], {"RANK": "1", "WORLD_SIZE": "2"}, "not a torchrun rank"),
    (["calibrate", "--loopback", "-p", "2", "--out", "c.yaml"], {"WORLD_SIZE": "2"}, "launches its own workers"),
    (["validate", "--ranks", "2"], {"RANK": "0"}, "launches its own workers"),
    (["validate", "--write-config", "wc", "--ranks", "1"], {}, "must be at least 2"),
    (["validate", "--write-config", "wc", "--bandwidth", "0Gbit"], {}, "--bandwidth 0Gbit carries nothing"),
])
def test_settings_no_run_can_use_are_one_error_line_before_work(tmp_path: Path, args: list[str],
                                                                 env: dict[str, str], phrase: str):
    code, _, err = invoke(args, tmp_path, env)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err[-2000:]
    assert phrase in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_straggler_that_never_arrives_is_refused_not_a_des_deadlock(tmp_path: Path):
    from arcsim.files import packaged

    topology = tmp_path / "slow.yaml"
    topology.write_text(packaged("topologies", "8x1-eth10.yaml").read_text() + "stragglers:\n  1: .inf\n")
    code, _, err = invoke(["collective", "-t", str(topology), "--engine", "des", "--compute", "1ms"], tmp_path)
    assert code == 2 and "straggler slowdown for rank 1 must be a finite number" in err and "Traceback" not in err, err


def _part(rank: int, steps: tuple[int, ...] = (0, 1)) -> dict:
    """A rank's recording part as RecordingState.save writes it: a 3x2 weight and its bias."""
    import torch

    return {"rank": rank, "world": 2, "steps": list(steps), "order": ["a.bias", "a.weight"],
            "shapes": {"a.weight": [3, 2], "a.bias": [3]}, "grads": {s: torch.randn(9) for s in steps},
            "ready_s": {s: [0.001, 0.002] for s in steps}, "forward_s": {s: 0.01 for s in steps},
            "torch_version": str(torch.__version__)}


@pytest.mark.parametrize(("damage", "phrase"), [
    (lambda p: p.update(steps=[0, 0]), "recorded once"),
    (lambda p: p.update(steps=[], grads={}, ready_s={}, forward_s={}), "no recorded step"),
    (lambda p: p["grads"].pop(1), "grads are not one per recorded step"),
    (lambda p: p["ready_s"].update({1: [0.1]}), "ready_s of step 1"),
    (lambda p: p["shapes"].update({"a.weight": "x"}), "shape is not a list of sizes"),
    (lambda p: p["forward_s"].pop(0), "forward_s are not one per recorded step"),
    (lambda p: p["grads"].update({1: p["grads"][1][:4]}), "grads of step 1"),
])
def test_a_malformed_recording_part_is_one_error_line_and_no_trace(tmp_path: Path, damage, phrase: str):
    import torch

    paths = []
    for rank in (0, 1):
        part = _part(rank)
        damage(part)
        paths.append(tmp_path / f"rank{rank}.pt")
        torch.save(part, paths[-1])
    code, _, err = invoke(["trace", "merge", *map(str, paths), "-o", "t.npz"], tmp_path)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err[-2000:]
    assert phrase in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt", "rank1.pt"]


def test_whole_parts_still_merge(tmp_path: Path):
    import torch

    from arcsim.traces.format import open_trace
    from arcsim.traces.merge import merge_recordings

    parts = [_part(0), _part(1)]
    for rank, part in enumerate(parts):
        torch.save(part, tmp_path / f"rank{rank}.pt")
    trace = open_trace(merge_recordings([tmp_path / "rank0.pt", tmp_path / "rank1.pt"], tmp_path / "t.npz",
                                        dtype="fp32"))
    assert trace.workers == 2 and trace.steps == 2


def test_the_recording_hook_refuses_a_step_asked_for_twice():
    import torch

    from arcsim.errors import ArcsimError
    from arcsim.hooks import RecordingState

    with pytest.raises(ArcsimError, match="each once"):
        RecordingState.for_model(torch.nn.Linear(2, 3), (3, 3))


USER_CODE = '''
import sys

import numpy as np
import torch
from torch import nn


class Chatty(nn.Module):
    def __init__(self):
        super().__init__()
        print("building Chatty")
        self.net = nn.Linear(4, 1)

    def forward(self, x, y):
        print("forward!")
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)


class Constant(Chatty):
    def forward(self, x, y):
        return (x ** 2).mean()


def chatty():
    return Chatty()


def exits():
    sys.exit(3)


def nothing():
    return nn.ReLU()


def frozen():
    return Chatty().requires_grad_(False)


def constant():
    return Constant()


def tensors(batch_size, seed):
    while True:
        x = torch.randn(batch_size, 4)
        yield x, x.sum(-1)


def arrays(batch_size, seed):
    rng = np.random.default_rng(seed)
    while True:
        x = rng.standard_normal((batch_size, 4), dtype=np.float32)
        yield x, x.sum(-1)


def numbers(batch_size, seed):
    while True:
        yield [1.0, 2.0]


def objects(batch_size, seed):
    while True:
        yield torch.randn(batch_size, 4), {1, 2}
'''


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    (tmp_path / "mine.py").write_text(USER_CODE)
    return tmp_path


@pytest.mark.parametrize(("model", "data", "phrase"), [
    ("exits", "tensors", "mine.py:exits called sys.exit(3)"),
    ("nothing", "tensors", "returned a module with no parameters"),
    ("frozen", "tensors", "returned a module with only frozen parameters"),
    ("constant", "tensors", "returned a loss that does not depend on its parameters"),
    ("chatty", "numbers", "holds no tensor or numpy array to split"),
    ("chatty", "objects", "a batch holds a set, which cannot be split"),
])
def test_user_code_that_cannot_train_is_one_error_line_naming_it(user_file: Path, model: str, data: str,
                                                                 phrase: str):
    code, _, err = invoke(["run", "--live", "--model", f"mine.py:{model}", "--data", f"mine.py:{data}", "-w", "2",
                           "--steps", "1", "--json", "-"], user_file)
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and phrase in lines[0], err[-2000:]
    assert "Traceback" not in err and {p.name for p in user_file.iterdir()} <= {"mine.py", "__pycache__"}


def test_a_models_prints_go_to_stderr_not_into_the_json(user_file: Path):
    code, out, err = invoke(["run", "--live", "--model", "mine.py:chatty", "--data", "mine.py:tensors", "-w", "2",
                             "--steps", "1", "--json", "-"], user_file)
    assert code == 0, err[-2000:]
    assert "forward!" in err and "building Chatty" in err and "forward!" not in out
    assert "candidates" in json.loads(out)


def test_numpy_batches_are_split_over_the_workers(user_file: Path):
    from arcsim.models.source import UserBatches

    stream = UserBatches(f"{user_file / 'mine.py'}:arrays", 4 * 3, 0)
    batch = stream.next()
    shards = stream.shards(batch, 4)
    assert [tuple(s[0].shape) for s in shards] == [(3, 4)] * 4
    assert torch.equal(torch.cat([s[0] for s in shards]), batch[0])  # disjoint quarters, in order
    assert not torch.equal(shards[0][0], shards[1][0])
