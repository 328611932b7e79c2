"""`arcsim compress`: every compressor × memory on synthetic data, its JSON, and its refusals."""

import json

import pytest
from click.testing import CliRunner
from conftest import run_cli

from arcsim.cli import cli
from arcsim.compressors import NAMES
from arcsim.compressors.memory import MEMORIES

STEP_KEYS = {"density_achieved", "rel_error", "energy_captured", "bytes_per_rank", "collectives"}


def invoke(*args):
    result = CliRunner().invoke(cli, ["compress", *args, "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("memory", list(MEMORIES))
@pytest.mark.parametrize("name", NAMES)
def test_every_compressor_and_memory_on_synthetic_data(name, memory):
    out = invoke("-c", name, "-m", memory, "--synthetic", "correlated", "-w", "4", "-n", "5000", "-s", "3",
                 "--density", "0.02")
    assert {"compressor", "memory", "density_requested", "dense_bytes_per_rank", "steps"} <= set(out)
    assert out["dense_bytes_per_rank"] == 4 * 5000 and len(out["steps"]) == 3
    for step in out["steps"]:
        assert set(step) >= STEP_KEYS
        assert step["bytes_per_rank"] == sum(c["bytes_per_rank"] for c in step["collectives"])
        for c in step["collectives"]:
            assert set(c) == {"op", "tag", "elements", "dtype", "bytes_per_rank"}
        if not step["dense_step"] and name not in ("dense", "fp16"):
            assert step["bytes_per_rank"] < out["dense_bytes_per_rank"]
            assert 0 <= step["rel_error"] <= 1.5


def test_same_seed_same_json_and_seed_changes_data():
    a = invoke("-c", "arctopk", "--synthetic", "normal", "-n", "4000", "-s", "2", "--seed", "3")
    b = invoke("-c", "arctopk", "--synthetic", "normal", "-n", "4000", "-s", "2", "--seed", "3")
    c = invoke("-c", "arctopk", "--synthetic", "normal", "-n", "4000", "-s", "2", "--seed", "4")
    assert a == b and a["steps"] != c["steps"]


def test_correlated_structure_helps_arctopk_more_than_independent_noise():
    shared = invoke("-c", "arctopk", "--synthetic", "correlated", "-n", "20000", "-s", "2", "--density", "0.05")
    alone = invoke("-c", "arctopk", "--synthetic", "normal", "-n", "20000", "-s", "2", "--density", "0.05")
    assert shared["steps"][-1]["rel_error"] < alone["steps"][-1]["rel_error"]


@pytest.mark.parametrize(("args", "fragment"), [
    (("--density", "0", "--synthetic", "normal"), "density must be in (0, 1]"),
    (("--density", "1.5", "--synthetic", "normal"), "density must be in (0, 1]"),
    (("-c", "zipk", "--synthetic", "normal"), "choose one of dense, fp16, topk"),
    (("-m", "ef99", "--synthetic", "normal"), "choose one of none, ef14, ef21, ef21m"),
    (("-c", "powersgd", "--rank", "0", "--synthetic", "normal"), "rank r must be ≥ 1"),
    (("--trace", "x.npz"), "no such trace file: x.npz"),
    (("--trace", "x.npz", "--synthetic", "normal"), "either --trace or --synthetic"),
    (("--synthetic", "normal", "-n", "0"), "at least 1 element"),
    (("--synthetic", "normal", "-w", "1"), "at least 2 workers"),
    (("--synthetic", "normal", "-n", "1e2.5"), "not a number"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    r = run_cli("compress", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr
