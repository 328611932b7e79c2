"""Measurements on a sample of every layer's columns (arcsim.run.layer_sample): which elements a sample takes, the
columns gathered from a step read in chunks, the per-group sums behind the interval, and a sampled run of the
shipped trace against the exact one (forced to sample by a low threshold)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t

from arcsim.compressors.layout import Layer
from arcsim.run import report
from arcsim.run.analysis import Analysis
from arcsim.run.config import RunConfig
from arcsim.run.layer_sample import GROUPS, ROW_1D, LayerSample, groups_half_width
from arcsim.run.measure import Measurement
from arcsim.strategy.buckets import make_buckets

LAYERS = [Layer("embed", (1000, 64), 0), Layer("bias", (300,), 64000), Layer("conv", (20, 4, 3, 3), 64300),
          Layer("norm", (7,), 65020)]
BUCKETS = make_buckets(LAYERS, [0.0] * len(LAYERS), 60000 * 4)  # [embed], [bias, conv, norm]


def plan() -> LayerSample:
    sample = LayerSample.plan(BUCKETS, work=4 * 65027 * 2, threshold=5e4, seed=3)
    assert sample is not None
    return sample


def test_every_row_is_kept_with_the_same_share_of_its_columns():
    sample = plan()
    x = torch.arange(65027.0)
    got = x[sample.index]
    for part in sample.parts:
        for small, whole in zip(part.bucket.layers, BUCKETS[part.bucket.index].layers, strict=True):
            values = got[small.offset:small.offset + small.numel]
            if len(whole.shape) >= 2:
                rows, cols = whole.shape[0], whole.numel // whole.shape[0]
                assert small.shape[0] == rows  # every row, the same columns in each
                columns = (values.view(rows, -1) - whole.offset - torch.arange(rows)[:, None] * cols).long()
                assert (columns == columns[0]).all() and len(set(columns[0].tolist())) == small.shape[1]
                assert small.shape[1] == max(1, round(cols / sample.stride))
            else:  # whole runs of ROW_1D elements of the layer
                assert ((values - whole.offset) % 1 == 0).all() and values.min() >= whole.offset
                assert values.max() < whole.offset + whole.numel and small.numel <= max(ROW_1D, whole.numel)
    # the first bucket (64,000 elements) is sampled 1 in ~16; the second is small enough to keep whole (floor 50)
    assert sample.parts[0].factor == pytest.approx(64 / round(64 / sample.stride))
    assert sample.stride == pytest.approx(4 * 65027 * 2 / 2.5e4)


def test_columns_gathered_from_chunks_are_the_indexed_ones():
    sample = plan()
    g = torch.randn(3, 65027)
    chunks = [g[:, lo:lo + 4096] for lo in range(0, 65027, 4096)]
    assert torch.equal(sample.gather(iter(chunks), 3), g.index_select(1, sample.index))


def test_groups_sum_each_group_and_hold_whole_columns():
    sample = plan()
    for part in sample.parts:
        values = torch.rand(part.bucket.numel, dtype=torch.float64)
        group = np.concatenate([np.tile(g, (hi - lo) // width) for lo, hi, width, g in part.groups.pieces])
        assert len(group) == part.bucket.numel and set(group) <= set(range(GROUPS))
        assert part.groups.sums(values) == pytest.approx(np.bincount(group, values.numpy(), GROUPS).tolist())
        assert all(np.all(np.diff(g) >= 0) for _, _, _, g in part.groups.pieces)  # a group's columns together


def test_groups_half_width_is_the_random_groups_estimator():
    e, r = np.arange(1.0, 9.0), np.full(8, 10.0)
    ratio = e.sum() / r.sum()
    se = np.sqrt((1 - 0.25) * ((e / r - ratio) ** 2).sum() / (8 * 7))
    assert groups_half_width(e, r, 0.25) == pytest.approx(student_t.ppf(0.975, 7) * se)
    assert groups_half_width([[1.0] + [0.0] * 7], [[1.0] + [0.0] * 7], 0.1) is None  # one group holds anything


COMPRESSORS = ("dense", "topk", "randk", "arctopk", "qsgd", "terngrad", "powersgd")


@pytest.fixture(scope="module")
def runs() -> dict[bool, Analysis]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARCSIM_SAMPLE_ELEMENTS", "2e6")  # the shipped trace's 4.9 M: sampled 1 in 4.9
        out = {}
        for exact in (True, False):
            a = Analysis(RunConfig(compressors=COMPRESSORS, ratios=(0.01,), exact=exact), announce=lambda _: None)
            a.result = a.run()  # type: ignore[attr-defined]
            out[exact] = a
        return out


def test_a_sampled_run_estimates_the_exact_one(runs):
    exact, sampled = runs[True], runs[False]
    assert exact.layer_sample() is None and sampled.layer_sample() is not None
    for name in ("topk", "randk", "arctopk", "terngrad"):
        s, e = sampled.measurement(name, 0.01), exact.measurement(name, 0.01)
        assert s.layer_sample is not None and e.layer_sample is None and s.elements == e.elements
        lo, hi = s.rel_error_interval()
        assert lo <= e.rel_error() <= hi, name
        assert s.layer_sample_half_width() is not None and (hi - lo) / 2 >= s.layer_sample_half_width() - 1e-15
        # ARC-Top-K sends a 1-D layer under one block (this CNN's biases: 10 to 64 elements) whole at any share
        assert s.bytes_per_rank() == pytest.approx(e.bytes_per_rank(), rel=0.4 if name == "arctopk" else 0.1), name
    for name in ("powersgd", "qsgd"):  # low rank, one norm per bucket: measured whole
        s, e = sampled.measurement(name, 0.01), exact.measurement(name, 0.01)
        assert s.layer_sample is None and (s.err2, s.records) == (e.err2, e.records)
    assert sampled.measurement("dense", 1.0).rel_error() == 0.0


def test_a_sampled_run_says_so_and_is_cached_apart(runs):
    exact, sampled = runs[True], runs[False]
    key = sampled._key("topk", 0.01, False)
    assert exact._cache_name(key) != sampled._cache_name(key)
    assert any(n.startswith("SAMPLED: ") and "columns" in n for n in sampled.result.assumptions)  # type: ignore[attr-defined]
    assert not any(n.startswith("SAMPLED") for n in exact.result.assumptions)  # type: ignore[attr-defined]
    shown = report.sampling(sampled.result)  # type: ignore[attr-defined]
    assert shown is not None and 0 < shown["elements_fraction"] < 0.5 and shown["layers"]["groups"] == GROUPS
    assert report.sampling(exact.result) is None  # type: ignore[attr-defined]


def test_expand_scales_columns_and_keeps_scalars():
    sample = plan()
    from arcsim.comm.log import record

    recs = [[[record("allgather", "values", 4, "float32", 10, 4), record("allgather", "counts", 4, "int32", 1, 4)]
             for _ in sample.parts]]
    meas = Measurement("topk", 0.01, "ef14", sample.sampled, records=recs, err2=[[1.0, 2.0]], ref2=[[2.0, 4.0]],
                       upd2=[[0.0, 0.0]], raw2=[[2.0, 4.0]], selected=[[1.0, 1.0]])
    out = sample.expand(meas)
    factors = [p.factor for p in sample.parts]
    assert out.err2 == [[1.0 * factors[0], 2.0 * factors[1]]] and out.elements == 65027
    assert [r[0].elements for r in out.records[0]] == [round(10 * f) for f in factors]
    assert [r[1].elements for r in out.records[0]] == [1, 1]  # a worker's count is one number, sampled or not


def test_a_trace_too_large_to_keep_measures_the_same_sample(runs, tmp_path, monkeypatch):
    from arcsim.run import analysis

    monkeypatch.setenv("ARCSIM_SAMPLE_ELEMENTS", "2e6")
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))  # nothing read from the other runs' cache
    monkeypatch.setattr(analysis, "CACHE_BYTES", 1)  # the shipped trace read again per pass, as LLaMA-1B's is
    a = Analysis(RunConfig(compressors=COMPRESSORS, ratios=(0.01,)), announce=lambda _: None)
    assert a.streamed()
    assert a.measurement("powersgd", 0.01).layer_sample is None  # one streamed pass, of those measured whole only
    for name in ("topk", "terngrad"):
        got, want = a.measurement(name, 0.01), runs[False].measurement(name, 0.01)
        assert got.layer_sample is not None and (got.err2, got.records) == (want.err2, want.records), name
