"""Flat or node-aware, per decision: the policies under a network schedule choose the hierarchy as they choose
compressor and ratio, train with it, and carry error feedback across a change of hierarchy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_cli

from arcsim.compressors.grouping import group_workers
from arcsim.network_schedule import NetworkSchedule, Phase
from arcsim.run.measure import BucketedCompression
from arcsim.run.target import Target
from arcsim.train.loop import TrainConfig, prepare
from arcsim.train.scheduled import ScheduledConfig, ScheduledExperiment, decisions
from arcsim.units import parse_duration, parse_rate

# 8 nodes × 8 L40S behind shared PCIe switches (4 GB/s per GPU when all of them move data at once), 8 NICs per node
PCIE_BOX = """name: pcie-box
nodes: 8
gpus_per_node: 8
gpu: l40s
intra: {kind: pcie, bandwidth: 4GB/s, latency: 3us}
network: {kind: ethernet, nics_per_node: 8, bandwidth_per_nic: 100Gbps, latency: 5us, fabric: switch}
"""
# a very slow network between nodes for steps 0-7, then one faster than the PCIe inside them
SCHEDULE = NetworkSchedule("drop", (Phase(0, parse_duration("1ms"), parse_rate("10Mbps")),
                                    Phase(8, parse_duration("2us"), parse_rate("400Gbps"))))


@pytest.mark.parametrize("memory", ["ef14", "ef21", "ef21m"])
def test_a_change_of_hierarchy_carries_what_error_feedback_owes(memory):
    """Flat → node-aware: each node owes the mean of what its workers owed; node-aware → flat: each worker takes its
    node's. Either way the aggregate owes the same, and a compressor switch keeps the node-aware memories."""
    setup = prepare(TrainConfig(model="mlp", steps=2))
    bc = BucketedCompression(setup.buckets, "topk", 0.05, memory)
    grads = torch.randn(5, 8, setup.elements, generator=torch.Generator().manual_seed(0))
    for step in range(3):
        bc.step(step, grads[step])

    def owed() -> list[torch.Tensor]:
        if bc.hierarchy == "flat":
            return [m.residual().mean(dim=0) for m in bc.mems]
        return [torch.cat([m.residual().mean(dim=0) for m in parts]) for parts in bc.slice_mems]

    before = owed()
    bc.regroup(group_workers(8, 8))
    assert bc.hierarchy == "node" and not bc.mems and len(bc.slice_mems[0]) == 4  # 2 nodes × 4
    for a, b in zip(before, owed(), strict=True):
        torch.testing.assert_close(a, b)
    bc.step(3, grads[3])
    before = owed()
    bc.switch("arctopk", 0.1)
    for a, b in zip(before, owed(), strict=True):
        torch.testing.assert_close(a, b)
    bc.regroup(None)
    assert bc.hierarchy == "flat" and not bc.slice_mems
    for a, b in zip(before, owed(), strict=True):
        torch.testing.assert_close(a, b)
    bc.step(4, grads[4])


def test_both_hierarchies_are_static_choices_and_need_nodes_of_two_or_more():
    cfg = TrainConfig(model="mlp", steps=16, workers=4)
    both = ScheduledConfig(cfg, SCHEDULE, "2x4-eth10", candidates=("topk",), ratios=(0.1,), hierarchy="both")
    assert [c.label for c in both.choices] == ["topk@0.1", "topk@0.1/node"]
    assert both.grouping() == group_workers(4, 4)


def test_node_aware_under_a_schedule_is_refused_on_one_gpu_per_node(tmp_path):
    (tmp_path / "s.yaml").write_text("phases:\n  - {start: 0, latency: 1ms, bandwidth: 1Gbps}\n")
    r = run_cli("train", "--model", "mlp", "--steps", "20", "--network-schedule", str(tmp_path / "s.yaml"),
                "--hierarchy", "both", "--target", "0.5", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "node-aware compression needs several GPUs per node" in r.stderr and not (tmp_path / "o").exists()


def test_adaptive_picks_node_aware_on_a_slow_network_and_flat_where_node_aware_cannot_pay(tmp_path):
    """Top-K at 0.001: over 10 Mbit/s, node-aware's all-gather among 8 nodes (of 1/8 slices) beats flat's among 64
    ranks; over 400 Gbit/s, node-aware's dense reduce-scatter and all-gather of the whole gradient over 4 GB/s PCIe
    cost more than the compressed all-gather saves. Steps are priced on the L40S (compression modelled): the
    decisions do not depend on this machine's speed."""
    (tmp_path / "pcie.yaml").write_text(PCIE_BOX)
    cfg = TrainConfig(model="mlp_wide", workers=4, batch=8, steps=16, eval_every=4, seeds=(0,))
    scfg = ScheduledConfig(cfg, SCHEDULE, str(tmp_path / "pcie.yaml"), policies=("adaptive",), candidates=("topk",),
                           ratios=(0.001,), target=Target(0.9), warmup=4, hierarchy="both")
    history = ScheduledExperiment(scfg, tmp_path / "o", announce=lambda _: None).run().sort_values("step")
    log = decisions(tmp_path / "o")
    by_reason = {d["reason"]: d for d in log}
    slow, fast = by_reason["warm-up over"], by_reason["network changed"]
    assert (slow["step"], fast["step"]) == (4, 8)
    for d in log:
        times = {c["hierarchy"]: c["time_s"] for c in d["candidates"]}
        assert set(times) == {"flat", "node"}
    slow_s = {c["hierarchy"]: c["time_s"] for c in slow["candidates"]}
    fast_s = {c["hierarchy"]: c["time_s"] for c in fast["candidates"]}
    assert slow["chosen"]["hierarchy"] == "node" and slow_s["flat"] > 2 * slow_s["node"]
    assert fast["chosen"]["hierarchy"] == "flat" and fast_s["node"] > 1.3 * fast_s["flat"]
    # the run trained as decided: flat warm-up, then each decision's hierarchy until the next
    in_force = ["flat"] * 4
    for d, after in zip(log, [d["step"] for d in log[1:]] + [16], strict=True):
        in_force += [d["chosen"]["hierarchy"]] * (after - d["step"])
    assert list(history["hierarchy"]) == in_force
    # and each decision step is priced as its choice (node-aware: its node's and its rails' collectives)
    per_step = np.diff(np.concatenate([[0.0], history["time_s"].to_numpy()]))
    for d in log:
        assert per_step[d["step"]] == pytest.approx(d["chosen"]["time_s"] + d["exploration_s"], rel=1e-9)
