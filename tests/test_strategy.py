"""The strategy layer (issue 49): one timeline engine for DDP, Horovod and FSDP/HSDP steps, held to closed forms
written here independently; the one DDP step every command prices; `arcsim run --sharding`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from arcsim.compressors.base import Layer
from arcsim.errors import ArcsimError
from arcsim.run.convergence import fit_steps_model
from arcsim.run.strategies import StrategyRow, _mark_recommended, parse_sharding
from arcsim.strategy.buckets import DDP_FIRST_BUCKET_BYTES, make_buckets
from arcsim.strategy.data_parallel import bucketed_step
from arcsim.strategy.engine import Item, StepEffects, run
from arcsim.strategy.memory import Memory

ROOT = Path(__file__).resolve().parents[1]


def _closed_form(forward, backward, ready, compress, comm, after, slow, interference):
    """The bucketed step as a formula: bucket i starts at max(forward + ready_i + its compression so far, the link's
    end of bucket i − 1); the compute stream ends after forward, backward and every compression, later by
    interference × the communication before that end."""
    shift, link, starts, ends = 0.0, 0.0, [], []
    for r, c, m in zip(ready, compress, comm, strict=True):
        shift += c
        start = max(slow * (forward + r) + shift, link)
        link = start + m
        starts.append(start)
        ends.append(link)
    compute_end = slow * (forward + backward) + shift
    compute_end += interference * sum(max(0.0, min(e, compute_end) - s) for s, e in zip(starts, ends, strict=True))
    return max(compute_end, link) + after, starts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.1), st.floats(0, 0.01), st.floats(0, 0.05)), min_size=1, max_size=12),
       st.floats(0, 0.05), st.floats(0, 0.2), st.floats(0, 0.01), st.sampled_from([1.0, 1.07]),
       st.sampled_from([0.0, 0.2]))
def test_the_bucketed_step_is_its_closed_form(buckets, forward, backward, after, slow, interference):
    ready = sorted(b[0] for b in buckets)
    compress, comm = [b[1] for b in buckets], [b[2] for b in buckets]
    t = bucketed_step(forward, backward, ready, compress, comm, after, StepEffects(slow, interference))
    want, starts = _closed_form(forward, backward, ready, compress, comm, after, slow, interference)
    assert t.iteration_s == pytest.approx(want, abs=1e-12)
    assert t.comm_start == pytest.approx(starts, abs=1e-12)
    assert t.compress_s == pytest.approx(sum(compress))


def test_lanes_let_node_and_inter_collectives_overlap_and_world_ones_wait_for_both() -> None:
    items = [Item("comm", 1.0, ("node",)), Item("comm", 1.0, ("inter",)), Item("comm", 1.0, ("node", "inter")),
             Item("compute", 0.5, after=((0, "start"),))]
    t = run(items)
    assert t.comm_start == (0.0, 0.0, 1.0) and t.iteration_s == 2.0
    assert t.compute_s == 0.5 and t.exposed_comm_s == 1.5


def test_ddp_buckets_start_with_torchs_first_bucket_only_under_the_default_cap() -> None:
    layers = [Layer(f"l{i}", (200_000,), i * 200_000) for i in range(8)]  # 0.8 MB each
    default = make_buckets(layers, [0.0] * 8, 25 * 2**20, DDP_FIRST_BUCKET_BYTES)
    given_cap = make_buckets(layers, [0.0] * 8, 25 * 2**20)
    # 0.8 MB is under 1 MiB: the second layer brings the first bucket past it and closes it
    assert [len(b.layers) for b in default] == [2, 6] and [len(b.layers) for b in given_cap] == [8]


def _row(strategy: str, ms: float, error: float, fits: bool) -> StrategyRow:
    memory = Memory(strategy, 1e9 if fits else 9e10, 0.0, 0.0, 8e10)
    return StrategyRow(strategy, "x", ms * 1e-3, 1e-3, 0.0, 0.0, error, memory)


def test_a_row_that_does_not_fit_is_never_recommended() -> None:
    """By run's auto rule: the soonest to the target (iteration × the steps its error needs) among rows that fit and
    whose error the steps model has evidence for."""
    model = fit_steps_model()
    far = model.max_error + 0.05
    rows = _mark_recommended([_row("none", 10, 0.01, True), _row("full", 5, 0.0, False), _row("hybrid", 8, 0.6, True),
                              _row("hybrid", 9, 0.0, True), _row("hybrid", 1, far, True)], model)
    assert [r.recommended for r in rows] == [False, False, False, True, False]  # 5 ms does not fit; 8 ms errs more
    assert rows[2].time_to_target_s > rows[3].time_to_target_s and rows[4].time_to_target_s is None


def test_sharding_names_are_checked() -> None:
    assert parse_sharding("none, full,hybrid,full") == ("none", "full", "hybrid")
    with pytest.raises(ArcsimError, match="choose among none, full, hybrid"):
        parse_sharding("none,zero3")


def test_runs_ddp_is_sharding_studys_ddp_to_the_microsecond(tmp_path) -> None:
    """The same model, batch, precision, GPU and cluster (Ethernet: the cluster's effects on): `arcsim run`'s dense
    baseline and `arcsim shard`'s DDP are one step."""
    run_json, shard_json = tmp_path / "r.json", tmp_path / "s.json"
    assert run_cli("run", "-t", "2x4-eth25-a100", "-c", "dense", "--policy", "none", "--batch", "32",
                   "--json", str(run_json)).returncode == 0
    assert run_cli("shard", "--model", "cnn", "-t", "2x4-eth25-a100", "-b", "32", "--sharding", "none",
                   "--json", str(shard_json)).returncode == 0
    dense = json.loads(run_json.read_text())["dense"]
    ddp = json.loads(shard_json.read_text())["results"][0]
    assert ddp["effects_s"] > 0
    for key in ("iteration_s", "compute_s", "effects_s"):
        assert ddp[key] == pytest.approx(dense[key], rel=1e-9)


def test_run_prices_the_strategies_side_by_side_with_memory(tmp_path) -> None:
    out = tmp_path / "s.json"
    r = run_cli("run", "-t", "2x4-eth25-a100", "-c", "dense,fp16,topk", "--sharding", "none,full,hybrid",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["strategies"]
    assert {r["strategy"] for r in rows} == {"none", "full", "hybrid"}
    assert sum(r["recommended"] for r in rows) == 1
    assert all(r["memory"]["total_bytes"] > 0 and r["fits"] for r in rows)
    full = {r["setting"]: r for r in rows if r["strategy"] == "full"}
    assert full["none"]["rel_error"] == 0 and full["qgZ int8"]["rel_error"] > 0
    # full sharding keeps a quarter of the states of 8 ranks' DDP... an eighth: 16 bytes per parameter over 8
    ddp = next(r for r in rows if r["strategy"] == "none")
    assert full["none"]["memory"]["states_bytes"] == pytest.approx(ddp["memory"]["states_bytes"] / 8)
    assert len({r["compute_s"] for r in rows}) == 1  # one compute, every strategy


@pytest.mark.parametrize(("args", "message"), [
    (("--sharding", "zero3"), "choose among none, full, hybrid"),
    (("--sharding", "full", "--params", "10M"), "needs a model's parameters"),
    (("--sharding", "hybrid", "-t", "8x1-ib100"), "one GPU per node"),
])
def test_bad_sharding_is_one_line_before_any_work(args, message) -> None:
    r = run_cli("run", *(["-t", "2x4-eth25-a100"] if "-t" not in args else []), *args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("error:") == 1


def test_interference_counts_communication_only_while_the_compute_lane_works() -> None:
    """A unit waiting for its all-gather is not slowed by it: only the second collective overlaps compute."""
    slowed = StepEffects(interference=0.5)
    waiting = [Item("comm", 1.0, ("node", "inter")), Item("compute", 0.5, after=((0, "end"),))]
    assert run(waiting, slowed).iteration_s == pytest.approx(1.5)
    beside = [*waiting, Item("comm", 0.2, ("node", "inter"), ((1, "start"),))]
    assert run(beside, slowed).iteration_s == pytest.approx(1.6)  # 0.2 s under compute: + 0.1


def test_a_users_own_gpt_gets_every_strategy_in_one_table(tmp_path, monkeypatch) -> None:
    """Issue 49's question for your own GPT (live gradients, the tokens per example set by --seq-len): DDP with the
    compressors, FSDP and HSDP with ZeRO++'s formats and HSDP with each compressor between nodes, memory on every
    row, one recommended."""
    monkeypatch.chdir(tmp_path)
    model = f"{ROOT / 'examples' / 'my_model.py'}:build"
    out = tmp_path / "gpt.json"
    r = run_cli("run", "--live", "--model", model, "--model-arg", "width=32",
                "--dataset", "python-text", "--seq-len", "32", "--workers", "4", "--steps", "1", "-t", "2x4-eth25-a100",
                "--precision", "bf16", "-c", "dense,fp16,topk", "--ratios", "0.01", "--sharding", "none,full,hybrid",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["compute_basis"]["precision"] == "bf16"
    rows = {(x["strategy"], x["setting"]): x for x in res["strategies"]}
    assert ("hybrid", "topk@0.01 between nodes") in rows and ("full", "qgZ int8") in rows
    hsdp_topk = rows[("hybrid", "topk@0.01 between nodes")]
    node_aware = [c for c in res["candidates"] if c["compressor"] == "topk" and c["hierarchy"] == "node"]
    assert 0 < hsdp_topk["rel_error"] < 1 and not node_aware  # measured for HSDP though the run was flat
    assert sum(x["recommended"] for x in rows.values()) == 1
    assert all(x["memory"]["total_bytes"] > 0 for x in rows.values())


def test_zeropps_quantisation_kernels_are_priced_on_the_gpu_and_only_for_quantised_collectives() -> None:
    from arcsim.devices.catalog import device
    from arcsim.strategy.schedule import Quantize, fsdp_schedule
    from arcsim.strategy.sharded import quantisation_work
    from arcsim.strategy.units import ROOT, ShardUnit

    units = [ShardUnit(f"b.{i}", ((1024, 1024),)) for i in range(3)]
    root = ShardUnit(ROOT, ((1000, 64),))
    plain = fsdp_schedule(units, root, "full", 16, 8, "bf16")
    quantised = fsdp_schedule(units, root, "full", 16, 8, "bf16", quantize=Quantize("int8", "int8"))
    encode, decode = quantisation_work(plain, device("a100"))
    assert sum(encode) == 0 and not decode
    encode, decode = quantisation_work(quantised, device("a100"))
    grads = [c for c in quantised if c.what == "grads"]
    assert all(e > 0 for e, c in zip(encode, quantised, strict=True) if c.what == "grads") and len(grads) == 8
    assert set(decode) == {(p, u.name) for p in ("forward", "backward") for u in [*units, root]} - {("backward", ROOT)}
    assert quantisation_work(quantised, None) == ([0.0] * len(quantised), {})


def test_hsdp_with_a_compressor_prices_one_set_of_collectives_per_shard_whatever_ddps_buckets(tmp_path) -> None:
    """HSDP has no DDP buckets: the compressor's collectives between nodes (measured per bucket) are one set per
    unit's shard, so the row does not move with --bucket-mb (it was priced once per bucket: 0.32 -> 0.59 ms)."""
    rows = []
    for cap in ([], ["--bucket-mb", "0.02"]):
        out = tmp_path / f"h{len(cap)}.json"
        assert run_cli("run", "-t", "2x4-eth25-a100", "-c", "dense,fp16", "--policy", "none", "--ratios", "0.01",
                       "--sharding", "hybrid", *cap, "--json", str(out)).returncode == 0
        rows.append(next(r for r in json.loads(out.read_text())["strategies"] if r["setting"].startswith("fp16")))
    assert rows[0]["iteration_s"] == pytest.approx(rows[1]["iteration_s"], rel=1e-4)  # rounding of elements
