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
from arcsim.run.layer_sample import GROUPS, ROW_1D, BucketNorms, LayerSample, groups_half_width
from arcsim.run.measurement import Measurement
from arcsim.strategy.buckets import make_buckets

LAYERS = [Layer("embed", (1000, 64), 0), Layer("bias", (300,), 64000), Layer("conv", (20, 4, 3, 3), 64300),
          Layer("empty", (0, 5), 65020), Layer("norm", (7,), 65020)]
BUCKETS = make_buckets(LAYERS, [0.0] * len(LAYERS), 60000 * 4)  # [embed], [bias, conv, empty, norm]
N = 65027


def plan() -> LayerSample:
    sample = LayerSample.plan(BUCKETS, work=4 * N * 2, threshold=5e4, seed=3)
    assert sample is not None
    return sample


def test_every_row_is_kept_with_the_same_share_of_its_columns():
    sample = plan()
    assert sample.stride == pytest.approx(4 * N * 2 / 2.5e4)
    got = torch.arange(float(N))[sample.index]
    share = {0: 1 / sample.stride, 1: 50 / BUCKETS[1].numel}  # the second bucket keeps its floor, 50 elements
    for part in sample.parts:
        for small, whole in zip(part.bucket.layers, BUCKETS[part.bucket.index].layers, strict=True):
            values = got[small.offset:small.offset + small.numel]
            if whole.numel == 0:
                assert small.numel == 0
            elif len(whole.shape) >= 2:
                rows, cols = whole.shape[0], whole.numel // whole.shape[0]
                assert small.shape[0] == rows  # every row, the same columns in each
                columns = (values.view(rows, -1) - whole.offset - torch.arange(rows)[:, None] * cols).long()
                assert (columns == columns[0]).all() and len(set(columns[0].tolist())) == small.shape[1]
                assert small.shape[1] == max(1, round(cols * share[part.bucket.index]))
            else:  # whole runs of ROW_1D elements, each starting on a multiple of ROW_1D
                starts = [int(v) - whole.offset for i, v in enumerate(values) if i == 0 or v != values[i - 1] + 1]
                assert all(s % ROW_1D == 0 for s in starts) and values.max() < whole.offset + whole.numel
                runs = np.split(values.numpy(), np.flatnonzero(np.diff(values.numpy()) != 1) + 1)
                assert all(len(r) % ROW_1D == 0 or r[-1] == whole.offset + whole.numel - 1 for r in runs)
    assert sample.parts[0].factor == pytest.approx(64 / round(64 / sample.stride))


def test_columns_gathered_from_chunks_are_the_indexed_ones():
    sample = plan()
    g = torch.randn(3, N)
    chunks = [g[:, lo:lo + 4096] for lo in range(0, N, 4096)]
    norms = BucketNorms(sample, 3)
    assert torch.equal(sample.gather(iter(chunks), 3, norms), g.index_select(1, sample.index))
    whole = torch.stack([g[:, b.lo:b.hi].norm(dim=1) for b in BUCKETS])  # what QSGD on the sample rounds by
    assert torch.allclose(norms.norms(), whole, rtol=1e-6)
    with pytest.raises(ValueError, match="chunks end"):
        sample.gather(iter(chunks[:-1]), 3)


