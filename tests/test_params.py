"""`arcsim run --params`: a model of any size priced from a small synthetic sample, with exact message sizes."""

import json
import math

import pytest
import torch
from conftest import run_cli

from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.log import FIXED_TAGS, ROOT_TAGS
from arcsim.compressors.registry import make_compressor
from arcsim.traces.params import ParamsModel
from arcsim.units import parse_params


def test_parameter_counts_parse_with_decimal_suffixes():
    assert parse_params("125M") == 125_000_000 and parse_params("1.5B") == 1_500_000_000
    assert parse_params("7e9") == 7_000_000_000 and parse_params("100b") == 100_000_000_000


@pytest.mark.parametrize("name", ["dense", "fp16", "topk", "randk", "gaussiank", "arctopk", "star", "var",
                                  "powersgd", "adaptive"])
def test_every_message_scales_with_the_layer_as_its_tag_says(name):
    """Run a compressor on a square layer and on one 16× larger: each record grows by 16 (payloads, and PowerSGD's
    P and Q, whose rank follows the density), 4 (ARC-Top-K's sketch: per row) or 1 (counts, norms, k) — the rule
    ParamsModel.scale_record applies."""
    sizes = {}
    for side in (128, 512):  # large enough that k, ranks and row counts do not round away (see docs/run.md)
        comm = InProcessComm(4)
        from arcsim.compressors.layout import layout_of

        layout = layout_of([(side, side)])
        make_compressor(name, 0.05, seed=1).compress(torch.randn(4, side * side), comm, 0, layout)
        sizes[side] = [(r.tag, r.elements) for r in comm.log.records]
    for (tag, small), (tag2, big) in zip(sizes[128], sizes[512], strict=True):
        assert tag == tag2
        exponent = 0.0 if tag in FIXED_TAGS else 0.5 if tag in ROOT_TAGS else 1.0
        tolerance = 0.15 if name == "gaussiank" else 0.1  # a threshold's count, not an exact k
        assert big / small == pytest.approx(16**exponent, rel=tolerance), (name, tag, small, big)


def test_a_hundred_billion_parameters_price_without_full_size_tensors(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("run", "--params", "100B", "-c", "dense,topk", "--policy", "none", "--ratios", "0.01",
                "--json", str(out), env={"ARCSIM_TRACE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    dense = res["dense"]
    assert dense["bytes_per_rank"] == pytest.approx(4e11, rel=1e-6)  # every fp32 parameter, exactly
    topk = next(c for c in res["candidates"] if c["compressor"] == "topk")
    model = ParamsModel(100_000_000_000, 32)
    k_sample = math.floor(0.01 * model.sample_layer)
    assert topk["bytes_per_rank"] == pytest.approx(8 * k_sample * model.scale * 32, rel=1e-6)
    assert topk["bytes_per_rank"] == pytest.approx(8 * 0.01 * 1e11, rel=0.015)  # k's rounding in the sample
    assert dense["compute_s"] == 0
    assert any("SYNTHETIC model of 100,000,000,000" in a for a in res["assumptions"])
    assert res["trace"]["model"] == "synthetic-100B"


def test_fusion_both_reports_what_one_vector_changes(tmp_path):
    out = tmp_path / "f.json"
    r = run_cli("run", "--params", "1B", "--layers", "40", "-c", "dense,star", "--policy", "none", "--ratios",
                "0.01", "--fusion", "both", "--json", str(out), env={"ARCSIM_TRACE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = {row["compressor"]: row for row in json.loads(out.read_text())["fusion"]}
    assert rows["dense"]["buckets"] == 40
    # the same bytes in one message: never more communication, but nothing overlaps with backward
    assert rows["dense"]["model_comm_s"] <= rows["dense"]["bucket_comm_s"] * (1 + 1e-9)
    assert rows["star"]["model_comm_s"] < rows["star"]["bucket_comm_s"]
