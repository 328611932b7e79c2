"""DDP comm hooks: the hook's aggregate equals the in-process simulation, and training with it converges."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import rank_reports

from arcsim.errors import CompressionError
from arcsim.hooks import CompressionState

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return rank_reports(HERE / "_ddp_check.py", 2, tmp_path_factory.mktemp("ddp"))


def test_hook_aggregate_equals_in_process_simulation(report):
    for rank_report in report:
        assert set(rank_report["equality"]) == {"dense", "topk", "arctopk", "star", "randk", "powersgd", "gaussiank"}
        for name, diff in rank_report["equality"].items():
            assert diff <= 1e-6, (name, diff)


def test_training_with_the_hook_converges_like_dense(report):
    dense, topk = report[0]["train/none"], report[0]["train/topk"]
    assert topk["last"] < 0.2 * topk["first"]
    assert topk["accuracy"] >= 0.85 and topk["accuracy"] >= dense["accuracy"] - 0.05
    assert 0 < topk["bytes"] < 0.2 * 4 * 26_122  # 5% of the digits mlp's fp32 gradient, values + indices


def test_state_refuses_bad_requests():
    with pytest.raises(CompressionError, match="unknown compressor"):
        CompressionState("zipk")
    with pytest.raises(CompressionError, match="density must be in"):
        CompressionState("topk", density=0)
