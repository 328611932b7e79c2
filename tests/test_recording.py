"""Recording from the user's own DDP job: a 2-rank gloo job under torchrun records, worker for worker, what
`arcsim trace capture` records for the same model, data split and seed; its trace feeds `arcsim run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _users_job import write_users_job
from conftest import free_port, loopback_job, run_cli

from arcsim.errors import ArcsimError
from arcsim.models.source import ModelSource
from arcsim.traces.format import open_trace
from arcsim.traces.merge import merge_recordings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("record") / "rec.npz"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(ROOT / "examples" / "record_ddp.py"), "--out", str(out),
                           "--steps", "2", "--dtype", "fp32"], capture_output=True, text=True, timeout=300,
                          cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def by_name(trace, grads: torch.Tensor) -> dict[str, torch.Tensor]:
    return {la.name: grads[:, la.offset:la.offset + la.numel] for la in trace.layers}


def test_the_recorded_job_equals_a_capture_of_the_same_training(recorded: Path, tmp_path: Path):
    r = run_cli("trace", "capture", "--model", "mlp", "--dataset", "mnist1d", "-w", "2", "-s", "2", "-b", "8",
                "--dtype", "fp32", "-o", str(tmp_path / "cap.npz"))
    assert r.returncode == 0, r.stderr
    rec, cap = open_trace(recorded), open_trace(tmp_path / "cap.npz")
    assert (rec.workers, rec.steps, rec.recorded_steps) == (2, 2, [0, 1])
    assert sorted(la.name for la in rec.layers) == sorted(la.name for la in cap.layers)
    assert rec.meta["model_source"] == {"ref": "mlp", "args": {}} and rec.meta["losses_recorded"] is False
    for (step_r, g_r), (step_c, g_c) in zip(rec.steps_iter(), cap.steps_iter(), strict=True):
        mine, theirs = by_name(rec, g_r), by_name(cap, g_c)
        assert step_r == step_c
        for name in mine:  # worker for worker: the same shards, the same parameters after the same updates
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-7)
    assert (rec.forward_s > 0).all() and (rec.backward_s >= rec.ready_s.max(axis=1) - 1e-12).all()


def test_a_recorded_trace_feeds_arcsim_run(recorded: Path):
    r = run_cli("run", "--trace", str(recorded), "-c", "dense,topk", "--policy", "none")
    assert r.returncode == 0, r.stderr
    assert "mlp" in r.stdout and "topk" in r.stdout


def test_parts_that_do_not_belong_together_are_refused(recorded: Path, tmp_path: Path):
    parts = sorted(Path(f"{recorded}.parts").glob("rank*.pt"))
    assert len(parts) == 2
    with pytest.raises(ArcsimError, match="one part per recorded rank"):
        merge_recordings(parts[:1], tmp_path / "x.npz")
    other = torch.load(parts[1], weights_only=True)
    other["order"] = list(reversed(other["order"]))
    torch.save(other, tmp_path / "rank1.pt")
    with pytest.raises(ArcsimError, match="disagree on the layout"):
        merge_recordings([parts[0], tmp_path / "rank1.pt"], tmp_path / "x.npz")
    with pytest.raises(ArcsimError, match="does not have the recorded parameters"):
        merge_recordings(parts, tmp_path / "x.npz", ModelSource("cnn"), "digits")
    (tmp_path / "junk.pt").write_bytes(b"not a part")
    r = run_cli("trace", "merge", str(parts[0]), str(tmp_path / "junk.pt"), "-o", str(tmp_path / "y.npz"))
    assert r.returncode == 2 and "is not a recording part" in r.stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "y.npz").exists()


def test_a_subset_of_ranks_records_in_fp16_what_a_capture_holds_for_those_workers(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    """3 ranks (as torchrun starts them), ranks 0 and 2 record in fp16: rank 1 writes nothing, the parts are half of
    fp32's, and the trace is the capture's workers 0 and 2 (fp16's rounding apart); an fp32 trace of fp16 parts is
    refused."""
    out = tmp_path / "rec.npz"
    monkeypatch.chdir(tmp_path)
    loopback_job(ROOT / "examples" / "record_ddp.py", ["--out", str(out), "--steps", "2", "--ranks", "0,2"], 3,
                 script=True)
    parts = sorted(Path(f"{out}.parts").iterdir())
    assert [p.name for p in parts] == ["rank0.pt", "rank2.pt"]
    held = torch.load(parts[1], weights_only=True)
    assert held["ranks"] == [0, 2] and held["dtype"] == "fp16"
    assert all(g.dtype == torch.float16 for g in held["grads"].values())
    r = run_cli("trace", "capture", "--model", "mlp", "--dataset", "mnist1d", "-w", "3", "-s", "2", "-b", "8",
                "--dtype", "fp32", "-o", str(tmp_path / "cap.npz"))
    assert r.returncode == 0, r.stderr
    rec, cap = open_trace(out), open_trace(tmp_path / "cap.npz")
    assert rec.workers == 2 and rec.meta["recorded_ranks"] == [0, 2] and rec.meta["job_world_size"] == 3
    for (_, g_r), (_, g_c) in zip(rec.steps_iter(), cap.steps_iter(), strict=True):
        mine, theirs = by_name(rec, g_r), by_name(cap, g_c)
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name][[0, 2]].half().float(), rtol=1e-3, atol=1e-6)
    with pytest.raises(ArcsimError, match="hold fp16 gradients"):
        merge_recordings(parts, tmp_path / "x.npz", dtype="fp32")
    with pytest.raises(ArcsimError, match="one part per recorded rank"):
        merge_recordings(parts[:1], tmp_path / "x.npz")
    assert not (tmp_path / "x.npz").exists()


@pytest.fixture(scope="module")
def users_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's own GPT trained by their own torchrun script (AdamW, bf16 autocast, batch 4 per rank), in a
    folder of its own: the recording parts it leaves there."""
    where = tmp_path_factory.mktemp("users-job")
    write_users_job(where)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), "train.py"], capture_output=True, text=True, timeout=300, cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def test_a_users_recorded_job_is_priced_on_the_clusters_gpu(users_job: Path):
    r = run_cli("trace", "merge", "rank0.pt", "rank1.pt", "--model", "my_gpt.py:build", "-o", "rec.npz",
                cwd=str(users_job))
    assert r.returncode == 0, r.stderr
    r = run_cli("trace", "info", "rec.npz", "--no-stats", "--json", "-", cwd=str(users_job))
    meta = json.loads(r.stdout)["metadata"]
    assert meta["optimizer"] == "AdamW lr 0.0003 betas (0.9, 0.999) weight decay 0.1"
    assert (meta["precision"], meta["batch_per_worker"]) == ("bf16", 4)
    assert meta["recorded_input"]["args"] == {"list": [{"tensor": [4, 32], "dtype": "int64"}]}
    assert meta["recorded_input"]["kwargs"] == {"dict": {"targets": {"tensor": [4, 32], "dtype": "int64"}}}
    run = ("run", "--trace", "rec.npz", "--topology", "4x8-eth25-a100", "-c", "dense", "--policy", "none",
           "--json", "-")
    r = run_cli(*run, cwd=str(users_job))
    assert r.returncode == 0, r.stderr
    assert "compute on a100: batch 4 per GPU (the recorded job's), bf16 (the trace's)" in r.stderr
    own = json.loads(r.stdout)
    assert own["compute_basis"]["batch"] == 4 and own["compute_basis"]["precision"] == "bf16"
    assert own["assumptions"][0].startswith("compute: modelled on NVIDIA A100")
    r = run_cli(*run, "--batch", "64", "--precision", "fp32", cwd=str(users_job))
    assert r.returncode == 0, r.stderr
    told = json.loads(r.stdout)
    assert (told["compute_basis"]["batch_from"], told["compute_basis"]["precision_from"]) == ("--batch", "--precision")
    assert "batch 64 per GPU, fp32" in told["assumptions"][0]


