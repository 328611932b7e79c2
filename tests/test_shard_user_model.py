"""`arcsim shard` on a user's own model (issue 49): the GPT of tests/_users_job.py named by its file from the user's
folder, fed a built-in dataset at a sequence length (--seq-len, the same option as --input-size) or its own
batches; the sequence length priced shown in the table and the JSON; bad input one error line."""

from __future__ import annotations

import json

import pytest
from _users_job import token_batches, write_users_job
from conftest import run_cli

TOPOLOGY = ["-t", "2x4-ib100-a100", "--precision", "bf16", "--sharding", "none,full", "--quantize", "none"]
DATA = token_batches(512, 32)


@pytest.fixture(scope="module")
def users_folder(tmp_path_factory):  # type: ignore[no-untyped-def]
    where = tmp_path_factory.mktemp("user")
    write_users_job(where)
    (where / "data.py").write_text(DATA)
    return where


def shard_json(where, *args: str) -> dict:  # type: ignore[no-untyped-def]
    r = run_cli("-q", "shard", "--model", "my_gpt.py:build", *TOPOLOGY, *args, "--json", "-", cwd=str(where))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_users_gpt_is_priced_at_the_sequence_length_asked(users_folder) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("shard", "--model", "my_gpt.py:build", "--model-arg", "block=64", "--dataset", "python-text",
                "--seq-len", "64", *TOPOLOGY, cwd=str(users_folder))
    assert r.returncode == 0, r.stderr
    assert "my_gpt:build" in r.stdout and "sequence length 64 (python-text)" in r.stdout, r.stdout
    # a row's name may wrap in its column ("FSDP" over "(full)"), as the table's width allows
    assert "│ DDP " in r.stdout and "│ FSDP" in r.stdout, r.stdout

    at64 = shard_json(users_folder, "--model-arg", "block=64", "--dataset", "python-text", "--seq-len", "64")
    assert at64["model"] == "my_gpt:build" and at64["compute_source"] == "modelled"
    assert at64["input"] == {"dataset": "python-text", "data": None, "kind": "tokens", "shape": [64], "seq_len": 64}
    # the user's GPT: 512-token vocabulary, 64 wide, 2 layers, 64 positions (the argument given reaches the factory)
    width, vocab, block, depth = 64, 512, 64, 2
    layer = 4 * width * width + 4 * width + 2 * 4 * width * width + 4 * width + width + 4 * width
    assert at64["params"] == vocab * width + block * width + depth * layer + width * vocab + vocab
    assert {r["strategy"] for r in at64["results"]} == {"none", "full"} and at64["units"] == depth

    # --input-size is the same option; the dataset's own length (256) by default, and it costs more compute
    assert shard_json(users_folder, "--model-arg", "block=64", "--dataset", "python-text", "--input-size",
                      "64") == at64
    at256 = shard_json(users_folder, "--dataset", "python-text")
    assert at256["input"]["seq_len"] == 256 and at256["forward_s"] > at64["forward_s"]

    # the same compute as arcsim device predict gives for the same model, batch, input and GPU
    r = run_cli("-q", "device", "predict", "--model", "my_gpt.py:build", "--model-arg", "block=64", "--dataset",
                "python-text", "--seq-len", "64", "--gpu", "a100", "--batch", "8", "--precision", "bf16", "--json",
                "-", cwd=str(users_folder))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["forward_s"] == pytest.approx(at64["forward_s"], rel=1e-9)


def test_the_users_own_batches_feed_it(users_folder) -> None:  # type: ignore[no-untyped-def]
    out = shard_json(users_folder, "--data", "data.py:batches")
    assert out["input"] == {"dataset": None, "data": "data.py:batches", "kind": None, "shape": [], "seq_len": None}
    assert out["forward_s"] > 0


@pytest.mark.parametrize(("args", "why"), [
    (["--model", "nope.py:build", "--dataset", "python-text"], "no such file nope.py"),
    (["--model", "my_gpt.py:build"], "give --dataset"),
    (["--model", "my_gpt.py:build", "--data", "data.py:batches", "--seq-len", "64"], "--seq-len"),
    (["--model", "my_gpt.py:build", "--model-arg", "depth", "--dataset", "python-text"], "--model-arg"),
    (["--model", "my_gpt.py:nope", "--dataset", "python-text"], "nope"),
])
def test_bad_input_is_one_error_line(users_folder, args, why) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("shard", *args, *TOPOLOGY, cwd=str(users_folder))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and why in lines[0], r.stderr
