"""Measuring faster changes no result: measurements made side by side in forked processes equal those made one
at a time, Top-K sets shared across densities equal those searched alone, and the intra-op thread count a
measurement sets is restored (issue 40)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from arcsim.compressors.base import topk_indices
from arcsim.compressors.layout import Layer
from arcsim.compressors.nested import NestedTopK
from arcsim.run import analysis as analysis_module
from arcsim.run.analysis import MEASURED_AHEAD, Analysis
from arcsim.run.config import RunConfig
from arcsim.run.measure import (
    SMALL_WORK_ELEMENTS,
    BucketedCompression,
    GradientStats,
    intra_op_threads,
    measure,
    measuring_threads,
)
from arcsim.strategy.buckets import Bucket
from arcsim.traces.format import Trace

CONFIG = RunConfig(compressors=("dense", "topk", "randk", "arctopk", "gaussiank", "powersgd", "var"),
                   ratios=(0.001, 0.01, 0.1), policy="none")  # 8x8-ib100: compression modelled on its A100


def measurements(tmp_path, monkeypatch, processes: str) -> tuple[Analysis, dict]:
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / processes))
    monkeypatch.setenv("ARCSIM_MEASURE_PROCESSES", processes)
    a = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)
    a.run()
    return a, {k: dataclasses.asdict(m) for k, m in a._measured.items()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="side by side needs two cores")
@pytest.mark.parametrize("sampled", [False, True])
def test_side_by_side_measurements_equal_serial_ones(tmp_path, monkeypatch, sampled):
    if sampled:  # every compressor but PowerSGD on a layer sample (one intra-op thread, side by side or not)
        monkeypatch.setenv("ARCSIM_SAMPLE_ELEMENTS", "50000")
    serial, alone = measurements(tmp_path, monkeypatch, "1")
    forked, ahead = measurements(tmp_path, monkeypatch, "2")
    assert MEASURED_AHEAD not in serial.timings
    assert (forked.layer_sample() is not None) == sampled
    twins = [k for k in forked.planned_keys() if forked._twin(k) is not None]  # copies of another: not measured
    assert forked.timings[MEASURED_AHEAD] == len(forked.planned_keys()) - len(twins)  # the rest side by side
    assert ahead.keys() == alone.keys()
    for key in alone:
        for name, value in alone[key].items():
            if name != "compress_s":  # NaN where modelled (and NaN != NaN)
                assert ahead[key][name] == value, (key, name)
    again = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)  # they were cached, by the parent
    assert again.measure_ahead() == 0 and again.measuring_work()[0] == 0


def test_a_failing_measurement_is_raised_where_the_run_asks_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))
    a = Analysis(dataclasses.replace(CONFIG), announce=lambda _: None)

    def broken(self, key):
        raise RuntimeError(f"no {key[0]}")

    monkeypatch.setattr(analysis_module.Analysis, "_measure_key", broken)
    assert a.measure_ahead() == 0  # the pool's failure is no failure of the run …
    with pytest.raises(RuntimeError, match="no dense"):
        a.run()  # … whose own measurement raises it, in order


def test_intra_op_threads_are_restored():
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError), intra_op_threads(1):
        raise ValueError
    assert torch.get_num_threads() == before
    small = [Bucket(0, (), 0, SMALL_WORK_ELEMENTS // 8 - 1, 0.0)]
    assert measuring_threads(small, 8) == 1 and measuring_threads(small, 9) is None
    assert measuring_threads(small, 9, sampled=True) == 1  # a layer sample: one thread, side by side or not


def test_nested_top_k_sets_are_the_top_k_at_every_density():
    """One search of the row at the largest planned density gives the same sets as topk at every density,
    planned or between two levels, for all rows or one (a leader's), and the k-th largest |x| of a row."""
    x = torch.randn(3, 300_000) * torch.linspace(0.1, 3.0, 300_000)  # no ties; a row long enough to be sampled
    groups = [(0, 200_000), (200_000, 99_000), (299_000, 1_000)]
    sets = NestedTopK((0.001, 0.01, 0.1))
    nested = sets.bind(x)
    for density in (0.1, 0.01, 0.004, 0.001, 0.0002):
        assert nested.covers(groups, density)
        got, want = nested.indices(groups, density), topk_indices(x, groups, density)
        assert got.shape == want.shape
        for g, w in zip(got, want, strict=True):
            assert set(g.tolist()) == set(w.tolist()), density
        leader = sets.bind(x.clone()).indices(groups, density, [2])
        assert set(leader[0].tolist()) == set(want[2].tolist())
    assert not nested.covers(groups, 0.3)
    for k in (1, 77, 30_000):
        assert float(nested.kth_abs(1, k)) == float(x[1].abs().topk(k).values.min())


def test_measurements_with_shared_top_k_sets_equal_those_without():
    """A ratio-grid measurement that takes its Top-K from the shared nested sets (and the first step compressed
    as it is, error feedback copying it after) measures what one that searches on its own does."""
    torch.manual_seed(0)
    steps = [(s, torch.randn(4, 400_000)) for s in range(2)]  # float32: no ties, so the same sets exactly
    buckets = [Bucket(0, (Layer("a", (200_000,), 0), Layer("b", (50_000,), 200_000)), 0, 250_000, 0.0),
               Bucket(1, (Layer("c", (150_000,), 250_000),), 250_000, 400_000, 0.0)]
    shared = GradientStats((0.001, 0.01, 0.1))
    for compressor in ("topk", "adaptive", "star"):
        for density in (0.001, 0.1):
            alone = measure(iter(steps), buckets, compressor, density, timed=False, count=2)
            reused = measure(iter(steps), buckets, compressor, density, timed=False, count=2, stats=shared)
            assert reused.selected == alone.selected
            assert np.allclose(reused.err2, alone.err2, rtol=1e-6) and np.allclose(reused.upd2, alone.upd2, rtol=1e-6)
    assert shared._nested  # the sets were found, and used


def test_a_half_precision_bucket_is_converted_once_within_the_room():
    half, single = torch.randn(2, 1_000).half(), torch.randn(2, 1_000)
    bucket = Bucket(0, (Layer("a", (600,), 0),), 0, 600, 0.0)
    stats = GradientStats(shared_bytes=2 * 600 * 4)
    x = stats.bucket(0, bucket, half)
    assert x.dtype == torch.float32 and stats.bucket(0, bucket, half) is x  # converted once, then shared
    assert stats.bucket(1, bucket, single).data_ptr() == single.data_ptr()  # float32: a view, nothing kept
    assert stats.bucket(2, bucket, half) is not stats.bucket(2, bucket, half)  # no room left: converted each time


def test_a_streamed_trace_measured_in_one_pass_bucket_by_bucket_measures_the_same(tmp_path, monkeypatch):
    """A trace too large to keep is read once for all the measurements of as many steps, bucket by bucket
    (each bucket's shared conversion, mean and Top-K sets dropped after it; each bucket's columns read from the
    file when measured; each bucket's compressor and memory state dropped after its last step): the same numbers
    as one measurement at a time, the stateful compressors (DGC, 1-bit Adam, Signum) included."""
    config = dataclasses.replace(CONFIG, compressors=("topk", "adaptive", "star", "powersgd", "dgc", "onebit",
                                                      "signum"))
    read_on_demand = []
    real = Trace.step_on_demand
    monkeypatch.setattr(Trace, "step_on_demand", lambda self, i: read_on_demand.append(i) or real(self, i))
    released = []
    real_release = BucketedCompression.release
    monkeypatch.setattr(BucketedCompression, "release", lambda self, i: released.append(i) or real_release(self, i))
    monkeypatch.setenv("ARCSIM_MEASURE_PROCESSES", "1")
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / "kept"))
    kept = Analysis(dataclasses.replace(config), announce=lambda _: None)
    kept.run()
    monkeypatch.setattr(analysis_module, "CACHE_BYTES", 0)
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path / "streamed"))
    streamed = Analysis(dataclasses.replace(config), announce=lambda _: None)
    assert streamed.streamed()
    streamed.run()
    assert read_on_demand and streamed.trace.random_access
    assert released and set(released) == {b.index for b in streamed.ctx.buckets}  # after each bucket's last step
    assert streamed._measured.keys() == kept._measured.keys()
    for key, meas in kept._measured.items():
        other = streamed._measured[key]
        assert other.selected == meas.selected and other.records == meas.records, key
        assert np.allclose(other.err2, meas.err2, rtol=1e-6) and np.allclose(other.upd2, meas.upd2, rtol=1e-6), key
