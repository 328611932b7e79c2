"""Sharded data parallel (arcsim.sharding, `arcsim shard`): FSDP2's collectives as real PyTorch issues them,
the two-stream timeline, memory per GPU, ZeRO++'s quantised collectives and their error on a real trace."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from conftest import run_cli

from arcsim.collectives.libraries.gloo import SERIAL_AT_TWO
from arcsim.errors import ArcsimError
from arcsim.strategy.memory import DDP_BUCKET_BYTES, STATE_BYTES, memory_per_gpu
from arcsim.strategy.schedule import (
    Quantize,
    ShardCollective,
    cross_node_bytes,
    fsdp_schedule,
    quantize_variant,
)
from arcsim.strategy.sharded import sharded_step
from arcsim.strategy.units import ROOT, ShardUnit, assign, group_units

TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def as_recorded(schedule: list[ShardCollective]) -> list[tuple[str, float, str, int]]:
    return [(c.op, c.nbytes, TORCH_DTYPE[c.dtype], c.ranks) for c in schedule]


def real(collectives: list[dict]) -> list[tuple[str, float, str, int]]:
    return [(c["op"], float(c["bytes"]), c["dtype"], c["ranks"]) for c in collectives]


def units_of(cfg: dict) -> tuple[list[ShardUnit], ShardUnit]:
    return group_units([(n, tuple(s)) for n, s in cfg["shapes"]])


# -- units ----------------------------------------------------------------------------------------------
def test_units_follow_blocks_with_the_rest_in_the_root() -> None:
    names = [("model.embed_tokens.weight", (100, 8)), ("model.layers.0.attn.q.weight", (8, 8)),
             ("model.layers.0.mlp.up.weight", (16, 8)), ("model.layers.1.attn.q.weight", (8, 8)),
             ("model.norm.weight", (8,)), ("lm_head.weight", (100, 8))]
    units, root = group_units(names)
    assert [u.name for u in units] == ["model.layers.0", "model.layers.1"]
    assert units[0].numel == 64 + 128 and root.numel == 800 + 8 + 800
    assert assign(names)["lm_head.weight"] == ROOT
    plain = [("0.weight", (33, 10)), ("0.bias", (33,)), ("2.weight", (5, 33))]
    units, root = group_units(plain)  # no numbered blocks: each top-level child
    assert [u.name for u in units] == ["0", "2"] and root.numel == 0
    assert units[0].padded_numel(2) == 34 * 10 + 34  # dim 0 padded to a multiple of the shard count
    assert units[0].padded_numel(4) == 36 * 10 + 36


# -- the schedule against real FSDP2 ---------------------------------------------------------------------
# What torch 2.13's fully_shard issued on 2 gloo ranks in the second step (fsdp_probe, recorded): the MLP
# Linear(10,33), Linear(33,17), Linear(17,5), each its own unit, the root without parameters
MLP_RECORDED = [("allgather", 1496.0), ("allgather", 2448.0), ("allgather", 432.0),   # forward
                ("allgather", 432.0), ("allgather", 2448.0), ("reducescatter", 432.0),  # last unit again, prefetch
                ("allgather", 1496.0), ("reducescatter", 2448.0), ("reducescatter", 1496.0)]


def test_mlp_schedule_is_what_fsdp2_issued() -> None:
    from arcsim.sharding.fsdp_probe import build
    from arcsim.strategy.units import model_shapes

    units, root = group_units(model_shapes(build("mlp")))
    got = [(c.op, c.nbytes) for c in fsdp_schedule(units, root, "full", 2, 2)]
    assert got == MLP_RECORDED
    no_reshard = [(c.op, c.nbytes) for c in fsdp_schedule(units, root, "full", 2, 2, reshard_after_forward=False)]
    assert no_reshard == [MLP_RECORDED[i] for i in (0, 1, 2, 5, 7, 8)]


@pytest.mark.slow
def test_fsdp2_issues_the_schedules_collectives_two_ranks() -> None:
    """Real FSDP2 (fully_shard, gloo, CPU) on an MLP and a small transformer: the same operations, sizes,
    dtypes and group sizes in the same order as arcsim's schedule (default, True, False, bf16 parameters)."""
    from arcsim.sharding.fsdp_probe import probe

    configs = [{"model": "mlp"}, {"model": "transformer"}, {"model": "transformer", "reshard": True},
               {"model": "transformer", "reshard": False}, {"model": "transformer", "bf16": True}]
    for cfg in probe(configs, world=2):
        units, root = units_of(cfg)
        sched = fsdp_schedule(units, root, "full", 2, 2, "bf16" if cfg.get("bf16") else "fp32", "fp32",
                              cfg.get("reshard"))
        assert as_recorded(sched) == real(cfg["collectives"]), cfg
        assert len(sched) > 0


