"""`arcsim compress`: every compressor × memory on synthetic data, its JSON, and its refusals."""

import json

import pytest
from click.testing import CliRunner
from conftest import run_cli

from arcsim.cli import cli
from arcsim.compressors.memory import MEMORIES
from arcsim.compressors.registry import NAMES

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
        if not step["dense_step"] and name not in ("dense", "fp16", "bf16"):
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
    (("--density", "0", "--synthetic", "normal"), "'--density' / '-d': must lie in (0, 1]"),
    (("--density", "1.5", "--synthetic", "normal"), "'--density' / '-d': must lie in (0, 1]"),
    (("-c", "zipk", "--synthetic", "normal"), "unknown compressor zipk; choose from dense, fp16, bf16, topk"),
    (("-m", "ef99", "--synthetic", "normal"), "choose one of none, ef14, ef21, ef21m"),
    (("-c", "powersgd", "--rank", "0", "--synthetic", "normal"), "'--rank': must be at least 1"),
    (("--trace", "x.npz"), "no such trace file: x.npz"),
    (("--trace", "x.npz", "--synthetic", "normal"), "either --trace or --synthetic"),
    (("--synthetic", "normal", "-n", "0"), "'--elements' / '-n': must be at least 1"),
    (("--synthetic", "normal", "-w", "1"), "'--workers' / '-w': must be at least 2"),
    (("--synthetic", "normal", "-n", "1e2.5"), "not a number"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    r = run_cli("compress", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr


@pytest.mark.parametrize(("name", "memory"), [("dense", "none"), ("topk", "ef14"), ("arctopk", "ef14"),
                                              ("star", "ef14"), ("gaussiank", "ef14"), ("topk", "ef21")])
def test_a_trace_compressed_a_group_of_layers_at_a_time_measures_what_the_whole_vector_does(name, memory):
    """compress_streamed (what `arcsim compress --trace` runs, to stay in memory) against compress_steps on whole
    steps: per-layer selections see the same tensors, so every figure agrees, the global top-k overlap too."""
    from arcsim.catalog import options_for
    from arcsim.compressors.memory import make_memory
    from arcsim.compressors.registry import make_compressor
    from arcsim.compressors.session import compress_steps
    from arcsim.run.streamed import compress_streamed
    from arcsim.traces.format import open_trace
    from arcsim.traces.resolve import resolve_trace

    trace = open_trace(resolve_trace(None))
    opts = options_for(name, {"scope": "tensor"})
    whole = list(compress_steps(trace.steps_iter(), make_compressor(name, 0.01, **opts), make_memory(memory),
                                trace.layout()))
    streamed = list(compress_streamed(trace, lambda _: (make_compressor(name, 0.01, **opts), make_memory(memory)),
                                      group_bytes=20_000))  # the shipped CNN's layers in several groups
    assert len(streamed) == len(whole) == trace.steps
    for a, b in zip(whole, streamed, strict=True):
        for field in ("rel_error", "update_error", "energy_captured", "density_achieved", "density_aggregate"):
            assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-5, abs=1e-7), field
        assert b.overlap_topk == pytest.approx(a.overlap_topk) if a.overlap_topk is not None else b.overlap_topk is None
        assert b.dense_step == a.dense_step
        if name != "gaussiank":  # its all-gather pads to the largest count per group, not per vector
            assert b.bytes_per_rank == a.bytes_per_rank