def test_merge_takes_the_jobs_data_or_dataset_not_both(users_job: Path, tmp_path: Path):
    (users_job / "batches.py").write_text("import torch\ndef batches(batch_size, seed):\n    while True:\n"
                                          "        yield torch.zeros(batch_size, 32, dtype=torch.long)\n")
    r = run_cli("trace", "merge", "rank0.pt", "rank1.pt", "--model", "my_gpt.py:build", "--data",
                "batches.py:batches", "-o", str(tmp_path / "d.npz"), cwd=str(users_job))
    assert r.returncode == 0, r.stderr
    assert open_trace(tmp_path / "d.npz").meta["dataset"] == f"{users_job / 'batches.py'}:batches"
    r = run_cli("trace", "merge", "rank0.pt", "rank1.pt", "--data", "batches.py:batches", "--dataset",
                "python-text", "-o", str(tmp_path / "e.npz"), cwd=str(users_job))
    assert r.returncode == 2 and "give one of them" in r.stderr and not (tmp_path / "e.npz").exists()


def test_a_recording_without_its_input_is_refused_on_a_gpu_with_the_way_out(users_job: Path, tmp_path: Path):
    for rank in (0, 1):  # as the hook wrote them before it kept the input's shapes
        part = torch.load(users_job / f"rank{rank}.pt", weights_only=True)
        del part["inputs"]
        torch.save(part, tmp_path / f"rank{rank}.pt")
    r = run_cli("trace", "merge", "rank0.pt", "rank1.pt", "--model", f"{users_job / 'my_gpt.py'}:build", "-o",
                "old.npz", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    r = run_cli("run", "--trace", "old.npz", "-t", "4x8-eth25-a100", "-c", "dense", cwd=str(tmp_path))
    assert r.returncode == 2 and "does not say what its model 'my_gpt:build' was fed" in r.stderr, r.stderr
    r = run_cli("run", "--trace", "old.npz", "-t", "4x8-eth25-a100", "-c", "dense", "--policy", "none", "--gpu",
                "cpu", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr


def test_a_recorded_huggingface_input_is_counted_with_its_own_loss_at_any_batch(tmp_path: Path):
    pytest.importorskip("transformers")
    from arcsim.models.inputs import RecordedInput
    from arcsim.models.workload import count_workload

    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_hidden_layers": 1, "vocab_size": 1000, "tie_word_embeddings": False}
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    ids = torch.zeros(4, 16, dtype=torch.long)
    recorded = RecordedInput.of_call((), {"input_ids": ids, "labels": ids})  # model(**batch) returns .loss
    assert recorded.batch == 4 and recorded.describe() == "input_ids=4×16 int64, labels=4×16 int64"
    args, kwargs = recorded.example(32)
    assert args == [] and kwargs["labels"].shape == (32, 16) and kwargs["labels"].device.type == "meta"
    source = ModelSource(f"hf:{tmp_path / 'tiny.json'}")
    small, large = (count_workload(source, batch, data=recorded) for batch in (4, 32))
    matmul = [sum(op.flops for op in w.forward if op.cls == "matmul") for w in (small, large)]
    assert matmul[0] > 0 and matmul[1] == pytest.approx(8 * matmul[0])
    assert set(large.numel) == {n for n, _ in source.build(None).named_parameters()}


def test_trace_info_on_a_recording_shows_its_ranks_not_a_seed_or_a_capture_time(tmp_path: Path):
    """A merged recording has no seed or capture time of arcsim's: info had shown 'seed 0, ? s' and a loss of 0."""
    for rank in (0, 2):  # ranks 0 and 2 of a 3-rank job recorded, without its forward's input
        grads = {s: torch.randn(16, generator=torch.Generator().manual_seed(rank + s)).half() for s in (5, 9)}
        torch.save({"rank": rank, "world": 3, "ranks": [0, 2], "dtype": "fp16", "steps": [5, 9], "order": ["b", "w"],
                    "shapes": {"w": [4, 3], "b": [4]}, "grads": grads, "ready_s": {s: [1e-3, 2e-3] for s in (5, 9)},
                    "forward_s": {s: 3e-3 for s in (5, 9)}, "inputs": None, "precision": "bf16", "optimizer": None,
                    "torch_version": "2.13.0"}, tmp_path / f"rank{rank}.pt")
    merged = run_cli("trace", "merge", "rank0.pt", "rank2.pt", "-o", "rec.npz", cwd=str(tmp_path))
    assert merged.returncode == 0, merged.stderr
    shown = run_cli("trace", "info", "rec.npz", cwd=str(tmp_path), env={"COLUMNS": "140"})
    assert shown.returncode == 0, shown.stderr
    table = " ".join(shown.stdout.split())
    assert "recorded from │ ranks 0, 2 of a job of 3 ranks (RecordingState), torch 2.13.0" in table
    assert "2 × ? (the forward's input was not recorded)" in table and "fp16 [2, 2, 16]" in table
    assert "seed" not in table and "? s" not in table and "captured on" not in table
    assert "│ 5 │ - │" in table and "0.0000" not in table  # no loss was recorded