def test_each_element_stands_for_its_own_layers_share():
    """A layer keeps at least one line, so a small one is sampled at more than the bucket's share: sums weighted
    layer by layer estimate the whole bucket's (exactly, for values constant within each layer), and the groups'
    estimates, each with the exact part, spread around it."""
    sample = plan()
    level = {la.name: float(i + 1) for i, la in enumerate(LAYERS)} | {"norm": 100.0}  # a small layer that counts
    for part in sample.parts:
        whole = sum(level[la.name] * la.numel for la in BUCKETS[part.bucket.index].layers)
        values = torch.cat([torch.full((la.numel,), level[la.name]) for la in part.bucket.layers])
        sums = part.groups.sums(values)
        assert len(sums) == GROUPS + 1 and sum(sums) == pytest.approx(whole)
        assert part.groups.total(values) == pytest.approx(whole)
        bucket_wide = part.factor * float(values.sum())  # one factor for every layer: wrong where shares differ
        if part.bucket.index == 1:
            assert abs(bucket_wide - whole) > 0.05 * whole
    noise = torch.rand(sample.parts[0].bucket.numel, dtype=torch.float64)
    sums = sample.parts[0].groups.sums(noise)
    assert sums[GROUPS] == 0.0 and sum(v > 0 for v in sums[:GROUPS]) == 3  # sampled: nothing exact; 3 columns


def test_groups_half_width_is_the_random_groups_estimator():
    e, r = np.r_[np.arange(1.0, 9.0), 5.0], np.r_[np.full(8, 10.0), 20.0]  # 8 groups, then the exact part
    ratio = e.sum() / r.sum()
    per_group = (e[8] + 8 * e[:8]) / (r[8] + 8 * r[:8])
    se = np.sqrt((1 - 0.25) * ((per_group - ratio) ** 2).sum() / (8 * 7))
    assert groups_half_width(e, r, 0.25) == pytest.approx(student_t.ppf(0.975, 7) * se)
    assert groups_half_width([[1.0] + [0.0] * 8], [[1.0] + [0.0] * 8], 0.1) is None  # one group holds anything


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
    for name in ("topk", "randk", "arctopk", "terngrad", "qsgd"):  # QSGD rounds on the whole bucket's norm
        s, e = sampled.measurement(name, 0.01), exact.measurement(name, 0.01)
        assert s.layer_sample is not None and e.layer_sample is None and s.elements == e.elements
        lo, hi = s.rel_error_interval()
        assert lo <= e.rel_error() <= hi, name
        assert s.layer_sample_half_width() is not None and (hi - lo) / 2 >= s.layer_sample_half_width() - 1e-15
        # ARC-Top-K sends a 1-D layer under one block (this CNN's biases: 10 to 64 elements) whole at any share
        assert s.bytes_per_rank() == pytest.approx(e.bytes_per_rank(), rel=0.4 if name == "arctopk" else 0.1), name
    s, e = sampled.measurement("powersgd", 0.01), exact.measurement("powersgd", 0.01)  # low rank: measured whole
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
    assert "buckets" not in shown  # PowerSGD measured whole: the shipped trace's one bucket has no sample
    assert report.sampling(exact.result) is None  # type: ignore[attr-defined]


def test_a_measurement_reads_back_from_the_cache_as_it_was_kept(runs):
    """Every field, a layer sample's parts and the records included."""
    from arcsim.run import cache

    kept = [m for a in runs.values() for m in a._measured.values()]
    assert any(m.layer_sample is not None and m.err2_parts for m in kept)
    for meas in kept:
        cache.save("f" * 32, meas)
        again = cache.load("f" * 32)
        assert again is not None and repr(again) == repr(meas)  # (nan in the times of an untimed run: not ==)


def test_expand_grows_messages_and_keeps_scalars():
    sample = plan()
    from arcsim.comm.log import record

    recs = [[[record("allgather", "values", 4, "float32", 10, 4), record("allgather", "counts", 4, "int32", 1, 4)]
             for _ in sample.parts]]
    meas = Measurement("topk", 0.01, "ef14", sample.sampled, records=recs, err2=[[1.0, 2.0]], ref2=[[2.0, 4.0]],
                       upd2=[[0.0, 0.0]], raw2=[[2.0, 4.0]], selected=[[1.0, 1.0]])
    out = sample.expand(meas)
    factors = [p.factor for p in sample.parts]
    assert out.err2 == [[1.0, 2.0]] and out.elements == N  # (error terms come weighted by layer: Groups.sums)
    assert out.selected == [factors]
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
