"""Node-aware (hierarchical) compression: each compressor's aggregate against a re-derivation by hand (node
means, slices, per-slice selection and error feedback, exchange between nodes), the bytes of each group, the
links each group is priced on, and `arcsim run --hierarchy`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import multi, rank_reports, run_cli

from arcsim.catalog import INFO
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.grouping import Grouping, group_workers, slice_bounds, slice_layout
from arcsim.compressors.hierarchy import NodeAware
from arcsim.compressors.layout import Layer, flat_layout
from arcsim.compressors.memory import make_memory
from arcsim.compressors.registry import make_compressor
from arcsim.errors import ArcsimError
from arcsim.pricing import Pricer, group_topology, price_collective
from arcsim.run.measure import default_memory

HERE = Path(__file__).parent
NODES, GPUS, N = 2, 4, 103  # 8 workers; 103 elements: slices of 26, 26, 26 and 25


def _grads(step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(NODES * GPUS, N, generator=gen) * torch.linspace(0.1, 3.0, N)


def _node_aware(name: str, density: float, memory: str, layout=None, priced: int = GPUS) -> NodeAware:
    return NodeAware(Grouping(NODES, GPUS, priced), N, layout or flat_layout(N),
                     lambda g: (make_compressor(name, density, seed=7 + g), make_memory(memory)))


def test_slices_and_their_layers_by_hand():
    assert slice_bounds(103, 4) == [(0, 26), (26, 52), (52, 78), (78, 103)]
    assert slice_bounds(8, 8) == [(i, i + 1) for i in range(8)]
    layout = (Layer("w", (4, 5), 0), Layer("b", (5,), 20), Layer("v", (30,), 25))
    assert slice_layout(layout, 0, 25) == (Layer("w", (4, 5), 0), Layer("b", (5,), 20))
    assert slice_layout(layout, 18, 40) == (Layer("w", (2,), 0), Layer("b", (5,), 2), Layer("v", (15,), 7))
    assert slice_layout(layout, 10, 30) == (Layer("w", (2, 5), 0), Layer("b", (5,), 10), Layer("v", (5,), 15))


def test_cuts_inside_a_matrix_move_to_its_nearest_row_boundary():
    layout = (Layer("w", (8, 6), 0), Layer("b", (8,), 48), Layer("v", (47,), 56))
    # 26 lies in w's fifth row (24…30): moved to 24; 52 (in b) and 78 (in v) cut vectors and stay
    assert slice_bounds(103, 4, layout) == [(0, 24), (24, 52), (52, 78), (78, 103)]
    assert slice_layout(layout, 24, 52) == (Layer("w", (4, 6), 0), Layer("b", (4,), 24))
    conv = (Layer("c", (4, 2, 3, 3), 0),)  # rows (output channels) of 18: 24 → 18, 48 → 54
    assert slice_bounds(72, 3, conv) == [(0, 18), (18, 54), (54, 72)]
    assert slice_layout(conv, 18, 54) == (Layer("c", (2, 2, 3, 3), 0),)
    assert slice_bounds(4, 4, (Layer("m", (2, 2), 0),)) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # else a slice is empty


def test_node_aware_powersgd_sends_the_low_rank_factors_of_a_cut_matrix():
    """A 64 × 32 layer cut in two row blocks: each rail sends P (32 × r) and Q (32 × r), not 1,024 values."""
    n, layout = 64 * 32, (Layer("w", (64, 32), 0),)
    node = NodeAware(Grouping(NODES, 2, 2), n, layout,
                     lambda g: (make_compressor("powersgd", 0.1, seed=g, rank=2), make_memory("ef14")))
    x = torch.randn(NODES * 2, n, generator=torch.Generator().manual_seed(0))
    _, records, _ = node.step(x, 0)
    assert node.layouts == [(Layer("w", (32, 32), 0),)] * 2
    assert sorted(r.elements for r in records if r.group == "inter") == [32 * 2, 32 * 2]


def test_the_captured_workers_are_grouped_into_nodes():
    assert group_workers(8, 8) == Grouping(2, 4, 8)  # at least two nodes: 2 × 4
    assert group_workers(8, 2) == Grouping(4, 2, 2)
    assert group_workers(6, 8) == Grouping(2, 3, 8)
    assert group_workers(16, 8).gpus == 8 and group_workers(16, 8).slice_scale == 1.0
    with pytest.raises(ArcsimError, match="cannot be grouped"):
        group_workers(3, 8)
    with pytest.raises(ArcsimError, match="one GPU per node"):
        group_workers(8, 1)


def test_dense_node_aware_is_the_flat_mean():
    x = _grads(0)
    out, records, _ = _node_aware("dense", 1.0, "none").step(x, 0)
    assert torch.allclose(out[0], x.mean(dim=0), atol=1e-6)
    # one rank's view: reduce-scatter of the bucket and all-gather of a slice inside the node, and between nodes
    # the all-reduce of its slice on its rail (the rails run at once)
    assert [(r.op, r.group, r.elements) for r in records] == [
        ("reducescatter", "node", N), ("allreduce", "inter", 26), ("allgather", "node", 26)]


def test_topk_node_aware_with_error_feedback_by_hand():
    """Two steps of EF14 Top-K at ρ = 0.1, derived here with loops: node means, slices, each (node, slice)
    keeping its ⌊0.1·len⌋ largest of u = mean + e, the mean over nodes of what they kept, e ← u − kept."""
    node = _node_aware("topk", 0.1, "ef14")
    error = torch.zeros(NODES, N)
    for step in range(2):
        x = _grads(step)
        out, records, _ = node.step(x, step)
        expected = torch.zeros(N)
        for j in range(NODES):
            u = sum(x[j * GPUS + g] for g in range(GPUS)) / GPUS + error[j]
            kept = torch.zeros(N)
            for lo, hi in [(0, 26), (26, 52), (52, 78), (78, 103)]:
                k = max(1, math.floor(0.1 * (hi - lo)))
                top = u[lo:hi].abs().argsort(descending=True)[:k] + lo
                kept[top] = u[top]
            expected += kept / NODES
            error[j] = u - kept
        assert torch.allclose(out[0], expected, atol=1e-6), step
    inter = [r for r in records if r.group == "inter"]  # the first rail's: ⌊2.6⌋ = 2 values and 2 indices, packed
    assert [(r.op, r.elements) for r in inter] == [("allgather", 4)]


@pytest.mark.parametrize("name", sorted(INFO))
def test_every_compressor_node_aware_is_its_flat_self_on_each_slice_of_the_node_means(name):
    """The composition re-derived: node means by hand, each slice through a fresh flat compressor (the same seed)
    and memory over an N-rank communicator, the slices concatenated — two steps, so error feedback is per slice."""
    layout = (Layer("w", (8, 6), 0), Layer("b", (8,), 48), Layer("v", (47,), 56))
    memory = default_memory(name)
    node = _node_aware(name, 0.1, memory, layout)
    parts = [(make_compressor(name, 0.1, seed=7 + g), make_memory(memory)) for g in range(GPUS)]
    comm = InProcessComm(NODES)
    for step in range(2):
        x = _grads(step)
        out, _, stats = node.step(x, step)
        means = torch.stack([x[j * GPUS:(j + 1) * GPUS].mean(dim=0) for j in range(NODES)])
        pieces = [mem.step(means[:, lo:hi].contiguous(), comp, comm, step, slice_layout(layout, lo, hi))
                  for (lo, hi), (comp, mem) in zip(slice_bounds(N, GPUS, layout), parts, strict=True)]
        assert torch.allclose(out, torch.cat(pieces, dim=1), atol=1e-5), step
        assert stats.compressed_mean().shape == (1, N)


def test_records_scale_from_measured_slices_to_the_priced_node():
    """Measured on 2 nodes × 4 but priced on nodes of 8 GPUs: slices of n/8, so the rails' Top-K messages halve
    (⌊2.6⌋ = 2 values and 2 indices per measured slice → 2 elements per priced one) and the in-node all-gather
    carries ⌈103/8⌉."""
    _out, records, _ = _node_aware("topk", 0.1, "none", priced=8).step(_grads(0), 0)
    assert [(r.op, r.group, r.elements) for r in records if r.group == "node"] == [
        ("reducescatter", "node", N), ("allgather", "node", 13)]
    assert [r.elements for r in records if r.group == "inter"] == [2]
    gather = next(r for r in records if r.group == "node" and r.op == "allgather")
    assert gather.bytes_per_rank == 13 * 4 and gather.total_bytes == 13 * 4 * 8


def test_each_group_is_priced_on_the_links_it_uses():
    topo = multi(4, 8, nics=2, gbps=100.0)
    node, rail = group_topology(topo, "node"), group_topology(topo, "inter")
    assert (node.nodes, node.gpus_per_node) == (1, 8)
    assert (rail.nodes, rail.gpus_per_node, rail.network.nics_per_node) == (4, 1, 1)
    assert rail.network.bandwidth_per_nic == pytest.approx(100e9 / 8 * 2 / 8)  # 8 rails share 2 NICs
    pricer = Pricer(topo)
    _, records, _ = _node_aware("dense", 1.0, "none", priced=8).step(_grads(0), 0)
    priced = pricer.records(records)
    rs = price_collective(node, "reducescatter", "auto", N * 4, ("analytic",))[0]
    ar = price_collective(rail, "allreduce", "auto", records[1].bytes_per_rank, ("analytic",))[0]
    assert priced[0].time_s == pytest.approx(rs.time_s) and priced[1].time_s == pytest.approx(ar.time_s)
    # a slower network between nodes slows the rails and leaves the node's steps as they were
    slow = Pricer(topo.with_overrides(bandwidth=1e9 / 8)).records(records)
    assert slow[0].time_s == pytest.approx(priced[0].time_s) and slow[1].time_s > priced[1].time_s


def test_run_prices_every_compressor_both_ways_and_the_policy_chooses(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("run", "--topology", "8x8-ib100", "--hierarchy", "both", "--compressors", "topk,arctopk",
                "--ratios", "0.01,0.1", "--bandwidth", "1Gbit", "--json", str(out), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    ways = {(c["compressor"], c["hierarchy"]) for c in result["candidates"]}
    assert ways == {(c, h) for c in ("topk", "arctopk") for h in ("flat", "node")}
    node_topk = [c for c in result["candidates"] if (c["compressor"], c["hierarchy"]) == ("topk", "node")]
    flat_topk = [c for c in result["candidates"] if (c["compressor"], c["hierarchy"]) == ("topk", "flat")]
    # between nodes, node-aware Top-K sends 1/8 of the bucket's selection per rank (its slice's)
    assert node_topk[0]["bytes_per_rank"] < flat_topk[0]["bytes_per_rank"]
    choice = result["policy"]["choices"][0]
    assert choice["hierarchy"] in ("flat", "node") and all("hierarchy" in ru for ru in choice["runners_up"])
    assert {p["hierarchy"] for p in result["pareto"]["evaluated"]} == {"flat", "node"}
    assert "node-aware" in " ".join(result["assumptions"])
    crossing = result["crossover"]["hierarchy"]  # fastest flat and node-aware as the NIC bandwidth varies
    assert len(crossing) > 2 and all(r["flat_s"] > 0 and r["node_s"] > 0 for r in crossing)
    by_gpus = result["crossover"]["hierarchy_by_gpus"]  # the same 64 ranks packed 2, 4, … 32 to a node
    assert [(r["gpus_per_node"], r["nodes"]) for r in by_gpus] == [(2, 32), (4, 16), (8, 8), (16, 4), (32, 2)]
    assert all(r["node_s"] > 0 and r["flat_s"] > 0 for r in by_gpus)


@pytest.mark.parametrize(("args", "message"), [
    (["--hierarchy", "rails"], "unknown hierarchy 'rails'"),
    (["--hierarchy", "node", "--topology", "8x1-eth10"], "one GPU per node"),
    (["--hierarchy", "both", "--topology", "1x8-ib100"], "has one node"),
])
def test_bad_hierarchies_are_refused_before_any_work(tmp_path, args, message):
    r = run_cli("run", *args, "--json", str(tmp_path / "r.json"), cwd=str(tmp_path))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stderr.count("error:") == 1 and not (tmp_path / "r.json").exists()


def test_sweep_puts_hierarchy_on_an_axis_and_charts_it(tmp_path):
    out = tmp_path / "s"
    r = run_cli("sweep", "-t", "4x8-roce100", "-c", "topk,arctopk", "--hierarchy", "flat,node", "-b", "10Gbit,100Gbit",
                "-o", str(out), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    import pandas as pd

    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == 8 and set(rows["hierarchy"]) == {"flat", "node"}
    node = rows[(rows["hierarchy"] == "node") & (rows["compressor"] == "topk")]
    flat = rows[(rows["hierarchy"] == "flat") & (rows["compressor"] == "topk")]
    assert (node["bytes_per_rank"].to_numpy() < flat["bytes_per_rank"].to_numpy()).all()
    assert (out / "hierarchy.png").stat().st_size > 0
    bad = run_cli("sweep", "-t", "8x1-eth10", "-c", "topk", "--hierarchy", "node", "-o", str(tmp_path / "b"),
                  cwd=str(tmp_path))
    assert bad.returncode == 2 and "hierarchy node on 8x1-eth10" in bad.stderr
    assert not (tmp_path / "b" / "results.csv").exists()


def test_the_node_aware_ddp_hook_path_is_the_simulation_on_real_process_groups(tmp_path):
    """4 gloo ranks as 2 nodes × 2: node and rail groups from torch.distributed, reduce-scatter and all-gather
    inside the node, each compressor over its rail — on every rank the same update as the in-process node-aware
    simulation of the same gradients over three steps of error feedback, and on the ranks of rail 0 the same
    records, group by group."""
    reports = rank_reports(HERE / "_hier_check.py", 4, tmp_path)
    assert [r["local_rank"] for r in reports] == [0, 1, 0, 1] and {r["nodes"] for r in reports} == {2}
    for name in INFO:
        for r in reports:
            assert r[name]["same_log"] or r["local_rank"] != 0, name  # the simulation logs rail 0's records
            assert r[name]["rel_diff"] < 1e-5, (name, r[name]["rel_diff"])