@pytest.mark.slow
def test_fsdp2_hybrid_and_reshard_to_node_four_ranks() -> None:
    """HSDP on a 2 × 2 mesh (reduce-scatter in the 'node', all-reduce of the shard across) and
    reshard_after_forward=2 (hpZ: backward gathers among 2 of the 4 ranks) on 4 gloo ranks."""
    from arcsim.sharding.fsdp_probe import probe

    hsdp, hpz = probe([{"model": "transformer", "mesh": [2, 2]}, {"model": "transformer", "reshard": 2}], world=4)
    units, root = units_of(hsdp)
    assert as_recorded(fsdp_schedule(units, root, "hybrid", 4, 2)) == real(hsdp["collectives"])
    sched = fsdp_schedule(units, root, "full", 4, 2, reshard_after_forward=2)
    assert as_recorded(sched) == real(hpz["collectives"])
    assert {c.group for c in sched if c.phase == "backward" and c.op == "allgather"} == {"node"}


def test_quantised_schedule_shrinks_the_wire_and_splits_qgz() -> None:
    units = [ShardUnit(f"b{i}", ((1024, 1024),)) for i in range(3)]
    root = ShardUnit(ROOT, ((4096, 64),))
    plain = fsdp_schedule(units, root, "full", 16, 8, "bf16", "fp32")
    zpp = fsdp_schedule(units, root, "full", 16, 8, "bf16", "fp32", quantize=quantize_variant("zeropp"))
    assert {c.dtype for c in zpp if c.what == "params"} == {"int8"}
    # qgZ: in the node first, then across nodes on the 1/G shard; hpZ: backward's gathers in the node
    grads = [c for c in zpp if c.what == "grads" and c.unit == "b2"]
    assert [(c.group, c.numel) for c in grads] == [("node", 1024 * 1024), ("inter", 1024 * 1024 // 8)]
    assert all(c.group == "node" for c in zpp if c.phase == "backward" and c.op == "allgather")
    cross = sum(cross_node_bytes(c, 8, 2) for c in plain) / sum(cross_node_bytes(c, 8, 2) for c in zpp)
    assert cross > 4  # fp32 gradients and bf16 weights: more than ZeRO++'s 4x against fp16 ones
    # a format no narrower than what is sent already changes nothing
    assert as_recorded(fsdp_schedule(units, root, "full", 16, 8, "bf16", "fp32", quantize=Quantize("bf16"))) == \
        as_recorded(plain)


def test_cross_node_bytes_of_a_ring() -> None:
    ag = ShardCollective("allgather", "world", 64, "u", "forward", 1000, "fp32", "params")
    assert cross_node_bytes(ag, 8, 8) == pytest.approx(4000 / 8 * 7 / 8)
    ar = ShardCollective("allreduce", "inter", 8, "u", "backward", 1000, "fp32", "grads")
    assert cross_node_bytes(ar, 8, 8) == pytest.approx(2 * 4000 * 7 / 8)
    assert cross_node_bytes(ShardCollective("reducescatter", "node", 8, "u", "backward", 10, "fp32", "grads"),
                            8, 8) == 0


def test_bad_schedule_requests_are_one_error() -> None:
    units, root = [ShardUnit("a", ((4,),))], ShardUnit(ROOT, ())
    with pytest.raises(ArcsimError, match="hybrid"):
        fsdp_schedule(units, root, "hybrid", 4, 1)
    with pytest.raises(ArcsimError, match="whole number"):
        fsdp_schedule(units, root, "full", 6, 4)
    with pytest.raises(ArcsimError, match="unknown --quantize"):
        quantize_variant("int3")
    with pytest.raises(ArcsimError, match="two"):
        quantize_variant("int8+fp16")
    assert quantize_variant("int8+qgz+hpz") == Quantize("int8", "int8", True)


# -- timeline ------------------------------------------------------------------------------------------
def test_two_stream_timeline_by_hand() -> None:
    """Two units (1 s forward, 2 s backward each), no root; every collective 0.5 s."""
    fwd, bwd = {"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 2.0}
    ops = [("allgather", "a", "forward"), ("allgather", "b", "forward"), ("allgather", "b", "backward"),
           ("allgather", "a", "backward"), ("reducescatter", "b", "backward"), ("reducescatter", "a", "backward")]
    tl = sharded_step(["a", "b"], fwd, bwd, ops, [0.5] * 6)
    # AG a 0-0.5; F a 0.5-1.5; AG b 0.5-1 (prefetched while a computes); F b 1.5-2.5; AG b again 2.5-3;
    # B b 3-5; AG a 3-3.5 (prefetched); RS b 5-5.5; B a 5-7; RS a 7-7.5
    assert tl.comm_start == (0.0, 0.5, 2.5, 3.0, 5.0, 7.0)
    assert tl.iteration_s == pytest.approx(7.5) and tl.compute_s == pytest.approx(6.0)
    assert tl.exposed_comm_s == pytest.approx(1.5)
    free = sharded_step(["a", "b"], fwd, bwd, ops, [0.0] * 6)
    assert free.iteration_s == pytest.approx(6.0) and free.exposed_comm_s == pytest.approx(0.0)


# -- memory --------------------------------------------------------------------------------------------
def test_memory_per_gpu() -> None:
    units = [ShardUnit(f"b{i}", ((1000, 1000),)) for i in range(4)]
    root = ShardUnit(ROOT, ((500, 1000),))
    p = 4.5e6
    ddp = memory_per_gpu("none", units, root, 16, 8, 80e9)
    assert ddp.total_bytes == (STATE_BYTES + DDP_BUCKET_BYTES) * p and ddp.fits  # + the reducer's bucket copy
    full = memory_per_gpu("full", units, root, 16, 8, 80e9, "bf16", "fp32")
    assert full.states_bytes == STATE_BYTES * p / 16
    assert full.buffers_bytes == 2 * (0.5e6 + 2e6) + 4 * 1e6
    hybrid = memory_per_gpu("hybrid", units, root, 16, 8, 80e9, "bf16", "fp32")
    assert hybrid.states_bytes == STATE_BYTES * p / 8
    tight = memory_per_gpu("none", units, root, 16, 8, 50e6, activations_bytes=1e6)
    assert not tight.fits and tight.total_bytes == (STATE_BYTES + DDP_BUCKET_BYTES) * p + 1e6


# -- pricing a zoo model ---------------------------------------------------------------------------------
def test_llama_1b_strategies_on_a_cluster() -> None:
    from arcsim.sharding.price import study
    from arcsim.topology import load_topology

    s = study("llama_1b", load_topology("8x8-ib100"), None, 4, "bf16", ["none", "full", "hybrid"],
              [Quantize(), quantize_variant("zeropp")], reduce_dtype="bf16")
    by = {(r.strategy, r.quantize): r for r in s.results}
    ddp, fsdp, zpp = by[("none", "none")], by[("full", "none")], by[("full", "qwZ int8 + hpZ + qgZ int4")]
    assert s.params == 1_339_082_752 and s.units == 24
    # FSDP moves 1.5x DDP's bytes across nodes (two gathers of bf16 weights and a bf16 reduce-scatter
    # against a bf16 all-reduce: 3 x 2 bytes against 2 x 2, less the root's second gather); ZeRO++ ~4x less
    assert 1.3 < fsdp.cross_node_bytes_per_gpu / ddp.cross_node_bytes_per_gpu < 1.5
    assert 3.5 < fsdp.cross_node_bytes_per_gpu / zpp.cross_node_bytes_per_gpu < 4.0
    assert fsdp.memory.total_bytes < ddp.memory.total_bytes / 10
    assert zpp.iteration_s < fsdp.iteration_s
    for r in s.results:
        assert r.iteration_s >= r.compute_s - 1e-12 and r.exposed_comm_s >= -1e-12
        assert math.isclose(r.compute_s, s.compute.profile.forward_s + s.compute.profile.backward_s, rel_tol=1e-9)


# -- the error of quantised reduce-scatters on real gradients ------------------------------------------------
def test_quantised_reduce_scatter_error_on_the_shipped_trace() -> None:
    from arcsim.compressors.sharded import blockwise as int8_blockwise
    from arcsim.sharding.quant import trace_errors

    _, errors = trace_errors(None)
    e = {x.how: x.rel_error_mean for x in errors}
    assert 0 < e["bf16"] < e["int8"] < e["int8-hier"] < e["int8-ring"] < e["int4-hier"]
    assert e["int8-hier"] < 1e-3 and e["int4-hier"] < 0.1
    import torch

    x = torch.randn(3, 1000)
    assert (int8_blockwise(x) - x).abs().max() <= x.abs().max() / 127 / 2 + 1e-6


# -- the command ---------------------------------------------------------------------------------------------
def test_shard_command_json_and_errors(tmp_path) -> None:
    out = tmp_path / "s.json"
    r = run_cli("shard", "--model", "llama_1b", "-t", "4x8-eth25-a100", "--precision", "bf16", "--batch", "4",
                "--quantize", "none,int8+qgz", "--activations", "70GB", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = {(x["strategy"], x["quantize"]): x for x in data["results"]}
    assert set(rows) == {("none", "none"), ("full", "none"), ("full", "qwZ int8 + qgZ int8"),
                         ("hybrid", "none"), ("hybrid", "qwZ int8 + qgZ int8")}
    assert not rows[("none", "none")]["memory"]["fits"] and rows[("full", "none")]["memory"]["fits"]
    assert {e["how"] for e in data["reduction_error"]["errors"]} >= {"int8", "int8-hier"}
    for bad, why in ((["--sharding", "zero3"], "unknown --sharding"), (["--quantize", "int2"], "unknown --quantize"),
                     (["--activations", "-3GB"], "--activations"), (["--model", "nope"], "")):
        r = run_cli("shard", "--model", "llama_1b", "-t", "2x8-ib100", *bad)
        assert r.returncode == 2, (bad, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and why in lines[0], r.stderr


# -- FSDP2 on the emulated cluster --------------------------------------------------------------------------
def _netns() -> bool:
    from conftest import netns_available

    return netns_available()


@pytest.mark.slow
@pytest.mark.skipif(not _netns(), reason="needs root and network namespaces (the emulated cluster)")
def test_fsdp2_on_the_emulated_cluster(tmp_path, one_emulated_cluster) -> None:
    """2 single-rank nodes at 100 Mbit/s, gloo, an MLP of 4 × Linear(1024, 1024): the step is its collectives
    one after another (the timeline's serial comm stream; compute is milliseconds), arcsim prices gloo's
    all-gather within 15 % of one measured alone, and ProcessGroupGloo's reduce-scatter costs what its
    all-reduce does (it all-reduces the whole input and keeps its chunk), as arcsim's gloo model prices it.
    See docs/sharding.md."""
    from arcsim.sharding.emulated import compare, measure

    cfg = {"layers": 4, "dim": 1024, "batch": 32, "steps": 3}
    m = measure(cfg, 2, "100Mbit", tmp_path, one_emulated_cluster)
    c = compare(cfg, m, "2x1-eth0.1")
    print(c)
    assert c["collectives"] == 12
    assert m["collectives_in_step_s"] > 0.9 * m["iteration_s"]
    # priced against measured: back to back in the step, gloo's 2-rank all-gather runs one direction after the
    # other (SERIAL_AT_TWO: 1.5×; measured 0.27 s in the step against 0.264 priced, quiet); a sanity bound only (this
    # shared machine runs them 0-55 % slow under the suite's own load; docs/sharding.md has the quiet figures)
    assert 0.75 < c["priced_allgather_s"] / m["allgather_in_step_s"] < 1.5
    assert abs(m["reducescatter_s"] / m["allreduce_s"] - 1) < 0.25
    assert m["reducescatter_s"] > 1.25 * m["allgather_s"]  # ~2× quiet; a true reduce-scatter would be ~1× (and
    #                                                         under load the all-gather's own time inflates: 1.49×)
    # gloo's model: an all-reduce, twice a ring's steps, and not in turn (the all-gather's 1.5× taken out)
    assert c["priced_reducescatter_s"] == pytest.approx(2 * c["priced_allgather_s"] / SERIAL_AT_TWO["allgather"],
                                                        rel=0.05)
    assert -0.3 < c["error"] < 0.15                      # measured: -0.084, -0.10 quiet; the bound leaves room for load


def test_quantised_reduce_scatter_is_priced_at_the_bytes_its_codec_sends() -> None:
    """The int8 schedule's reduce-scatter carries what rs-int8's codec encodes (codes and a fp32 scale per block),
    and the emulated cluster's HSDP layout cuts a unit's reduce-scatter input where FSDP2 cuts it."""
    import torch

    from arcsim.compressors.grouping import slice_bounds
    from arcsim.compressors.sharded import Codec
    from arcsim.sharding.emulated_compressed import compare, shard_layout

    cfg = {"layers": 2, "dim": 1024}
    fake = {"iteration_s": 1.0, "forward_s": 0.01, "backward_s": 0.02, "codec_s": 0.0, "allgather_s": 0.1,
            "alltoall_payload_s": 0.05, "reducescatter_int8_s": 0.06, "payload_bytes": 0}
    c = compare(cfg, fake, "2x1-eth0.1")
    unit = 1024 * 1024 + 1024
    assert c["grad_dtypes"] == ["int8"] and c["collectives"] == 6
    assert c["scheduled_payload_bytes"] == Codec(8).encode(torch.zeros(1, 2, unit // 2)).numel()
    layout = shard_layout(1024, 2, 2)
    assert [(lay.offset, lay.numel) for lay in layout] == [(0, 512 * 1024), (512 * 1024, 512), (unit // 2, 512 * 1024),
                                                           (unit // 2 + 512 * 1024, 512)]
    assert slice_bounds(unit, 2, layout) == [(0, unit // 2), (unit // 2, unit)]


@pytest.mark.slow
@pytest.mark.skipif(not _netns(), reason="needs root and network namespaces (the emulated cluster)")
def test_fsdp2_with_an_int8_reduce_scatter_on_the_emulated_cluster(tmp_path, one_emulated_cluster) -> None:
    """FSDP2 with rs-int8 as its reduce-scatter (set_custom_reduce_scatter: blockwise int8, one all-to-all, summed
    in fp32 by the chunk's owner), 2 single-rank nodes at 100 Mbit/s, each rank its own batch. The ranks' reduced
    gradients are the in-process rs-int8's on their own gradients, bit for bit; arcsim prices the int8 all-to-all
    and the all-gathers as gloo runs them back to back at 2 ranks (one direction after the other), and the iteration
    within the issue's 15 % (0.92 of measured on a quiet machine, 2026-11-28; 0.58-0.60 before the serial exchange was
    priced): see docs/sharding.md. Under the suite's load the measured step runs slower: the bounds allow it."""
    from arcsim.sharding.emulated_compressed import compare, measure

    cfg = {"layers": 4, "dim": 1024, "batch": 32, "steps": 3}
    m = measure(cfg, 2, "100Mbit", tmp_path, one_emulated_cluster)
    c = compare(cfg, m, "2x1-eth0.1")
    print(c, m["gradients"])
    grads = m["gradients"]
    assert grads["units_checked"] == 4 and grads["rel_error_vs_compressor"] < 1e-6  # measured: 0.0
    assert 1e-3 < grads["rel_error_vs_exact"] < 2e-2                                   # measured: 0.0069 (int8)
    assert c["collectives"] == 12 and c["grad_dtypes"] == ["int8"]
    assert c["scheduled_payload_bytes"] == m["payload_bytes"]
    # gloo's all-to-all of the payload alone (after a barrier) runs in either mode, the two directions at once
    # (0.045 s: each rank's half of the payload at the line's 100 Mbit/s of TCP payload) or in turn (0.088 s:
    # gloo's ready notice behind the late rank's data, SERIAL_AT_TWO); arcsim prices the serial one, back to back
    # in a step: the samples in that mode, or twice the fast mode if none was
    a2a, priced = m["alone_samples_s"]["alltoall_payload"], c["priced_reducescatter_int8_s"]
    one_way = m["payload_bytes"] / 2 / (100e6 / 8 * 1448 / 1514)
    serial = [t for t in a2a if t > 1.5 * one_way] or [2 * min(a2a)]
    assert 0.8 < priced / statistics.median(serial) < 1.3                               # measured: 1.01
    # the quantised reduce-scatter call alone costs less than gloo's fp32 one (an all-reduce, arcsim: 0.351 s)
    assert m["reducescatter_int8_s"] < 0.351
    assert 0.65 < c["ratio"] < 1.15                                                      # measured: 0.92
    assert 0.55 < c["ratio_timeline"] < 1.15                                            # measured: 0.71


@pytest.mark.slow
@pytest.mark.skipif(not _netns(), reason="needs root and network namespaces (the emulated cluster)")
def test_hsdp_with_a_compressor_between_nodes_on_the_emulated_cluster(tmp_path, one_emulated_cluster) -> None:
    """HSDP on 2 nodes × 2 ranks at 100 Mbit/s: fully_shard over each node's ranks (a (2, 2) DeviceMesh's shard
    dim), set_all_reduce_hook running arcsim's compressor over the rail (DistributedComm) on each reduce-scatter
    output. fp16 (loss scale 2^16: unscaled, this MLP's gradients are fp16 subnormals and lose 1-5 %): the nodes'
    gradients are the in-process node-aware compressor's to fp32 rounding, arcsim prices the fp16 rail all-reduce
    as measured. The emulated node's ranks talk over loopback, which `2x2-eth0.1` describes as NVLink (0.80-0.86 of
    measured so): with the node calibrated first (arcsim calibrate --loopback --ranks-per-node 2, 4 s) the iteration
    is 0.92-0.95 of measured (2026-11-28). Top-k with error feedback: the same gradients as NodeAware's, bit for
    bit."""
    from arcsim.sharding.emulated_compressed import compare_hsdp, measure_hsdp

    node = tmp_path / "node.yaml"
    r = run_cli("calibrate", "--loopback", "--ranks", "4", "--ranks-per-node", "2", "--sizes", "1MB,8MB",
                "--repeats", "3", "-o", str(node))
    assert r.returncode == 0, r.stderr
    cfg = {"layers": 4, "dim": 1024, "batch": 32, "steps": 3, "gpus": 2, "compressor": "fp16",
           "loss_scale": 65536}
    m = measure_hsdp(cfg, 4, "100Mbit", tmp_path, one_emulated_cluster)
    c = compare_hsdp(cfg, m, "2x2-eth0.1", node=str(node))
    named = compare_hsdp(cfg, m, "2x2-eth0.1")
    print(c, m["gradients"])
    grads = m["gradients"]
    assert grads["units_checked"] == 4 and grads["rel_difference_between_nodes"] == 0
    assert grads["rel_error_vs_node_aware"] < 5e-6                     # measured: 5.6e-7
    assert grads["rel_error_vs_exact"] < 1e-3                          # measured: 3.0e-4 (fp16)
    assert c["collectives"] == 16 and c["cross_node"] == 4
    assert 0.7 < c["priced_rail_s"] / m["rail_compressed_s"] < 1.4     # measured: 1.11, 0.97
    shard_numel = m["unit_numel"] // m["gpus"]  # fp16 halves the bytes between nodes: one fp16 all-reduce of the shard
    assert [(r["op"], r["dtype"], r["bytes_per_rank"]) for r in m["rail_records"]] == [
        ("allreduce", "float16", 2 * shard_numel)]
    # and the time: 0.50 of fp32's quiet (2026-11-29), 0.63 in CI's suite (the codec and the rail's latency, under load)
    assert m["rail_compressed_s"] < 0.8 * m["rail_allreduce_fp32_s"]
    # measured quiet: 0.92, 0.95, 0.92; 0.78 in the suite (the step slows under load); 1.21 in a suite beside another
    # (the node calibrated under that load: its all-gather priced 27 ms for 3 measured)
    assert 0.65 < c["ratio"] < 1.35
    assert c["predicted_s"] > named["predicted_s"] + 0.03  # the node's collectives, same run: 0.08-0.09 s quiet
    assert named["ratio"] < c["ratio"]                                 # measured: 0.82, 0.86 (loopback as NVLink)
    assert named["priced_node_allgather_s"] < 0.2 * c["priced_node_allgather_s"]
    topk = measure_hsdp({**cfg, "compressor": "topk", "memory": "ef14", "density": 0.01, "steps": 2}, 4, "100Mbit",
                        tmp_path, one_emulated_cluster)
    assert topk["gradients"]["rel_error_vs_node_aware"] < 1e-6         # measured: 0.0
    assert topk["rail_records"][0]["elements"] < 0.025 * (topk["unit_numel"] // 2)  # 1 %: values and indices


def test_cross_node_all_reduces_overlap_the_nodes_collectives() -> None:
    """HSDP: a unit's all-reduce across nodes (NICs) runs beside the next unit's all-gather in the node
    (NVLink) — FSDP2's separate all-reduce stream — but after its own reduce-scatter."""
    fwd, bwd = {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}
    ops = [("allgather", "a", "forward"), ("allgather", "b", "forward"), ("allgather", "b", "backward"),
           ("allgather", "a", "backward"), ("reducescatter", "b", "backward"), ("allreduce", "b", "backward"),
           ("reducescatter", "a", "backward"), ("allreduce", "a", "backward")]
    groups = ["node", "node", "node", "node", "node", "inter", "node", "inter"]
    times = [0.1, 0.1, 0.1, 0.1, 0.1, 3.0, 0.1, 3.0]
    tl = sharded_step(["a", "b"], fwd, bwd, ops, times, groups)
    # forward 0.1-2.1 (after AG a); AG b again 2.1-2.2; B b 2.2-3.2; B a 3.2-4.2
    assert tl.comm_start[4] == pytest.approx(3.2) and tl.comm_start[5] == pytest.approx(3.3)  # RS b, then AR b
    assert tl.comm_start[6] == pytest.approx(4.2)  # RS a when B a ends, while AR b still runs (NVLink free)
    assert tl.comm_start[7] == pytest.approx(6.3)  # AR a waits for AR b's NICs
    serial = sharded_step(["a", "b"], fwd, bwd, ops, times)
    assert serial.iteration_s > tl.iteration_s


def test_the_default_shard_command_runs_on_single_gpu_nodes_and_says_what_it_left_out():
    """On nodes of one GPU the defaults drop HSDP and hpZ with a note (they shard inside a node), and ZeRO++'s
    quantised reduce-scatter has no in-node step; asked for, hpZ is still one clear refusal."""
    done = run_cli("shard", "--model", "mlp", "-t", "8x1-eth10", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert "no HSDP" in done.stderr and "without hpZ" in done.stderr
    rows = json.loads(done.stdout)["results"]
    assert {r["strategy"] for r in rows} == {"none", "full"} and not any("hpZ" in r["quantize"] for r in rows)
    asked = run_cli("shard", "--model", "mlp", "-t", "8x1-eth10", "--quantize", "zeropp")
    assert asked.returncode == 2 and "one GPU per node, and hpZ" in asked.stderr
